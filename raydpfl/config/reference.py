"""The config reference, generated from the schema: every key, its type, default, allowed
values and description.

    python -m raydpfl.config.reference > docs/config-reference.md

A hand-written reference drifts from the schema (the README's missed some 20 keys), so
this one is read off the dataclasses themselves: keys and defaults from `dataclasses`,
types and `Literal` choices from the type hints, ranges from the `_check(..., "must be
...")` calls in `__post_init__`, and each description from the comment beside or above
the field in the source. The schema stays plain dataclasses with comments; nothing is
declared twice. `tests/config/test_reference.py` fails when the file is stale or a key
has no comment.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import itertools
import sys
import tokenize
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from raydpfl.config import schema

__all__ = ["REGENERATE", "ConfigKey", "Section", "config_sections", "render_markdown"]

#: The command that rewrites docs/config-reference.md.
REGENERATE = "python -m raydpfl.config.reference > docs/config-reference.md"

#: Keys checked against a catalogue rather than a Literal: built-in names, plus any name
#: registered through `raydpfl.register_*` or an entry point.
NAME_CATALOGUES: dict[str, str] = {
    "experiment.data.dataset": "dataset",
    "experiment.model.name": "model",
    "experiment.algorithm.name": "algorithm",
}


@dataclass(frozen=True)
class ConfigKey:
    """One settable key (a leaf of the config tree)."""

    path: str  # dotted, as YAML nests it and `--set` takes it
    type: str
    default: Any
    allowed: str  # "" when any value of the type is taken
    description: str  # "" when the field has no comment (the test refuses that)


@dataclass(frozen=True)
class Section:
    """One dataclass of the tree: its dotted path, docstring and own keys."""

    path: str
    doc: str
    keys: tuple[ConfigKey, ...]


# ---- walking the tree ------------------------------------------------------------------------
def config_sections(root: type = schema.Config, prefix: str = "") -> list[Section]:
    """Every section below `root`, depth first in field order (as a YAML file lists them)."""
    hints = typing.get_type_hints(root, include_extras=True)
    comments = field_comments(root)
    constraints = field_constraints(root)
    keys, below = [], []
    for f in dataclasses.fields(root):
        path = f"{prefix}.{f.name}" if prefix else f.name
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            below.extend(config_sections(hint, path))
            continue
        keys.append(
            ConfigKey(
                path=path,
                type=_type_name(hint),
                default=_default(f),
                allowed=_allowed(path, hint, constraints.get(f.name, [])),
                description=comments.get(f.name, ""),
            )
        )
    own = [Section(prefix or "(top level)", _first_paragraph(root), tuple(keys))] if keys else []
    return own + below


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _first_paragraph(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


# ---- types and allowed values ----------------------------------------------------------------
def _non_null(hint: Any) -> tuple[list[Any], bool]:
    """(the members of a union other than None, whether None is one of them)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        return [a for a in args if a is not type(None)], type(None) in args
    return [hint], False


def _type_name(hint: Any) -> str:
    """`int`, `float or null`, `str` (a Literal's values are listed as allowed), `mapping`."""
    members, nullable = _non_null(hint)
    names = []
    for member in members:
        origin = typing.get_origin(member)
        if origin is Literal:
            names.append(type(typing.get_args(member)[0]).__name__)
        elif origin is dict or member is dict:
            names.append("mapping")
        else:
            names.append(getattr(member, "__name__", str(member)))
    return " or ".join(names + (["null"] if nullable else []))


def _allowed(path: str, hint: Any, ranges: list[str]) -> str:
    """A Literal's values, a name catalogue, or the ranges `__post_init__` enforces."""
    members, nullable = _non_null(hint)
    choices = [v for m in members if typing.get_origin(m) is Literal for v in typing.get_args(m)]
    if choices:
        return ", ".join(_code(v) for v in [*choices, *([None] if nullable else [])])
    if path in NAME_CATALOGUES:
        kind = NAME_CATALOGUES[path]
        names = schema.shipped_names(kind)  # type: ignore[arg-type]
        return f"built in: {', '.join(_code(n) for n in names)}; or a registered {kind}"
    rule = "; ".join(ranges)
    return f"null or {rule}" if rule and nullable and "null" not in rule else rule


def field_constraints(cls: type) -> dict[str, list[str]]:
    """field → the ranges its `__post_init__` checks, as `_check(cond, "field", "must be
    > 0, got ...")` words them ("> 0"). Messages that interpolate other values before
    ", got", or that do not start with "must be", are left to the description."""
    out: dict[str, list[str]] = {}
    method = _class_node(cls)
    for node in ast.walk(method):
        if not (isinstance(node, ast.Call) and _called_name(node) == "_check"):
            continue
        if len(node.args) < 3 or not isinstance(node.args[1], ast.Constant):
            continue
        rule = _must_be(node.args[2])
        if rule and rule not in out.get(node.args[1].value, []):
            out.setdefault(node.args[1].value, []).append(rule)
    return out


def _called_name(call: ast.Call) -> str:
    return call.func.id if isinstance(call.func, ast.Name) else ""


def _must_be(message: ast.expr) -> str:
    """'must be in (0, 1), got {x}' → 'in (0, 1)'; '' when not a plain range."""
    if isinstance(message, ast.Constant) and isinstance(message.value, str):
        text, whole = message.value, True
    elif isinstance(message, ast.JoinedStr):
        head = list(itertools.takewhile(lambda p: isinstance(p, ast.Constant), message.values))
        text, whole = "".join(p.value for p in head), len(head) == len(message.values)
    else:
        return ""
    if not whole and ", got" not in text:
        return ""  # a value is interpolated into the rule itself
    text = text.split(", got", 1)[0].strip()
    return text.removeprefix("must be ").strip() if text.startswith("must be ") else ""


# ---- comments from the source ----------------------------------------------------------------
@functools.cache
def _module_source(module_name: str) -> tuple[ast.Module, dict[int, str], frozenset[int]]:
    """(syntax tree, line → comment text, lines holding only a comment) of a module."""
    source = inspect.getsource(sys.modules[module_name])
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    alone = frozenset(line for line in comments if line not in code_lines)
    return ast.parse(source), comments, alone


def _class_node(cls: type) -> ast.ClassDef:
    tree, _, _ = _module_source(cls.__module__)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return node
    raise LookupError(f"class {cls.__qualname__} not found in {cls.__module__}")


def field_comments(cls: type) -> dict[str, str]:
    """field → its description: the comment lines right above the field (no blank line
    between) and the comment beside it, joined into one line."""
    _, comments, alone = _module_source(cls.__module__)
    out = {}
    for node in _class_node(cls).body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above = []
        line = node.lineno - 1
        while line in alone:
            above.insert(0, comments[line])
            line -= 1
        beside = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        text = " ".join([*above, *[c for c in beside if c not in above]])
        if text:
            out[node.target.id] = " ".join(text.split())
    return out


# ---- Markdown --------------------------------------------------------------------------------
def _code(value: Any) -> str:
    """A value as YAML spells it, in backticks."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, dict):
        text = "{}" if not value else repr(value)
    else:
        text = str(value)
    return f"`{text}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "–"


def _anchor(path: str) -> str:
    return "".join(c for c in path.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def builtin_option_sections() -> list[Section]:
    """The options blocks of raydpfl's own registered algorithms (e.g. `dp_fedavg_client`)
    and datasets (e.g. `cifar100`), read off their options dataclasses like the schema:
    `experiment.algorithm.options` / `experiment.data.options` when that entry is chosen."""
    from raydpfl import registry
    from raydpfl.config import client_level  # noqa: F401  (registers dp_fedavg_client)

    out = _paper_sections()
    for kind, prefix, selector in (
        ("algorithm", "experiment.algorithm.options", "experiment.algorithm.name"),
        ("model", "experiment.model.options", "experiment.model.name"),
        ("dataset", "experiment.data.options", "experiment.data.dataset"),
    ):
        for name in registry.names(kind):  # type: ignore[arg-type]
            options = registry.get(kind, name).options  # type: ignore[arg-type]
            entry = registry.get(kind, name)  # type: ignore[arg-type]
            if options is None or not options.__module__.startswith("raydpfl."):
                continue  # none, or a third party's
            if entry.section is not None:
                continue  # a seed paper's: `_paper_sections`
            for section in config_sections(options, prefix):
                out.append(
                    Section(
                        f"{section.path} ({selector.rsplit('.', 1)[1]}: {name})",
                        f"Read only when `{selector}` is `{name}`. " + section.doc,
                        section.keys,
                    )
                )
    return out


def _paper_sections() -> list[Section]:
    """The seed papers' option sections (`experiment.algorithm.<section>`, the spelling
    their presets use), one per section with the algorithms that read it."""
    from raydpfl import registry

    readers: dict[str, list[str]] = {}
    classes: dict[str, type] = {}
    for entry in registry.entries("algorithm"):
        if entry.section is not None and entry.options is not None:
            readers.setdefault(entry.section, []).append(entry.name)
            classes[entry.section] = entry.options
    out = []
    for key, names in readers.items():
        listed = ", ".join(f"`{n}`" for n in names)
        for section in config_sections(classes[key], f"experiment.algorithm.{key}"):
            out.append(
                Section(
                    section.path,
                    f"Read only when `experiment.algorithm.name` is one of {listed}; the "
                    "same keys may be written under `experiment.algorithm.options`. "
                    + section.doc,
                    section.keys,
                )
            )
    return out


def render_markdown() -> str:
    """docs/config-reference.md: an index of the sections, then one table per section."""
    sections = config_sections() + builtin_option_sections()
    total = sum(len(s.keys) for s in sections)
    lines = [
        "# Config reference",
        "",
        f"<!-- Generated from raydpfl/config/ by `{REGENERATE}`; do not edit by hand. -->",
        "",
        f"Every key of a raydpfl config ({total} keys), by dotted path: nest it in YAML "
        "(`experiment: {privacy: {epsilon: 2}}`) or give it to `--set` "
        "(`--set experiment.privacy.epsilon=2`). Every key is optional; the default is "
        "shown. A config has two sections: `experiment` (what is simulated) and `runtime` "
        "(how it is run; changing it never changes the results). `null` is YAML's None; "
        "`1e-5` and `1.0e-5` both load as numbers. Sweeps add a `tune:` section "
        "([Sweeps with Ray Tune](how-to/sweeps.md)).",
        "",
        "Each seed paper's options have a section of their own under "
        "`experiment.algorithm` (or go under `experiment.algorithm.options`) and are read "
        "only by that paper's algorithms.",
        "",
    ]
    lines += [f"- [`{s.path}`](#{_anchor(s.path)}) ({len(s.keys)})" for s in sections]
    for section in sections:
        lines += ["", f"## {section.path}", ""]
        if section.doc:
            lines += [section.doc, ""]
        lines += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        for key in section.keys:
            cells = [
                f"`{key.path}`",
                key.type,
                _code(key.default),
                _cell(key.allowed),
                _cell(key.description),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Writes the reference to stdout (UTF-8, whatever the locale: it has Greek letters)."""
    sys.stdout.buffer.write(render_markdown().encode("utf-8"))


if __name__ == "__main__":
    main()
