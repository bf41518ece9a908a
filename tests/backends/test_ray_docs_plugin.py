"""A newcomer's private plug-in, written from the docs alone (docs/how-to/
write-an-algorithm.md, "A private plug-in"), run with ``raydpfl run --plugin FILE`` from
another folder on both backends: the same model and ledger hashes, and the ε of both of
its mechanisms."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _docs_plugin() -> str:
    page = (ROOT / "docs" / "how-to" / "write-an-algorithm.md").read_text()
    section = page[page.index("## A private plug-in") :]
    start = section.index("```python") + len("```python")
    return section[start : section.index("```\n", start)]


def test_the_docs_private_plugin_gives_the_same_run_on_ray_and_local(tmp_path):
    plugin = tmp_path / "elsewhere" / "loss_report_plugin.py"
    plugin.parent.mkdir()
    plugin.write_text(_docs_plugin())
    summaries = {}
    for backend in ("local", "ray"):
        out = tmp_path / backend
        cmd = [sys.executable, "-m", "raydpfl", "run", str(ROOT / "configs/quickstart.yaml")]
        cmd += ["--plugin", str(plugin), "--out", str(out), "--no-progress"]
        for override in (
            "experiment.algorithm.name=dp_fedavg_loss_report",
            "experiment.algorithm.rounds=2",
            f"runtime.backend={backend}",
        ):
            cmd += ["--set", override]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        (summary_path,) = out.rglob("summary.json")
        summaries[backend] = json.loads(summary_path.read_text())
    local, ray = summaries["local"], summaries["ray"]
    assert ray["model_sha256"] == local["model_sha256"]
    assert ray["ledger_sha256"] == local["ledger_sha256"]
    # every task is charged its τ DP-SGD steps and its one loss query (same σ and q)
    import raydpfl

    tau = raydpfl.load_config(
        str(ROOT / "configs/quickstart.yaml")
    ).experiment.algorithm.local_steps
    (event,) = local["privacy"]["charged"]
    tasks = event["charges"] // 2  # each task: one charge for its steps, one for its query
    assert tasks > 0 and event["charges"] == 2 * tasks
    assert event["steps"] == tasks * (tau + 1)
