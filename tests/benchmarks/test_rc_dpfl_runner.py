"""benchmarks/repro/rc_dpfl.py: a run under --run-dir checkpoints, and the same command
resumes it after an interruption to the same result (the E = 200 cell takes hours on
two cores, longer than one session)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
rc_runner = load_script("rc_dpfl", ROOT / "benchmarks" / "repro" / "rc_dpfl.py")

pytestmark = pytest.mark.slow  # two short RC-DPFL runs on real Fashion-MNIST (~30 s)

FMNIST = Path("/usr/share/datasets/fashion-mnist")
ARGS = [
    "--epsilons", "5", "--methods", "rc_dpfl", "--rounds", "3", "--samples-per-client", "60",
    "--test-samples-per-client", "20", "--no-record", "--allow-dirty",
]  # fmt: skip


class _Interrupt(Exception):
    pass


@pytest.mark.skipif(not FMNIST.is_dir(), reason="needs Debian's dataset-fashion-mnist")
def test_interrupted_run_resumes_to_the_same_result(tmp_path, monkeypatch):
    straight = tmp_path / "straight.json"
    assert rc_runner.main([*ARGS, "--out", str(straight), "--run-dir", str(tmp_path / "a")]) == 0

    # Interrupt the second run after its second round (checkpoints every round), as a
    # killed session would, then run the same command again.
    monkeypatch.setattr(rc_runner, "_reduce", _with_checkpoints(rc_runner._reduce))
    progress = rc_runner._progress

    def stop_after_round_2(method, eps):
        report = progress(method, eps)

        def on_round(row):
            report(row)
            if row["round"] == 2:
                raise _Interrupt

        return on_round

    monkeypatch.setattr(rc_runner, "_progress", stop_after_round_2)
    resumed = tmp_path / "resumed.json"
    cmd = [*ARGS, "--out", str(resumed), "--run-dir", str(tmp_path / "b")]
    with pytest.raises(_Interrupt):
        rc_runner.main(cmd)
    monkeypatch.setattr(rc_runner, "_progress", progress)
    assert rc_runner.main(cmd) == 0

    first, second = json.loads(straight.read_text())[-1], json.loads(resumed.read_text())[-1]
    assert second["resumed_from_round"] == 2
    for key in ("all", "majority", "minority", "clustering_accuracy", "epsilon_max"):
        assert second[key] == first[key], key
    run = "fmnist_rotation_rc_dpfl_eps5_seed0"
    a = json.loads((tmp_path / "a" / run / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / run / "summary.json").read_text())
    assert a["model_sha256"] == b["model_sha256"]
    assert a["ledger_sha256"] == b["ledger_sha256"]

    with pytest.raises(SystemExit, match="finished run"):
        rc_runner.main(cmd)


def _with_checkpoints(reduce):
    def wrapped(cfg, args, seed):
        out = reduce(cfg, args, seed)
        out.setdefault("runtime", {})["checkpoint_every"] = 1
        return out

    return wrapped
