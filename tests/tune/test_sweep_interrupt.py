"""A real signal on a real `raydpfl tune`: Ctrl-C (SIGINT to the process group, as a
terminal sends it) exits 130 and SIGTERM 143; sweep_summary.json records the signal; the
trial that was running is `interrupted`, the ones that never ran `not_started`; the last
line is the exact `raydpfl tune --resume` command (not Ray's `Tuner.restore(...)`), and
that command finishes the sweep."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from raydpfl.tune.interrupt import SweepInterrupt, SweepInterrupted
from raydpfl.tune.status import sweep_status

REPO = Path(__file__).resolve().parents[2]

SWEEP = {
    "experiment": {
        "name": "interrupt-sweep",
        "data": {
            "dataset": "digits",
            "num_clients": 6,
            "partition": {"kind": "iid"},
            "client_test_fraction": 0.2,
        },
        "model": {"name": "logreg"},
        # Enough rounds that the signal lands inside the first trial.
        "algorithm": {"name": "dp_fedavg", "rounds": 60, "clients_per_round": 3, "lr": 0.5},
        "privacy": {"epsilon": 50.0, "delta": 1e-3, "noise_multiplier": 1.0, "sampling_rate": 0.2},
    },
    "runtime": {"backend": "local", "checkpoint_every": 2},
    "tune": {
        "max_concurrent_trials": 1,  # the second and third trials wait: never started
        "server_cpus": 0.5,
        "space": {"algorithm.lr": {"grid": [0.1, 0.3, 0.5]}},
    },
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _running_rounds(out: Path) -> int:
    most = 0
    for path in out.glob("trials/*/rounds.parquet"):
        with contextlib.suppress(Exception):  # being replaced
            most = max(most, pq.read_metadata(path).num_rows)
    return most


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize(
    ("sig", "whole_group", "code"),
    [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)],
    ids=["ctrl-c", "sigterm"],
)
def test_an_interrupted_sweep_records_it_and_says_how_to_resume(tmp_path, sig, whole_group, code):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(SWEEP))
    out = tmp_path / "sweep"
    child = subprocess.Popen(
        [sys.executable, "-m", "raydpfl", "tune", str(path), "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=REPO,
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 300
        while _running_rounds(out) < 3 and time.monotonic() < deadline:
            assert child.poll() is None, child.communicate()[1][-3000:]
            time.sleep(0.1)
        (os.killpg if whole_group else os.kill)(child.pid, sig)
        stdout, stderr = child.communicate(timeout=180)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)

    assert child.returncode == code, stderr[-3000:]
    hint = stderr.strip().splitlines()[-1]
    assert hint.startswith("raydpfl: ") and "continue the sweep with: " in hint, stderr
    command = shlex.split(hint.split("continue the sweep with: ")[1])
    assert command == ["raydpfl", "tune", "--resume", str(out.resolve())]
    assert "Tuner.restore" not in stdout + stderr
    assert "Token authentication is enabled" not in stderr

    summary = json.loads((out / "sweep_summary.json").read_text())
    assert summary["interrupted"]["signal"] == signal.Signals(sig).name
    assert summary["interrupted"]["resume"] == shlex.join(command)
    table = pq.read_table(out / "results.parquet").to_pylist()
    ran = [r for r in table if r["status"] == "interrupted"]
    assert len(ran) == 1 and ran[0]["rounds_completed"] >= 3
    assert not any(r["status"] in ("stopped_early", "completed") for r in table)
    assert summary["trials_interrupted"] == 1
    assert summary["trials_not_started"] == 2 and summary["trials_planned"] == 3
    assert "2 not started" in stdout

    if sig != signal.SIGINT:
        return  # one resume is enough: it does not depend on the signal
    resumed = subprocess.run(
        [sys.executable, "-m", *command[:1], *command[1:], "--quiet"],
        capture_output=True,
        text=True,
        timeout=420,
        env=_env(),
        cwd=REPO,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = json.loads((out / "sweep_summary.json").read_text())
    assert after["trials_completed"] == 3 and "interrupted" not in after
    assert after["earlier_interruptions"] == [summary["interrupted"]]
    table = pq.read_table(out / "results.parquet").to_pylist()
    continued = next(r for r in table if r["trial_id"] == ran[0]["trial_id"])
    state = json.loads((out / continued["run_dir"] / "summary.json").read_text())
    assert state["resumed_from_round"] >= 2  # from its checkpoint, not from scratch


@pytest.mark.parametrize(
    ("tune_status", "error", "completed", "ran", "interrupted", "expected"),
    [
        ("TERMINATED", False, True, True, False, "completed"),
        ("ERROR", True, False, True, False, "error"),
        ("TERMINATED", False, False, True, False, "stopped_early"),  # ASHA stopped it
        ("RUNNING", False, False, True, True, "interrupted"),
        ("RUNNING", False, False, False, True, "interrupted"),  # started, no round yet
        ("PENDING", False, False, False, True, "not_started"),
        ("PENDING", False, False, True, True, "interrupted"),  # waits to continue
        (None, False, False, True, True, "interrupted"),
        (None, False, False, False, True, "not_started"),
        (None, False, False, True, False, "stopped_early"),
    ],
)
def test_sweep_status_calls_only_trials_that_ran_stopped_early(
    tune_status, error, completed, ran, interrupted, expected
):
    assert sweep_status(tune_status, error, completed, ran, interrupted) == expected


def test_a_signal_before_tunes_loop_stops_at_once_and_says_which():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SweepInterrupted) as stopped, SweepInterrupt() as stop:
        signal.raise_signal(signal.SIGTERM)
    assert stopped.value.signum == signal.SIGTERM
    assert stop.record() == {"signal": "SIGTERM", "at": stop.at}
    assert signal.getsignal(signal.SIGTERM) is before  # handlers put back


def test_a_signal_inside_tunes_loop_asks_tune_to_stop_and_a_second_stops_at_once():
    asked = []
    usr1_before = signal.getsignal(signal.SIGUSR1)
    with SweepInterrupt() as stop:
        # What Tune's fit() does: register its stop function for SIGUSR1.
        signal.signal(signal.SIGUSR1, lambda signum, frame: asked.append(signum))
        signal.raise_signal(signal.SIGINT)
        assert asked == [signal.SIGUSR1] and stop.signal == "SIGINT"
        with pytest.raises(SweepInterrupted):
            signal.raise_signal(signal.SIGINT)
    assert stop.record()["signal"] == "SIGINT"
    assert signal.getsignal(signal.SIGUSR1) is usr1_before  # Tune's stale one removed
