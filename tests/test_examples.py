"""examples/tour.py, the notebook-style walkthrough: it runs as a script on data that ships
(digits), learns, and leaves its run directory and figure; without Fashion-MNIST its
default says what it needs instead of switching data silently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_tour_runs_on_digits_learns_and_writes_its_figure(tmp_path):
    # Digits ship with scikit-learn, so this runs on every install; the tour's settings
    # for them learn (0.889 at 20 rounds, seed 0), so 10 rounds clear 0.7.
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "tour.py"),
            "--dataset",
            "digits",
            "--rounds",
            "10",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "tour.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds_completed"] == 10
    assert summary["epsilon_max"] <= 4.0
    assert summary["final_test_accuracy"] > 0.7
    assert "10 clients" in out.stdout and "figure:" in out.stdout


def test_the_tour_says_what_data_it_needs_when_fashion_mnist_is_missing(tmp_path):
    # An empty data root and no Debian copy: one line naming the dataset and the fix,
    # not a silent switch to other data.
    code = (
        "import runpy, sys\n"
        "import raydpfl.data.datasets as d\n"
        "d._SYSTEM_DIRS.pop('fashion_mnist', None)\n"
        f"sys.argv = ['tour.py', '--out', {str(tmp_path)!r}]\n"
        f"runpy.run_path({str(ROOT / 'examples' / 'tour.py')!r}, run_name='__main__')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAYDPFL_DATA": str(tmp_path / "none")},
    )
    assert out.returncode != 0
    assert "fashion_mnist: files not found" in out.stderr
    assert "--dataset digits" in out.stderr and not (tmp_path / "run").exists()
