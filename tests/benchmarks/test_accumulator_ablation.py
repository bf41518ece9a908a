"""benchmarks/repro/accumulator_ablation.py: the FedFDP authors' accumulator, swapped in.

The script broke silently once (it called helpers a refactor had moved); this runs it end
to end on two rounds of the ALI-DPFL preset so a moved name or a contract change fails
here, not in a reproduction run."""

from __future__ import annotations

from pathlib import Path

import pytest

import raydpfl.algorithms.dp_fedavg as dp_fedavg
import raydpfl.papers.ali_dpfl.algorithm as ali_algorithm
from tests.benchmarks.script_module import load_script
from tests.conftest import FASHION_MNIST_DIR

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not FASHION_MNIST_DIR.exists(), reason="Debian dataset-fashion-mnist absent"
)


@pytest.fixture()
def ablation(monkeypatch):
    mod = load_script(
        "accumulator_ablation", ROOT / "benchmarks" / "repro" / "accumulator_ablation.py"
    )
    # main() swaps the library's client step in; put it back after the test
    monkeypatch.setattr(dp_fedavg, "dp_sgd_local_update", dp_fedavg.dp_sgd_local_update)
    monkeypatch.setattr(ali_algorithm, "dp_sgd_local_update", ali_algorithm.dp_sgd_local_update)
    path, algorithm = mod.SETTINGS["ali_ii_2rc"]
    monkeypatch.setitem(
        mod.SETTINGS, "ali_ii_2rc", (path, {**algorithm, "rounds": 2, "eval_every": 1})
    )
    return mod


def _final(out: str) -> float:
    line = next(x for x in out.splitlines() if x.startswith("final "))
    return float(line.split()[1])


@pytest.mark.slow
def test_the_authors_step_runs_through_the_declared_mechanism(ablation, capsys):
    """Both variants pass the ledger's receipt check (sample and noise through the task's
    mechanism), say whether the printed ε is delivered, and differ: from the second step
    on, the never-zeroed accumulator changes the update."""
    runs = {}
    for accumulator in ("keep", "zero"):
        argv = ["--setting", "ali_ii_2rc", "--accumulator", accumulator, "--no-record"]
        assert ablation.main([*argv, "--allow-dirty"]) == 0
        out = capsys.readouterr().out
        assert "after 2 rounds" in out
        assert ("is NOT delivered" in out) == (accumulator == "keep")
        assert 0.0 <= _final(out) <= 100.0
        runs[accumulator] = next(x for x in out.splitlines() if x.startswith("accuracy"))
    assert runs["keep"] != runs["zero"]
