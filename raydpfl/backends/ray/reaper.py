"""Ends the Ray processes a driver started when the driver dies without shutting Ray down.

A `raydpfl run` killed with SIGKILL (or by the OOM killer) never reaches `ray.shutdown()`,
and a `ray.shutdown()` after the GCS died cannot reach every process.
Ray's raylet and GCS notice and exit, but its dashboard and runtime-env agents (Ray 2.60)
stay behind, one pair per killed run. So, when raydpfl starts a local Ray instance, it
also starts this small watcher (`start_reaper`): it waits for the driver to go, gives Ray
a moment to stop on its own, then terminates whatever of the recorded processes is left.

Processes are recorded as (pid, start time) so that a pid reused by an unrelated process
is never touched. Linux only (it reads /proc); elsewhere nothing is started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

#: Seconds Ray gets to stop by itself after the driver is gone, before SIGTERM, and
#: between SIGTERM and SIGKILL.
GRACE_S = 3.0


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or
    None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its ")".
    return stat.rsplit(")", 1)[1].split()[19]


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def start_reaper(driver_pid: int, pids: Iterable[int]) -> subprocess.Popen | None:
    """Starts the watcher for `driver_pid` and the Ray processes `pids` (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    records = [f"{pid}:{start}" for pid in pids if (start := start_time(pid)) is not None]
    if not records:
        return None
    # This file run in isolated mode (-I: no PYTHONPATH, no cwd or script directory on
    # sys.path; it needs the standard library only): `-m raydpfl...` would import the
    # raydpfl of the working directory when that is another checkout.
    return subprocess.Popen(
        [sys.executable, "-I", str(Path(__file__).resolve()), str(driver_pid), *records],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not in the driver's process group: a Ctrl-C spares it
        close_fds=True,
    )


def _alive(records: list[tuple[int, str]]) -> list[int]:
    return [pid for pid, start in records if start_time(pid) == start]


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


#: What `disconnect` sends the watcher once `ray.shutdown()` returned: end what is left
#: now, without waiting for the driver to exit (a shutdown after the GCS was killed could
#: not reach the agents, which otherwise stayed ~60 s, or as long as the driver lived).
RELEASE = signal.SIGUSR1


def watch(driver_pid: int, records: list[tuple[int, str]], poll_s: float = 0.5) -> None:
    """Waits for the driver to exit (or for `RELEASE`), then ends what is left of
    `records`."""
    released = []
    if threading.current_thread() is threading.main_thread():
        signal.signal(RELEASE, lambda signum, frame: released.append(signum))
    driver_start = start_time(driver_pid)
    while start_time(driver_pid) == driver_start and driver_start is not None and not released:
        time.sleep(poll_s)
    time.sleep(GRACE_S)
    _signal(_alive(records), signal.SIGTERM)
    time.sleep(GRACE_S)
    _signal(_alive(records), signal.SIGKILL)


if __name__ == "__main__":  # python -I .../reaper.py DRIVER PID:START ...
    parsed = [(int(p), s) for p, s in (arg.split(":") for arg in sys.argv[2:])]
    watch(int(sys.argv[1]), parsed)
