"""Figures in the README that a test can check are checked here; counts that no test can
keep true (how many tests there are) are not written at all (issue 35, item 12)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raydpfl.models import build_model, num_parameters

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_the_readme_writes_no_test_count():
    counts = re.findall(r"\b\d[\d,]*\s+tests\b", README)
    assert counts == [], f"test counts drift with every commit; do not write them: {counts}"


def _number(pattern: str) -> float:
    found = re.search(pattern, README)
    assert found is not None, f"the README no longer says {pattern!r}: update this test"
    return float(found.group(1).replace(",", ""))


@pytest.mark.parametrize(
    ("pattern", "name", "shape", "scale"),
    [
        (r"`fedavg_cnn` \(([\d,]+) params on 28×28\)", "fedavg_cnn", (1, 28, 28), 1),
        (r"rc_cnn\}\s+# ([\d,]+) parameters", "rc_cnn", (1, 28, 28), 1),  # fashion_mnist
        (r"\(2 groups;\s+([\d.]+)M parameters at 10 classes", "rc_resnet18", (3, 32, 32), 1e6),
    ],
)
def test_the_parameter_counts_the_readme_gives_are_the_models(pattern, name, shape, scale):
    written = _number(pattern)
    actual = num_parameters(build_model(name, shape, 10))
    assert round(actual / scale, 1 if scale > 1 else 0) == written
