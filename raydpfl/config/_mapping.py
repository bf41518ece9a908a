"""Strict conversion of a plain mapping into a config dataclass (`from_mapping`), shared by
the loader and by the schema's own option parsing (it imports neither)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from raydpfl.config._base import ConfigError, did_you_mean

T = TypeVar("T")

#: Largest integer a config takes (int32: counts and sizes become index arrays).
MAX_INT = 2**31 - 1
#: The largest magnitude of a float value: float32's, the dtype of models and steps. A
#: larger value (lr: 1e308) overflowed inside a client step with a traceback.
MAX_FLOAT = 3.4028234663852886e38


def from_mapping(cls: type[T], data: Any, path: str) -> T:
    """Strictly converts a mapping into dataclass `cls`; errors carry the dotted path."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"must be a mapping, got {_type_name(data)}")
    fold = getattr(cls, "_fold", None)  # a section with its own pre-pass (AlgorithmConfig)
    if fold is not None:
        data = fold(dict(data), path)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}.{unknown[0]}" if path else str(unknown[0])
        hint = did_you_mean(unknown[0], fields)
        raise ConfigError(where, f"unknown key{hint}; allowed here: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name in fields:
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], _join(path, name))
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise (e.under(path) if path else e) from None


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(path, "must not be null")
        non_none = [a for a in args if a is not type(None)]
        return _convert(non_none[0], value, path)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if isinstance(value, bool) and {"on", "off"} <= set(allowed):
            # YAML 1.1 reads unquoted on/off as booleans: take them as the words written.
            value = "on" if value else "off"
        if value not in allowed:
            raise ConfigError(
                path,
                f"must be one of {', '.join(map(str, allowed))}; got {_shown(value)}"
                + did_you_mean(value, [str(a) for a in allowed]),
            )
        return value
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, path)
    if origin is dict:  # a free-form mapping (a registered entry's options), checked later
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ConfigError(path, f"must be a mapping of names to values, got {_shown(value)}")
        return _deep_copy(dict(value))
    if value is None:
        raise ConfigError(path, f"must be {_type_word(tp)}, got null")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, f"must be true or false, got {_shown(value)}")
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > MAX_INT:
                raise ConfigError(path, f"must be at most {MAX_INT} in size, got {_shown(value)}")
            return value
        raise ConfigError(path, f"must be an integer, got {_shown(value)}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            with contextlib.suppress(OverflowError):  # an int past 1.8e308
                number = float(value)
            if number is None:
                raise ConfigError(path, f"must be a finite number, got {_shown(value)}")
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is None:
            raise ConfigError(path, f"must be a number, got {_shown(value)}")
        if not math.isfinite(number):
            raise ConfigError(path, f"must be a finite number, got {_shown(value)}")
        if abs(number) > MAX_FLOAT:
            raise ConfigError(
                path, f"must be at most {MAX_FLOAT:.4g} in size (float32), got {_shown(value)}"
            )
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(path, f"must be a string, got {_shown(value)}")
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a schema bug, not user input


def _shown(value: Any) -> str:
    """`value`'s repr, cut to 60 characters (a 4,000-digit integer is one value)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4300-digit str limit
        return "an integer of more than 4300 digits"
    return text if len(text) <= 60 else f"{text[:57]}... ({len(text)} characters)"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _type_word(tp: Any) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, str(tp)
    )


def _type_name(value: Any) -> str:
    return "a list" if isinstance(value, list) else type(value).__name__


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
