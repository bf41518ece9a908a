"""`raydpfl tune --plugin FILE` from another folder, on Ray workers inside Tune trials; a
resume that never loads the pickles planted in the sweep directory; a sweep whose every
trial fails exits 1, saying how many and where the first error is. Real Ray, real Tune."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

PLUGIN = '''
import raydpfl
from raydpfl.algorithms import DPFedAvg


@raydpfl.register_algorithm("elsewhere_dpfedavg")
class ElsewhereDPFedAvg(DPFedAvg):
    """DP-FedAvg defined in a file outside the working directory."""


@raydpfl.register_algorithm("always_fails")
class AlwaysFails(DPFedAvg):
    def local_update(self, ctx, params, data, task):
        raise RuntimeError("boom from the plug-in's client half")
'''


def _sweep(tmp_path: Path, algorithm: str, runtime: dict) -> Path:
    raw = {
        "experiment": {
            "name": "plugin-sweep",
            "data": {
                "dataset": "digits",
                "num_clients": 6,
                "partition": {"kind": "iid"},
                "client_test_fraction": 0.2,
            },
            "model": {"name": "logreg"},
            "algorithm": {
                "name": algorithm,
                "rounds": 2,
                "clients_per_round": 3,
                "local_steps": 1,
                "lr": 0.5,
            },
            "privacy": {
                "epsilon": 50.0,
                "delta": 1e-3,
                "noise_multiplier": 1.0,
                "sampling_rate": 0.2,
            },
        },
        "runtime": {"checkpoint_every": 1, **runtime},
        "tune": {
            "max_concurrent_trials": 1,
            "server_cpus": 0.5,
            "space": {"algorithm.lr": {"grid": [0.1, 0.5]}},
        },
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _plugin(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "my_dpfl.py"  # not in the cwd (REPO), not importable
    path.parent.mkdir()
    path.write_text(PLUGIN)
    return path


def _tune(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "raydpfl", "tune", *args, "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO,
    )


@pytest.mark.slow  # two real sweeps: minutes on 2 cores
@pytest.mark.ray
def test_a_plugin_from_another_folder_sweeps_on_ray_and_resumes_without_unpickling(tmp_path):
    plugin = _plugin(tmp_path)
    path = _sweep(
        tmp_path, "elsewhere_dpfedavg", {"backend": "ray", "workers": 1, "cpus_per_worker": 0.5}
    )
    out = tmp_path / "out"

    done = _tune(str(path), "--plugin", str(plugin), "--out", str(out))

    assert done.returncode == 0, done.stderr[-3000:]
    table = pq.read_table(out / "results.parquet").to_pylist()
    assert [r["status"] for r in table] == ["completed", "completed"]
    state = json.loads((out / "sweep_state.json").read_text())
    assert state["plugins"] == [str(plugin.resolve())]
    # Plant pickles where Ray Tune keeps its state, and make the second trial unfinished.
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    for name in ("tuner.pkl", "searcher-state-planted.pkl", "trainable.pkl"):
        (out / "tune" / "sweep" / name).write_bytes(pickle.dumps(Payload()))
    state["trials"][1]["status"] = "RUNNING"
    (out / "sweep_state.json").write_text(json.dumps(state))
    second = out / table[1]["run_dir"]
    first_summary = (out / table[0]["run_dir"] / "summary.json").read_text()
    (second / "summary.json").unlink()

    resumed = _tune("--resume", str(out))  # its plug-in comes from sweep_state.json

    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not marker.exists()
    again = pq.read_table(out / "results.parquet").to_pylist()
    assert [r["status"] for r in again] == ["completed", "completed"]
    # The finished trial was replayed (its run untouched); the other continued from its
    # checkpoint to the same model.
    assert (out / table[0]["run_dir"] / "summary.json").read_text() == first_summary
    summary = json.loads((second / "summary.json").read_text())
    assert summary["resumed_from_round"] == 2
    assert summary["model_sha256"] == table[1]["model_sha256"]
    assert [r["metric_last"] for r in again] == [r["metric_last"] for r in table]


@pytest.mark.slow  # a real sweep
@pytest.mark.ray
def test_a_sweep_whose_every_trial_fails_exits_1_naming_the_first_error(tmp_path):
    plugin = _plugin(tmp_path)
    path = _sweep(tmp_path, "always_fails", {"backend": "local"})
    out = tmp_path / "out"

    done = _tune(str(path), "--plugin", str(plugin), "--out", str(out))

    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    log = out / "trials" / "t00000" / "error.log"
    assert last == (
        "raydpfl: sweep failed: all 2 trials failed; first error (t00000): RuntimeError: "
        f"client 1 failed in round 1: boom from the plug-in's client half; traceback in {log}"
    )
    assert "Traceback" in log.read_text()
    assert "Traceback" not in done.stderr  # Ray Tune's own report stays off the terminal
    table = pq.read_table(out / "results.parquet").to_pylist()
    assert [r["status"] for r in table] == ["error", "error"]
