"""Figures in the README and the docs that a test can check are checked here; counts that
no test can keep true (how many tests there are) are not written at all (issue 35, item
12). The model table lives in docs/reference/algorithms.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raydpfl.models import build_model, num_parameters

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MODELS_PAGE = (ROOT / "docs" / "reference" / "algorithms.md").read_text(encoding="utf-8")
RC_PAGE = (ROOT / "docs" / "how-to" / "paper-rc-dpfl.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_writes_a_test_count(page):
    counts = re.findall(r"\b\d[\d,]*\s+tests\b", page.read_text(encoding="utf-8"))
    assert counts == [], f"test counts drift with every commit; do not write them: {counts}"


def _number(text: str, pattern: str) -> float:
    found = re.search(pattern, text)
    assert found is not None, f"the docs no longer say {pattern!r}: update this test"
    return float(found.group(1).replace(",", ""))


@pytest.mark.parametrize(
    ("text", "pattern", "name", "shape", "classes", "scale"),
    [
        (
            MODELS_PAGE,
            r"`fedavg_cnn` \(([\d,]+) params on 28×28\)",
            "fedavg_cnn",
            (1, 28, 28),
            10,
            1,
        ),
        (MODELS_PAGE, r"\| ([\d,]+) on Synthetic's 60 features", "logreg", (60,), 10, 1),
        (MODELS_PAGE, r"\| ([\d,]+) on 28×28 \|", "mlp", (1, 28, 28), 10, 1),
        (
            MODELS_PAGE,
            r"\| ([\d,]+) at the defaults on Shakespeare",
            "char_transformer",
            (80,),
            80,
            1,
        ),
        (MODELS_PAGE, r"\| ([\d,]+) on 28×28 \|\n\| `rc_resnet18`", "rc_cnn", (1, 28, 28), 10, 1),
        (
            MODELS_PAGE,
            r"\(2 groups;\s+([\d.]+)M parameters at 10 classes",
            "rc_resnet18",
            (3, 32, 32),
            10,
            1e6,
        ),
        (
            MODELS_PAGE,
            r"\| ([\d,]+); [\d,]+; [\d,]+ \(62 classes\)",
            "bcs_mnist_cnn",
            (1, 28, 28),
            10,
            1,
        ),
        (
            MODELS_PAGE,
            r"\| [\d,]+; ([\d,]+); [\d,]+ \(62 classes\)",
            "bcs_lenet5",
            (1, 28, 28),
            10,
            1,
        ),
        (MODELS_PAGE, r"; ([\d,]+) \(62 classes\)", "bcs_femnist_cnn", (1, 28, 28), 62, 1),
        (
            MODELS_PAGE,
            r"\(62 classes\); ([\d,]+) \(GroupNorm\)",
            "bcs_resnet20",
            (3, 32, 32),
            10,
            1,
        ),
        (MODELS_PAGE, r"\| ([\d,]+) for `bcs_linreg`", "bcs_linreg", (10,), 1, 1),
        (RC_PAGE, r"rc_cnn\}\s+# ([\d,]+) parameters", "rc_cnn", (1, 28, 28), 10, 1),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None,
)
def test_the_parameter_counts_the_docs_give_are_the_models(
    text, pattern, name, shape, classes, scale
):
    written = _number(text, pattern)
    actual = num_parameters(build_model(name, shape, classes))
    assert round(actual / scale, 1 if scale > 1 else 0) == written
