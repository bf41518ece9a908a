"""Strict YAML loading, dotted overrides and dumping of the config tree.

Loading is four steps: `yaml.safe_load` → apply ``a.b=value`` overrides (each value
parsed as YAML) → strict conversion into the dataclass tree (unknown keys, missing
required keys and wrong types are errors) → each dataclass validates its ranges.

PyYAML reads ``1e-5`` as the *string* "1e-5" (YAML 1.1 wants a dot: ``1.0e-5``); the
converter accepts numeric strings for float fields so configs behave as people expect.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from raydpfl.config._mapping import _deep_copy, from_mapping
from raydpfl.config.schema import Config, ConfigError

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


#: Deepest nesting of mappings and lists a config may have. Real configs nest 4 deep;
#: PyYAML's parser recurses per level and fails with a RecursionError near 900.
MAX_DEPTH = 64


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
    except (RecursionError, ValueError, OverflowError) as e:
        raise ConfigError("", f"{path}: {_unparsable(e)}") from None
    if raw is None:
        raise ConfigError("", f"{path} is empty: expected a mapping with keys experiment, runtime")
    _check_tree(raw, str(path))
    return raw


def _unparsable(e: BaseException) -> str:
    """Why PyYAML gave up on a text that is valid YAML, in words."""
    if isinstance(e, RecursionError):
        return f"nested too deeply to read (a config nests at most {MAX_DEPTH} levels)"
    if "integer string conversion" in str(e):  # Python's 4300-digit limit on int("...")
        return "holds an integer with more than 4300 digits"
    return f"a value cannot be read ({type(e).__name__})"


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
            if len(ancestors) >= MAX_DEPTH:
                raise ConfigError(
                    "", f"{where}: nested more than {MAX_DEPTH} levels deep (a config nests 4)"
                )
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


def override_list(overrides: Iterable[str]) -> list[str]:
    """`overrides` as a list, refusing one bare string (it would be read letter by letter)."""
    if isinstance(overrides, str):
        raise ConfigError("overrides", "must be a list of 'key=value' strings, not one string")
    return list(overrides)


def config_from_any(config: Any, overrides: list[str]) -> Config:
    """The validated tree from a `Config`, a plain mapping, a YAML path or None (all
    defaults), with dotted overrides applied. A `Config` always goes through its dump,
    so the result is a new tree even without overrides."""
    if config is None or isinstance(config, Mapping):
        return config_from_dict(dict(config or {}), overrides)
    if isinstance(config, Config):
        return config_from_dict(yaml.safe_load(dump_config(config)), overrides)
    if isinstance(config, (str, Path)):
        return load_config(config, overrides)
    raise ConfigError(
        "config",
        "must be a raydpfl.config.Config, a mapping, a path to a YAML file or None, "
        f"got {type(config).__name__}",
    )


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
    shown = text if len(text) <= 80 else text[:77] + "..."
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        raise ConfigError(".".join(parts), f"cannot parse override value {shown!r}") from None
    except (RecursionError, ValueError, OverflowError) as e:
        raise ConfigError(".".join(parts), f"override value {shown!r}: {_unparsable(e)}") from None
    _check_tree(value, f"--set {'.'.join(parts)}")
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
