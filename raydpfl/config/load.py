"""Strict YAML loading, dotted overrides and dumping of the config tree.

Loading is four steps: `yaml.safe_load` → apply ``a.b=value`` overrides (each value
parsed as YAML) → strict conversion into the dataclass tree (unknown keys, missing
required keys and wrong types are errors) → each dataclass validates its ranges.

PyYAML reads ``1e-5`` as the *string* "1e-5" (YAML 1.1 wants a dot: ``1.0e-5``); the
converter accepts numeric strings for float fields so configs behave as people expect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from raydpfl.config.schema import Config, ConfigError

T = TypeVar("T")

#: Largest integer a config takes (int32: counts and sizes become index arrays).
MAX_INT = 2**31 - 1
#: Top-level sections of `experiment` that overrides may name without the prefix.
_EXPERIMENT_KEYS = {f.name for f in dataclasses.fields(Config().experiment)}


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> Config:
    """Reads a YAML config, applies dotted overrides and returns the validated tree.

    Raises:
        ConfigError: Unreadable file, bad YAML, unknown key, wrong type, bad value.
    """
    p = Path(path)
    return config_from_dict(read_yaml(p), overrides)


#: Most nodes a config may expand to (aliases included): far above any real config,
#: far below what an alias bomb ("billion laughs") would expand to.
MAX_NODES = 100_000


#: The largest config (or sweep) file read: 8 MiB. Configs are a few KiB; a file past this
#: is refused by its size at once, before PyYAML spends minutes on it.
MAX_CONFIG_BYTES = 8 * 1024 * 1024


def read_yaml(path: Path) -> Any:
    """The YAML mapping in `path`, refusing in one line: an unreadable or empty file, one
    over `MAX_CONFIG_BYTES` (before parsing: no config is that large, and PyYAML takes
    over a minute on 57 MB), bytes that are not UTF-8, invalid YAML, a key given twice in
    one mapping, and an alias that refers to itself or expands past `MAX_NODES` nodes."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)  # never more, whatever the file is
    except OSError as e:
        raise ConfigError("", f"cannot read config {str(path)!r}: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            "",
            f"{path}: larger than a config file may be (more than {MAX_CONFIG_BYTES:,} bytes, "
            "8 MiB); not parsed",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            "", f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None
    try:
        raw = _parse(text)
    except ConfigError as e:
        raise ConfigError(e.field, f"{path}: {e.message}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError("", f"{path}: invalid YAML{where}") from None
    if raw is None:
        raise ConfigError("", f"{path} is empty: expected a mapping with keys experiment, runtime")
    _check_tree(raw, str(path))
    return raw


def _parse(text: str) -> Any:
    """One YAML document with `_StrictLoader` (a SafeLoader: no arbitrary objects).
    Spelled out instead of ``yaml.load(text, Loader=...)`` so that no ``yaml.load`` call,
    whose safety hangs on its Loader argument, appears in the package (a test forbids it)."""
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping (PyYAML keeps the
    last one silently, so a typo'd duplicate would win over the intended value)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` merges, as YAML intends
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise ConfigError(
                    "", f"duplicate key {key!r} at line {line} (first at line {seen[key]})"
                )
            if isinstance(key, (str, int, float, bool)):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _check_tree(raw: Any, where: str) -> None:
    """Refuses a structure that contains itself (a recursive alias) or that expands to
    more than `MAX_NODES` nodes once aliases are followed."""
    count = 0
    stack: list[tuple[Any, frozenset[int]]] = [(raw, frozenset())]
    while stack:
        node, ancestors = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ConfigError(
                "", f"{where}: expands to more than {MAX_NODES} values (an alias bomb?)"
            )
        if isinstance(node, (dict, list)):
            if id(node) in ancestors:
                raise ConfigError("", f"{where}: a YAML alias refers to itself (recursive)")
            inner = ancestors | {id(node)}
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, inner) for child in children)


def config_from_dict(raw: Any, overrides: Iterable[str] = ()) -> Config:
    """Builds the validated tree from a plain mapping plus dotted overrides."""
    if not isinstance(raw, Mapping):
        raise ConfigError("", "the config must be a mapping with keys experiment, runtime")
    if "tune" in raw:
        raise ConfigError(
            "tune", "this is a sweep file (it has a tune: section): run it with `raydpfl tune`"
        )
    data = _deep_copy(raw)
    for item in overrides:
        apply_override(data, item)
    return from_mapping(Config, data, "")


def apply_override(data: dict[str, Any], item: str) -> None:
    """Applies one ``dotted.key=value`` override in place; the value is parsed as YAML.

    Paths may omit the ``experiment.`` prefix (``privacy.epsilon=2``).
    """
    if "=" not in item:
        raise ConfigError("", f"override {item!r} must look like section.key=value")
    key, _, text = item.partition("=")
    parts = dotted_path(key)
    if not parts:
        raise ConfigError("", f"override {item!r} names no key")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        raise ConfigError(".".join(parts), f"cannot parse override value {text!r}") from None
    set_dotted(data, ".".join(parts), value)


def dotted_path(key: str) -> list[str]:
    """The parts of a dotted config key, with ``experiment.`` added where it was omitted."""
    parts = [k for k in key.strip().split(".") if k]
    if parts and parts[0] in _EXPERIMENT_KEYS:
        parts = ["experiment", *parts]
    return parts


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Sets `data[...]` at dotted `key` to `value` in place, creating sections on the way."""
    parts = dotted_path(key)
    if not parts:
        raise ConfigError("", f"{key!r} names no key")
    node = data
    for depth, k in enumerate(parts[:-1]):
        child = node.get(k)
        if child is None:
            child = node[k] = {}
        elif not isinstance(child, dict):
            raise ConfigError(".".join(parts[: depth + 1]), "is not a section")
        node = child
    node[parts[-1]] = value


def dump_config(config: Config) -> str:
    """The resolved config as YAML (loads back to an equal tree)."""
    return yaml.safe_dump(dataclasses.asdict(config), sort_keys=False)


def from_mapping(cls: type[T], data: Any, path: str) -> T:
    """Strictly converts a mapping into dataclass `cls`; errors carry the dotted path."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"must be a mapping, got {_type_name(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}.{unknown[0]}" if path else str(unknown[0])
        raise ConfigError(where, f"unknown key; allowed here: {', '.join(fields)}")
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
                path, f"must be one of {', '.join(map(str, allowed))}; got {value!r}"
            )
        return value
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, path)
    if origin is dict:  # a free-form mapping (a registered entry's options), checked later
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ConfigError(path, f"must be a mapping of names to values, got {value!r}")
        return _deep_copy(dict(value))
    if value is None:
        raise ConfigError(path, f"must be {_type_word(tp)}, got null")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, f"must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > MAX_INT:
                raise ConfigError(path, f"must be at most {MAX_INT} in size, got {value}")
            return value
        raise ConfigError(path, f"must be an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is None:
            raise ConfigError(path, f"must be a number, got {value!r}")
        if not math.isfinite(number):
            raise ConfigError(path, f"must be a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(path, f"must be a string, got {value!r}")
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a schema bug, not user input


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
