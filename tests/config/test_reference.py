"""docs/config-reference.md: generated from the schema, complete, and kept current."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from raydpfl.config._base import _check
from raydpfl.config.reference import (
    REGENERATE,
    builtin_option_sections,
    config_sections,
    field_comments,
    field_constraints,
    render_markdown,
)
from raydpfl.config.schema import Config

DOC = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"


def _first_difference(expected: str, actual: str) -> str:
    pairs = zip(expected.splitlines(), actual.splitlines(), strict=False)
    for number, (want, got) in enumerate(pairs, 1):
        if want != got:
            return f"line {number}:\n  generated: {want}\n  in file:   {got}"
    return "one of them has more lines"


def test_the_reference_file_is_the_generators_output():
    expected = render_markdown()
    actual = DOC.read_text(encoding="utf-8") if DOC.is_file() else ""

    assert actual == expected, (
        f"docs/config-reference.md is out of date with raydpfl/config/; regenerate it with\n"
        f"    {REGENERATE}\n{_first_difference(expected, actual)}"
    )


def test_every_key_has_a_description():
    missing = [k.path for s in config_sections() for k in s.keys if not k.description]

    assert missing == [], (
        "these config keys have no comment beside or above their field in raydpfl/config/ "
        f"(the reference takes its descriptions from there): {missing}"
    )


def test_every_section_has_a_docstring():
    assert [s.path for s in config_sections() if not s.doc] == []


def _leaves(node: object, prefix: str = "") -> list[str]:
    """Dotted paths of the config tree's leaves, walked on an instance (not the source)."""
    out = []
    for f in dataclasses.fields(node):
        path = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(node, f.name)
        out += _leaves(value, path) if dataclasses.is_dataclass(value) else [path]
    return out


def test_every_key_of_the_config_tree_is_listed_once():
    listed = [k.path for s in config_sections() for k in s.keys]

    assert sorted(listed) == sorted(_leaves(Config()))
    assert len(listed) == len(set(listed))
    text = render_markdown()
    for key in _leaves(Config()):
        assert f"| `{key}` |" in text, key


def test_keys_the_old_readme_table_missed_are_documented():
    keys = {k.path: k for s in config_sections() + builtin_option_sections() for k in s.keys}

    d_pca = keys["experiment.algorithm.rc_dpfl.d_pca"]
    assert (d_pca.type, d_pca.default, d_pca.allowed) == ("int", 2, ">= 1")
    assert "principal components" in d_pca.description
    local_mode = keys["experiment.algorithm.fedfdp.local_mode"]
    assert local_mode.allowed == "`epoch`, `steps`"
    assert local_mode.description.startswith("Non-private local work")
    split_mode = keys["experiment.data.cluster_shift.split_mode"]
    assert split_mode.default == "seed_pool_80_20"
    assert "official_train_test" in split_mode.description


# ---- how descriptions and allowed values are read off the source -------------------------------
@dataclass(frozen=True, kw_only=True)
class Example:
    """An example section."""

    # Above the field,
    # over two lines.
    above: int = 1
    beside: float = 0.5  # beside the field
    # Both: above ...
    both: str = "x"  # ... and beside.
    # A blank line parts this comment from the next field.

    no_comment: bool = False
    choice: Literal["a", "b"] | None = "a"  # a choice

    def __post_init__(self) -> None:
        _check(self.above >= 1, "above", f"must be >= 1, got {self.above}")
        _check(0 < self.beside < 1, "beside", "must be in (0, 1)")
        _check(self.both != "", "both", f"must differ from {self.beside}, got {self.both}")


def test_descriptions_are_the_comments_beside_or_right_above_a_field():
    comments = field_comments(Example)

    assert comments == {
        "above": "Above the field, over two lines.",
        "beside": "beside the field",
        "both": "Both: above ... ... and beside.",
        "choice": "a choice",
    }


def test_ranges_come_from_the_must_be_messages_of_post_init():
    assert field_constraints(Example) == {"above": [">= 1"], "beside": ["in (0, 1)"]}


def test_literal_choices_and_null_are_the_allowed_values():
    (section,) = config_sections(Example, "example")
    keys = {k.path: k for k in section.keys}

    assert section.doc == "An example section."
    assert keys["example.choice"].type == "str or null"
    assert keys["example.choice"].allowed == "`a`, `b`, `null`"
    assert keys["example.beside"].allowed == "in (0, 1)"
    assert keys["example.no_comment"].description == ""
