"""A real signal on a real `raydpfl run`: it exits 130 (Ctrl-C) or 143 (SIGTERM), keeps its
finished rounds, prints the exact command that continues it, and that command finishes it
with the model an uninterrupted run ends with."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from raydpfl.cli.main import main
from tests.run_outputs import assert_same_outputs

RAW = {
    "experiment": {
        "name": "interrupt",
        "data": {"dataset": "digits", "num_clients": 6, "partition": {"kind": "iid"}},
        "model": {"name": "mlp", "hidden": 16},
        "algorithm": {
            "name": "dp_fedavg",
            "rounds": 40,
            "clients_per_round": 6,
            "local_steps": 5,
            "lr": 0.5,
        },
        "privacy": {"epsilon": 50.0, "delta": 1e-4, "noise_multiplier": 1.0},
    },
    "runtime": {"backend": "local", "seed": 1, "progress": False, "checkpoint_every": 3},
}

# Sleeps a little after each round (through a wrapped writer) so the signal lands mid-run.
# A shell that starts this test suite in the background (`cmd &`, nohup) hands every child
# SIGINT ignored, and Python then never installs its KeyboardInterrupt handler: the child
# restores it, as a terminal's foreground process has it (the run respects an ignored
# SIGINT by design).
CHILD = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import raydpfl.simulation.outputs as outputs
from raydpfl.cli.main import main
from tests.run_outputs import assert_same_outputs
add_round = outputs.RunWriter.add_round
def slow_add_round(self, row):
    add_round(self, row)
    time.sleep(0.15)
outputs.RunWriter.add_round = slow_add_round
sys.exit(main(sys.argv[1:]))
"""


def _rounds_written(run_dir: Path) -> int:
    import pandas as pd

    try:
        return len(pd.read_parquet(run_dir / "rounds.parquet"))
    except Exception:  # not written yet, or being replaced
        return 0


@pytest.mark.slow  # two runs and a resume per signal: ~25 s each on 2 cores
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_run_says_how_to_resume_and_the_command_works(tmp_path, sig, code):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(RAW))
    run_dir = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "run", str(config), "--out", str(run_dir)],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while _rounds_written(run_dir) < 4 and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.05)
    assert child.poll() is None, "the run finished before it could be interrupted"
    child.send_signal(sig)
    _, err = child.communicate(timeout=60)

    assert child.returncode == code, err
    assert not (run_dir / "summary.json").exists()
    hint = err.strip().splitlines()[-1]
    assert "finished rounds are kept in" in hint, err
    command = shlex.split(hint.split("continue with: ")[1])
    assert command[:3] == ["raydpfl", "run", "--resume"]

    assert main([*command[1:], "--no-progress"]) == 0
    resumed = json.loads((run_dir / "summary.json").read_text())
    reference = tmp_path / "reference"
    assert main(["run", str(config), "--out", str(reference), "--no-progress"]) == 0
    assert resumed["resumed_from_round"] >= 3
    assert (
        resumed["model_sha256"]
        == json.loads((reference / "summary.json").read_text())["model_sha256"]
    )
    assert_same_outputs(run_dir, reference)  # every table, not only the hashes


@pytest.mark.slow  # a run, a resume and a reference run: ~25 s on 2 cores
def test_a_sigkilled_run_resumes_to_every_output_of_an_uninterrupted_one(tmp_path):
    raw = json.loads(json.dumps(RAW))
    raw["experiment"]["algorithm"].update(
        {"rounds": 12, "eval_every": 1, "evaluate_clients": True}
    )
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "run", str(config), "--out", str(run_dir)],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while _rounds_written(run_dir) < 7 and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.05)
    assert child.poll() is None, "the run finished before it could be killed"
    child.kill()
    child.wait(timeout=60)
    assert (run_dir / "run.lock").exists()  # left behind: stale, and harmless
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 0
    reference = tmp_path / "reference"
    assert main(["run", str(config), "--out", str(reference), "--no-progress"]) == 0
    assert_same_outputs(run_dir, reference)


@pytest.mark.slow
@pytest.mark.ray
def test_sigterm_on_the_ray_backend_is_an_orderly_stop(tmp_path):
    # ray.init installs a C++ SIGTERM handler that aborts the driver (exit 134, a stack
    # dump, no resume command); connect() puts the CLI's handler back.
    raw = json.loads(json.dumps(RAW))
    raw["runtime"].update({"backend": "ray", "workers": 1, "cpus_per_worker": 1})
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "run", str(config), "--out", str(run_dir)],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    while _rounds_written(run_dir) < 2 and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.05)
    assert child.poll() is None, "the run finished before it could be interrupted"
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)

    assert child.returncode == 143, err[-3000:]
    assert "SIGTERM received" not in err  # Ray's abort handler did not run
    assert err.strip().splitlines()[-1].endswith(f"raydpfl run --resume {run_dir}")
    for noise in ("Token authentication is enabled", "max_restarts > 0"):
        assert noise not in err  # Ray's notices stay in its log files
