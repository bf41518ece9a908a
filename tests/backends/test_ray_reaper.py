"""A driver killed outright (SIGKILL) leaves no Ray process behind: the reaper started by
`connect` ends what Ray 2.60 leaves (its dashboard and runtime-env agents)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from raydpfl.backends.ray.reaper import descendants, start_time

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CHILD = (
    "import time; from raydpfl.backends.ray.runner import connect; connect(None); "
    "print('up', flush=True); time.sleep(600)"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper reads /proc")
def test_a_sigkilled_driver_leaves_no_ray_process():
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert child.stdout.readline().strip() == "up"
        time.sleep(1.0)
        tree = {pid: start_time(pid) for pid in descendants(child.pid)}
        assert len(tree) >= 4  # gcs, raylet, agents, workers, the reaper
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

    deadline = time.monotonic() + 30
    alive = tree
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = {pid: s for pid, s in tree.items() if s is not None and start_time(pid) == s}
    assert alive == {}, f"still running: {sorted(alive)}"


def test_the_reaper_spares_a_reused_pid(tmp_path):
    """It records (pid, start time): a process with the same pid but a later start is not
    touched (here: a live process recorded with a wrong start time)."""
    from raydpfl.backends.ray.reaper import watch

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gone = 2**22 + 7  # a pid that does not exist: the "driver" is already gone
        watch(gone, [(bystander.pid, "0")], poll_s=0.01)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


AFTER_GCS_KILL = """
import os, signal, sys, time
from pathlib import Path
from raydpfl.backends.ray.reaper import descendants
from raydpfl.backends.ray.runner import connect, disconnect
connect(None)
time.sleep(1.0)
def cmdline(pid):
    return Path(f"/proc/{pid}/cmdline").read_text()
mine = [p for p in descendants(os.getpid()) if "reaper.py" not in cmdline(p)]
gcs = [p for p in mine if "gcs_server" in cmdline(p)]
print(" ".join(map(str, mine)), flush=True)
os.kill(gcs[0], signal.SIGKILL)
time.sleep(1.0)
disconnect()
print("down", flush=True)
time.sleep(120)  # the driver lives on (a notebook, a sweep): Ray's processes must not
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper reads /proc")
def test_no_ray_process_outlives_a_shutdown_after_the_gcs_was_killed():
    child = subprocess.Popen(
        [sys.executable, "-c", AFTER_GCS_KILL],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        tree = {int(p): start_time(int(p)) for p in child.stdout.readline().split()}
        assert len(tree) >= 3, tree  # gcs, raylet, agents
        assert child.stdout.readline().strip() == "down"
        deadline = time.monotonic() + 20  # before: agents stayed ~60 s
        alive = tree
        while alive and time.monotonic() < deadline:
            time.sleep(0.5)
            alive = {pid: s for pid, s in tree.items() if s is not None and start_time(pid) == s}
        assert child.poll() is None  # the driver is still running
        assert alive == {}, f"still running: {sorted(alive)}"
    finally:
        child.kill()
        child.wait()
