"""Fuzzing the config loader and the CLI: whatever the input, the command ends in exit 0,
or in exit 2 with one line on stderr; never a traceback, never another status.

Three generators (hypothesis, derandomised so CI sees the same examples every run):
- a valid config with one to three leaves replaced (odd types, extremes: 1e308, inf,
  nan, huge integers, deep lists, long strings), keys added or removed;
- YAML-ish text: random bytes and lines, deep brackets, long digit strings;
- calculator command lines (`raydpfl privacy epsilon|noise|steps`) with odd numbers.
`validate --no-data` runs the loader and the whole pre-flight check without data.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from raydpfl.cli.main import main
from tests.cli.test_resume_outputs import RAW

FUZZ = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

ODD_NUMBERS = [0, -1, 1, 2**31, -(2**63), 10**400, 1e308, -1e308, 1e-320, 3.5e38, 0.5]
ODD_TEXT = ["", " ", "1e308", "inf", "-inf", "nan", ".nan", "1e-5", "null", "~", "yes", "0x1F"]


def _leaves(node: Any, prefix: tuple = ()) -> list[tuple]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, (*prefix, k))] + [prefix]
    return [prefix]


VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(ODD_NUMBERS),
        st.sampled_from(ODD_TEXT),
        st.text(max_size=30),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _run(argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own usage errors
            code = e.code if isinstance(e.code, int) else 1
    return code, err.getvalue().strip().splitlines()


def _assert_zero_or_one_line(code: int, err: list[str], what: str) -> None:
    assert code in (0, 2), (what, code, err[-8:])
    if code == 2:
        assert len(err) == 1, (what, err[:8])
        assert "Traceback" not in err[0] and err[0].startswith("raydpfl"), (what, err)


def _validate_text(text: str | bytes, what: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
        code, err = _run(["validate", str(path), "--no-data"])
    _assert_zero_or_one_line(code, err, what)


def _dump(raw: Any) -> str:
    try:
        return yaml.safe_dump(raw, allow_unicode=True)
    except ValueError:  # an int past Python's 4300-digit str limit: write its digits
        return json.dumps(raw, default=str)


BASE = json.loads(json.dumps(RAW))
BASE["experiment"]["algorithm"]["rounds"] = 2
PATHS = [p for p in _leaves(BASE) if p]
EDITS = st.lists(
    st.tuples(
        st.sampled_from(PATHS),
        st.sampled_from(["replace", "replace", "replace", "delete", "add"]),
        st.one_of(st.sampled_from(ODD_NUMBERS), VALUES),
        st.text(min_size=1, max_size=12),
    ),
    min_size=1,
    max_size=3,
)


def _edited(edits: list[tuple]) -> Any:
    raw = json.loads(json.dumps(BASE))
    for path, action, value, new_key in edits:
        node = raw
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue  # an earlier edit replaced the section
        if action == "delete":
            node.pop(path[-1], None)
        elif action == "add":
            node[new_key] = value
        else:
            node[path[-1]] = value
    return raw


@FUZZ
@given(edits=EDITS)
# The inputs that ended in a traceback before (issue 53), always among the examples.
@example(edits=[(("experiment", "algorithm", "lr"), "replace", 1e308, "x")])
@example(edits=[(("experiment", "algorithm", "lr"), "replace", 10**400, "x")])
@example(edits=[(("runtime", "seed"), "replace", 10**4000, "x")])
@example(edits=[(("experiment", "privacy", "noise_multiplier"), "replace", 1e308, "x")])
def test_a_valid_config_with_leaves_replaced_is_accepted_or_refused_in_one_line(edits):
    raw = _edited(edits)
    _validate_text(_dump(raw), f"config {edits!r:.300}")


YAML_PIECES = st.sampled_from(
    [
        "experiment:",
        "  algorithm: {rounds: ",
        "runtime: {seed: ",
        "[" * 300,
        "]" * 300,
        "{" * 120,
        "9" * 5000,
        "1e308",
        "&a [*a]",
        "*a",
        "<<: *x",
        "!!python/object:os.system",
        "- - - -",
        ": :",
        "\t",
        "'",
        '"\\x',
        "\x00",
        "\ufeff",
    ]
)


@FUZZ
@given(
    pieces=st.lists(st.one_of(YAML_PIECES, st.text(max_size=20)), max_size=12),
    raw_bytes=st.binary(max_size=64),
)
@example(pieces=["experiment: " + "[" * 900 + "]" * 900], raw_bytes=b"")
@example(pieces=["runtime: {seed: " + "9" * 5000 + "}"], raw_bytes=b"\xff")
def test_yamlish_text_and_bytes_are_accepted_or_refused_in_one_line(pieces, raw_bytes):
    _validate_text("\n".join(pieces), f"text {pieces!r:.300}")
    _validate_text(raw_bytes, f"bytes {raw_bytes!r}")


NUMBER_TEXT = st.one_of(
    st.sampled_from(["1e308", "-1", "0", "nan", "inf", "1e-320", "abc", "", "9" * 400]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**12), 10**12).map(str),
)


@FUZZ
@given(
    command=st.sampled_from(["epsilon", "noise", "steps"]),
    options=st.lists(
        st.tuples(
            st.sampled_from(["--sigma", "--q", "--steps", "--delta", "--epsilon", "--accountant"]),
            NUMBER_TEXT,
        ),
        max_size=5,
    ),
)
@example(command="epsilon", options=[("--sigma", "1e308"), ("--q", "0.01"), ("--steps", "100")])
def test_calculator_command_lines_end_in_0_or_one_line(command, options):
    argv = ["privacy", command]
    for flag, value in options:
        argv += [flag, value]
    if command != "steps":  # the calibration searches over steps: keep them small
        argv = [a if not a.isdigit() or len(a) < 7 else "1000" for a in argv]
    code, err = _run(argv)
    _assert_zero_or_one_line(code, err, " ".join(argv)[:300])
