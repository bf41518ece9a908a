"""A stale run.lock (its pid gone on this host) is recognised, said to be stale and taken
over; deleting the run.lock of a live run no longer lets a second writer in.

Before: a SIGKILLed run's run.lock stayed, with nothing saying it was harmless, which
invited deleting it; and a lock file deleted under a live run let a second resume take
the directory over (the lock guarded the file's path, not the directory).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from raydpfl.simulation.run_lock import LOCK_FILE, RunDirBusyError, check_not_busy, run_dir_lock


def _gone_pid() -> int:
    """A pid no process of this host has now."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_lock_left_by_a_killed_run_is_called_stale_and_taken_over(tmp_path, caplog):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pid = _gone_pid()
    (run_dir / LOCK_FILE).write_text(f"{pid} {socket.gethostname()}\n")
    check_not_busy(run_dir)  # a stale file blocks nobody
    quiet = caplog.at_level(logging.WARNING, logger="raydpfl.simulation.run_lock")
    with quiet, run_dir_lock(run_dir):
        assert (run_dir / LOCK_FILE).read_text().split()[0] == str(os.getpid())
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert f"named pid {pid}, which is gone on this host" in messages[0]
    assert "stale lock, taken over" in messages[0]
    assert not (run_dir / LOCK_FILE).exists()  # released as usual


def test_a_live_holder_on_another_host_is_not_called_stale(tmp_path, caplog):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).write_text(f"{_gone_pid()} some-other-host\n")
    quiet = caplog.at_level(logging.WARNING, logger="raydpfl.simulation.run_lock")
    with quiet, run_dir_lock(run_dir):
        pass
    assert caplog.records == []  # a pid of another host says nothing about this one


HOLDER = textwrap.dedent(
    """
    import sys, time
    from raydpfl.simulation.run_lock import run_dir_lock
    with run_dir_lock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(60)
    """
)


def test_deleting_the_lock_file_of_a_live_run_does_not_let_a_second_writer_in(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        (run_dir / LOCK_FILE).unlink()  # what a user does to a "left-over" lock
        with pytest.raises(RunDirBusyError, match=r"its run\.lock was deleted"):
            check_not_busy(run_dir)
        refused = pytest.raises(RunDirBusyError, match=r"deleting run\.lock does not release")
        with refused, run_dir_lock(run_dir):
            pass
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the OS drops the dead holder's locks
        try:
            with run_dir_lock(run_dir):
                break
        except RunDirBusyError:
            time.sleep(0.05)
    else:
        pytest.fail("the directory stayed locked after its holder died")
