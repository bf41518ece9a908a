"""examples/tour.py, the notebook-style walkthrough, runs as a script and leaves its run
directory and figure (CI runs it with two rounds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_tour_runs_and_writes_its_figure(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "tour.py"),
            "--rounds",
            "2",
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
    assert summary["rounds_completed"] == 2
    assert summary["epsilon_max"] <= 4.0
    assert "40 clients" in out.stdout and "figure:" in out.stdout
