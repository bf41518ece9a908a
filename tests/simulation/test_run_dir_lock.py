"""One process per run directory (issue 35, item 1): a second writer is refused in one
line naming the directory and the holder's pid, exit 2, before any data or Ray; the lock
dies with its holder and leaves nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from raydpfl.cli.main import main
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.simulation.integrity import read_chained_log
from raydpfl.simulation.outputs import CHARGE_LOG
from tests.conftest import small_config

ROOT = Path(__file__).resolve().parents[2]

# Holds an exclusive flock on a run directory's run.lock as a live run does (plain fcntl,
# so the test does not trust the code under test to take it), until its stdin closes.
HOLDER = """
import fcntl, os, socket, sys
fd = os.open(os.path.join(sys.argv[1], "run.lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{os.getpid()} {socket.gethostname()}\\n".encode())
print("held", flush=True)
sys.stdin.read()
"""

# A live resume of the run directory: sleeps after each round so that it is mid-run while
# the test starts a second process on the same directory.
LIVE_RESUME = """
import sys, time
from pathlib import Path
from raydpfl.config import load_config
from raydpfl.experiment.build import build_experiment, run_experiment
run_dir = Path(sys.argv[1])
exp = build_experiment(load_config(run_dir / "config.yaml"))
def slow(row):
    print("round", row["round"], flush=True)
    time.sleep(0.7)
run_experiment(exp, run_dir, on_round=slow, resume=True)
print("done", flush=True)
"""


def _config(rounds: int = 6):
    return small_config(
        experiment__algorithm={"rounds": rounds},
        runtime={"checkpoint_every": 100},  # only the start checkpoint
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lock") / "run"
    run_dir.mkdir()
    run_experiment(build_experiment(_config()), run_dir)
    return run_dir


@pytest.fixture
def interrupted(finished_run, tmp_path):
    """A copy of a finished 6-round run whose only checkpoint is its start: to a resume,
    an interrupted run with six rounds to replay."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    (run_dir / "summary.json").unlink()
    return run_dir


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _hold(run_dir: Path) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _release(holder: subprocess.Popen) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(timeout=30)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raydpfl: error: "), err
    return err[0]


def test_a_resume_of_a_run_another_process_holds_is_refused_in_one_line(interrupted, capsys):
    log_before = (interrupted / CHARGE_LOG).read_bytes()
    holder = _hold(interrupted)
    try:
        code = main(["run", "--resume", str(interrupted), "--no-progress"])
    finally:
        _release(holder)

    assert code == 2
    line = _one_line(capsys)
    assert str(interrupted) in line and f"pid {holder.pid}" in line
    assert (interrupted / CHARGE_LOG).read_bytes() == log_before  # nothing appended
    assert not (interrupted / "summary.json").exists()


def test_two_resumes_of_one_run_the_second_is_refused_and_the_chain_verifies(interrupted, capsys):
    live = subprocess.Popen(
        [sys.executable, "-c", LIVE_RESUME, str(interrupted)],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert live.stdout is not None
        first = live.stdout.readline()
        assert first.startswith("round"), first  # the live resume is mid-run

        code = main(["run", "--resume", str(interrupted), "--no-progress"])

        assert code == 2
        line = _one_line(capsys)
        assert f"pid {live.pid}" in line and str(interrupted) in line
        rest = live.stdout.read()
        assert live.wait(timeout=120) == 0 and rest.rstrip().endswith("done")
    finally:
        if live.poll() is None:
            live.kill()
    batches, _ = read_chained_log(interrupted / CHARGE_LOG)  # raises if the chain broke
    rounds = [b.round for b in batches]
    assert rounds == sorted(rounds) and len(rounds) == len(set(rounds)) == 6
    assert json.loads((interrupted / "summary.json").read_text())["rounds_completed"] == 6
    assert not (interrupted / "run.lock").exists()  # released with its run


def test_run_out_into_a_live_run_and_the_api_are_refused_naming_the_pid(
    interrupted, tmp_path, capsys
):
    import raydpfl

    holder = _hold(interrupted)
    try:
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({"runtime": {"backend": "local"}}))
        code = main(["run", str(config), "--out", str(interrupted), "--no-progress"])
        assert code == 2
        assert f"pid {holder.pid}" in _one_line(capsys)
        with pytest.raises(Exception, match=rf"in use by pid {holder.pid}") as info:
            raydpfl.run_simulation(_config(), run_dir=interrupted)
        assert type(info.value).__name__ == "RunDirBusyError"
        with pytest.raises(Exception, match=rf"in use by pid {holder.pid}"):
            run_experiment(build_experiment(_config()), interrupted, resume=True)
    finally:
        _release(holder)


def test_the_lock_dies_with_its_holder_and_a_stale_lock_file_blocks_nothing(
    interrupted, tmp_path, capsys
):
    holder = _hold(interrupted)
    os.kill(holder.pid, signal.SIGKILL)  # a run killed mid-round: the OS drops its flock
    holder.wait()
    assert (interrupted / "run.lock").exists()

    assert main(["run", "--resume", str(interrupted), "--no-progress"]) == 0
    assert not (interrupted / "run.lock").exists()

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "run.lock").write_text("12345 elsewhere\n")  # left by a run that died early
    import raydpfl

    result = raydpfl.run_simulation(_config(rounds=1), run_dir=fresh)
    assert result.summary["rounds_completed"] == 1
    assert not (fresh / "run.lock").exists()


def test_the_lock_is_reentrant_in_one_thread_and_refuses_another_thread(tmp_path):
    from raydpfl.simulation.run_lock import RunDirBusyError, run_dir_lock

    seen: list[BaseException] = []

    def other() -> None:
        try:
            with run_dir_lock(tmp_path / "d"):
                pass
        except RunDirBusyError as e:
            seen.append(e)

    with run_dir_lock(tmp_path / "d"), run_dir_lock(tmp_path / "d"):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert len(seen) == 1 and f"pid {os.getpid()}" in str(seen[0])
    with run_dir_lock(tmp_path / "d"):  # released: free again
        pass
    assert list((tmp_path / "d").iterdir()) == []


def test_a_sweep_directory_in_use_is_refused_before_ray_starts(tmp_path, monkeypatch):
    from raydpfl.backends.ray import runner
    from raydpfl.tune.sweep import resume_sweep

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(runner, "connect", no_ray)
    sweep_dir = tmp_path / "sweep"
    (sweep_dir / "trials").mkdir(parents=True)
    shutil.copy(ROOT / "configs" / "sweeps" / "dp_fedavg_tau.yaml", sweep_dir / "sweep.yaml")
    holder = _hold(sweep_dir)
    try:
        with pytest.raises(Exception, match=rf"in use by pid {holder.pid}"):
            resume_sweep(sweep_dir, verbose=0)
    finally:
        _release(holder)
