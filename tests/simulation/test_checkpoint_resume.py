"""Kill a run mid-way, resume it: same final model and ledger as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml

from raydpfl.config import config_from_dict, load_config
from raydpfl.config.schema import ConfigError
from raydpfl.experiment.build import (
    build_experiment,
    make_local_backend,
    make_server,
    run_experiment,
)
from raydpfl.simulation.outputs import RunWriter

RAW = {
    "experiment": {
        "name": "resume",
        "data": {"dataset": "digits", "num_clients": 8, "partition": {"kind": "iid"}},
        "model": {"name": "mlp", "hidden": 32},
        "algorithm": {
            "name": "ali_dpfl",
            "rounds": 14,
            "clients_per_round": 8,
            "lr": 0.5,
            "eval_every": 3,
            "ali_dpfl": {"mu_probe_size": 32},
        },
        "privacy": {
            "epsilon": 6.0,
            "delta": 1e-4,
            "noise_multiplier": 1.1,
            "sampling_rate": 0.1,
        },
    },
    "runtime": {"backend": "local", "seed": 3, "progress": False, "checkpoint_every": 4},
}

# Runs the config in a child process, sleeping after each round so the kill lands mid-run.
CHILD = """
import sys, time
from raydpfl.config import load_config
from raydpfl.config.schema import ConfigError
from raydpfl.experiment.build import (
    build_experiment,
    make_local_backend,
    make_server,
    run_experiment,
)
from raydpfl.simulation.outputs import RunWriter
from pathlib import Path
run_dir = Path(sys.argv[2]); run_dir.mkdir()
exp = build_experiment(load_config(sys.argv[1]))
run_experiment(exp, run_dir, on_round=lambda row: time.sleep(0.4))
"""


def _rows(run_dir) -> int:
    try:
        return len(pd.read_parquet(run_dir / "rounds.parquet"))
    except Exception:  # not written yet, or being replaced
        return 0


@pytest.mark.slow  # a killed training and its resume (about 8 s on 2 cores)
def test_killed_run_resumes_to_the_same_model_and_ledger(tmp_path):
    reference = run_experiment(build_experiment(config_from_dict(RAW)), None)

    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(RAW))
    run_dir = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(config_path), str(run_dir)],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    deadline = time.monotonic() + 120
    while _rows(run_dir) < 6 and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.05)
    assert child.poll() is None, "the run finished before it could be killed"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert not (run_dir / "summary.json").exists()
    state, _ = RunWriter(run_dir).read_checkpoint()
    assert state["rounds_completed"] == 4  # checkpoint_every: 4; killed after round 6
    log_lines = (run_dir / "ledger_log.jsonl").read_text().splitlines()
    charged_rounds = {json.loads(line)["round"] for line in log_lines}
    assert max(charged_rounds) >= 5  # rounds after the checkpoint were charged on disk

    exp = build_experiment(load_config(run_dir / "config.yaml"))
    resumed = run_experiment(exp, run_dir, resume=True)

    assert resumed["resumed_from_round"] == 4
    assert resumed["model_sha256"] == reference["model_sha256"]
    assert resumed["ledger_sha256"] == reference["ledger_sha256"]
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert rounds["round"].tolist() == list(range(1, len(rounds) + 1))
    assert len(rounds) == reference["rounds_completed"]
    clients = pd.read_parquet(run_dir / "clients.parquet")
    assert sorted(clients["round"].unique()) == [
        r for r in rounds["round"] if r % 3 == 0 or r == len(rounds)
    ]
    with pytest.raises(ValueError, match="finished run"):
        run_experiment(exp, run_dir, resume=True)


def _interrupted_run(tmp_path, rounds=5):
    """A finished run with its summary removed: to a resume, interrupted after `rounds`."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    raw = json.loads(json.dumps(RAW))
    raw["experiment"]["algorithm"]["rounds"] = rounds
    run_experiment(build_experiment(config_from_dict(raw)), run_dir)
    (run_dir / "summary.json").unlink()
    return run_dir, raw


def test_a_resume_that_changes_results_is_refused_naming_the_key(tmp_path):
    run_dir, raw = _interrupted_run(tmp_path)
    raw["experiment"]["privacy"]["noise_multiplier"] = 1.3
    with pytest.raises(ConfigError, match=r"^experiment\.privacy\.noise_multiplier: is 1\.1"):
        run_experiment(build_experiment(config_from_dict(raw)), run_dir, resume=True)
    raw["experiment"]["privacy"]["noise_multiplier"] = 1.1
    raw["runtime"]["seed"] = 4  # with data.seed null: other data, other partition
    with pytest.raises(ConfigError, match=r"^runtime\.seed: is 3 in the run's config\.yaml"):
        run_experiment(build_experiment(config_from_dict(raw)), run_dir, resume=True)


def test_a_replay_that_charges_differently_is_refused(tmp_path):
    run_dir, raw = _interrupted_run(tmp_path)
    # Past the config check (the server API takes any experiment): a replay whose sigma
    # differs makes other charges than the log holds for the replayed rounds.
    writer = RunWriter(run_dir)
    state, _ = writer.read_checkpoint()
    assert state["rounds_completed"] == 4  # the checkpoint after round 4; round 5 replays
    raw["experiment"]["privacy"]["noise_multiplier"] = 1.3
    server = make_server(build_experiment(config_from_dict(raw)), writer, resume=True)
    with pytest.raises(RuntimeError, match="resume diverged"):
        server.run(make_local_backend(build_experiment(config_from_dict(raw))))
