"""`raydpfl tune` end to end, as a user runs it: real Ray, real Tune, real trials.

Each test starts its own Ray instance in a child process (the CLI), like a user would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from raydpfl.config.load import load_config

REPO = Path(__file__).resolve().parents[2]

SWEEP = {
    "experiment": {
        "name": "digits-sweep",
        "data": {
            "dataset": "digits",
            "num_clients": 8,
            "partition": {"kind": "iid"},
            "client_test_fraction": 0.2,
        },
        "model": {"name": "logreg"},
        "algorithm": {
            "name": "dp_fedavg",
            "rounds": 4,
            "clients_per_round": 4,
            "local_steps": 2,
            "lr": 0.5,
            "eval_every": 1,
        },
        "privacy": {"epsilon": 50.0, "delta": 1e-3, "noise_multiplier": 1.0, "sampling_rate": 0.2},
    },
    "runtime": {
        "backend": "ray",
        "workers": 1,
        "cpus_per_worker": 0.5,
        "aggregation_groups": 2,
        "checkpoint_every": 2,
    },
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _write(tmp_path: Path, tune: dict, **algorithm) -> Path:
    raw = json.loads(json.dumps(SWEEP))
    raw["experiment"]["algorithm"].update(algorithm)
    raw["tune"] = tune
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _tune(*args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raydpfl", "tune", *args, "--quiet"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        cwd=REPO,
    )


@pytest.mark.slow  # a real Ray Tune sweep: minutes on 2 cores
@pytest.mark.ray
def test_asha_sweep_writes_its_table_best_config_and_privacy_of_selection(tmp_path):
    path = _write(
        tmp_path,
        {
            "num_samples": 2,
            "scheduler": {"kind": "asha", "grace_period": 1, "reduction_factor": 2},
            "server_cpus": 0.5,
            "space": {
                "algorithm.lr": {"grid": [0.02, 0.5]},
                "privacy.clip_norm": {"uniform": [0.5, 2.0]},
            },
        },
    )
    out = tmp_path / "sweep"

    done = _tune(str(path), "--out", str(out))

    assert done.returncode == 0, done.stderr[-3000:]
    table = pq.read_table(out / "results.parquet").to_pylist()
    assert len(table) == 4
    assert {r["status"] for r in table} <= {"completed", "stopped_early"}
    assert any(r["status"] == "completed" for r in table)
    # ASHA (halving at rounds 1 and 2) stops at least one of four trials early.
    assert any(r["rounds_completed"] < 4 for r in table)
    assert {r["experiment.algorithm.lr"] for r in table} == {0.02, 0.5}
    for r in table:  # every trial is an ordinary run directory
        assert (out / r["run_dir"] / "rounds.parquet").exists()
        assert 0.5 <= r["experiment.privacy.clip_norm"] <= 2.0
    summary = json.loads((out / "sweep_summary.json").read_text())
    best = max((r for r in table if r["metric_last"] is not None), key=lambda r: r["metric_last"])
    assert summary["best_trial"] == best["trial_id"]
    best_config = load_config(out / "best_config.yaml")
    assert best_config.experiment.algorithm.lr == best["experiment.algorithm.lr"]
    assert best_config.experiment.privacy.clip_norm == pytest.approx(
        best["experiment.privacy.clip_norm"]
    )
    privacy = summary["privacy"]
    assert privacy["epsilon_per_trial_label"] == "per trial, tuning excluded"
    assert privacy["epsilon_sweep"] > privacy["epsilon_per_trial_max"] > 0
    assert "best trial:" in done.stdout or "best:" in done.stdout


@pytest.mark.slow  # a real Ray Tune sweep: minutes on 2 cores
@pytest.mark.ray
def test_a_killed_sweep_resumes_and_ends_with_the_uninterrupted_models(tmp_path):
    tune = {
        "max_concurrent_trials": 1,
        "server_cpus": 0.5,
        "space": {"algorithm.lr": {"grid": [0.1, 0.5]}},
    }
    # Enough rounds that the kill lands inside a trial even on a fast idle machine.
    path = _write(tmp_path, tune, rounds=30)
    out = tmp_path / "killed"
    child = subprocess.Popen(
        [sys.executable, "-m", "raydpfl", "tune", str(path), "--out", str(out), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
        cwd=REPO,
        start_new_session=True,  # its Ray processes share its process group
    )
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            unfinished = [
                r
                for r in out.glob("trials/*/rounds.parquet")
                if not (r.parent / "summary.json").exists()
            ]
            if any(pq.read_metadata(r).num_rows >= 3 for r in unfinished):
                break  # a running trial is past its round-2 checkpoint
            time.sleep(0.2)
        else:
            pytest.fail("the sweep never got to round 3")
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert not (out / "results.parquet").exists()

    resumed = _tune("--resume", str(out))

    assert resumed.returncode == 0, resumed.stderr[-3000:]
    table = pq.read_table(out / "results.parquet").to_pylist()
    assert [r["status"] for r in table] == ["completed", "completed"]
    summaries = [json.loads((out / r["run_dir"] / "summary.json").read_text()) for r in table]
    resumed_from = [s["resumed_from_round"] for s in summaries if s["resumed_from_round"]]
    assert len(resumed_from) == 1  # the trial killed mid-run, from its last checkpoint
    assert resumed_from[0] % 2 == 0 and 2 <= resumed_from[0] < 30
    # The same trials uninterrupted (the local backend gives the Ray backend's bits).
    for r, s in zip(table, summaries, strict=True):
        config = load_config(out / r["run_dir"] / "config.yaml", ["runtime.backend=local"])
        from raydpfl.experiment.build import build_experiment, run_experiment

        fresh = run_experiment(build_experiment(config), None)
        assert s["model_sha256"] == fresh["model_sha256"]
