"""Memory and CPU time of a whole process tree, sampled from /proc (Linux; no psutil).

A benchmark runner runs in its own subprocess; everything it starts is a descendant
(for Ray: the GCS, the raylet and, under the raylet, the server and worker actors and
Ray's agents). `TreeSampler` walks /proc every `interval` seconds in a background
thread of the *parent*, so the measured process is not slowed by its own measurement:

- RSS: resident pages per process, summed; the largest sum is kept. Pages shared
  between processes (Ray's object store, which every worker maps; shared libraries)
  count once per process, so for a multi-process run this sum overstates.
- PSS: each shared page divided among the processes mapping it (/proc/PID/smaps_rollup),
  summed: the tree's actual footprint, the fairer figure across runners. Reading it
  walks page tables (~5 ms per Ray process, ~50 ms for a Ray run's tree), so it is
  sampled every `pss_every`-th tick (default: every 5 s) to keep the sampler's CPU use
  (reported as `sampler_cpu_seconds`) small beside the measured run, and at any tick
  whose RSS sum is more than `PSS_ON_GROWTH` above the RSS of the last PSS reading: a
  peak between two periodic readings is not missed (one W3 run's peak PSS read 23%
  low before), and a tree whose memory is flat costs no extra reading.
- CPU: user and system seconds and minor page faults of every process, as last seen
  alive, summed per process name (``comm``): where a run's time goes (user code or
  the kernel, and in which process).

Samples miss what happens between them (short peaks, a process's last 0.2 s): memory
peaks are lower bounds and CPU totals slightly short.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat used here."""

    ppid: int
    comm: str
    rss_kib: int
    minor_faults: int
    user_s: float
    sys_s: float


@dataclass
class TreeUsage:
    """What a `TreeSampler` saw over a run."""

    peak_rss_mib: float = 0.0
    peak_pss_mib: float = 0.0
    peak_processes: int = 0  # the most processes alive in the tree at one sample
    samples: int = 0
    pss_samples: int = 0
    sampler_cpu_seconds: float = 0.0  # CPU time the sampling thread itself used
    #: comm -> {"processes", "user_s", "sys_s", "minor_faults"}, summed over processes.
    cpu_by_name: dict[str, dict[str, float]] = field(default_factory=dict)


def _stat(pid: str) -> ProcStat | None:
    """/proc/PID/stat of `pid`, or None if it is gone."""
    try:
        text = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after it.
    comm = text[text.index("(") + 1 : text.rindex(")")]
    f = text[text.rindex(")") + 2 :].split()  # f[0] is field 3 (state)
    return ProcStat(
        ppid=int(f[1]),
        comm=comm,
        rss_kib=int(f[21]) * PAGE_KIB,
        minor_faults=int(f[7]),
        user_s=int(f[11]) / TICKS,
        sys_s=int(f[12]) / TICKS,
    )


def _pss_kib(pid: int) -> int:
    """Proportional set size of `pid` in KiB (0 if it is gone)."""
    try:
        with open(PROC / str(pid) / "smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_stats(root: int) -> dict[int, ProcStat]:
    """`root` and all its live descendants."""
    info = {int(p): s for p in os.listdir(PROC) if p.isdigit() and (s := _stat(p)) is not None}
    children: dict[int, list[int]] = defaultdict(list)
    for pid, s in info.items():
        children[s.ppid].append(pid)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in info:
            tree[pid] = info[pid]
            todo.extend(children[pid])
    return tree


class TreeSampler:
    """Samples the tree under `root` every `interval` s until the block ends.

    Usage::

        with TreeSampler(proc.pid) as sampler:  # proc: a subprocess.Popen
            proc.wait()
        sampler.result.peak_pss_mib
    """

    #: Relative RSS growth since the last PSS reading that triggers another one.
    PSS_ON_GROWTH = 0.02

    def __init__(self, root: int, interval: float = 0.2, pss_every: int = 25) -> None:
        self.root = root
        self.interval = interval
        self.pss_every = pss_every
        self._rss_at_pss = 0.0  # the RSS sum (KiB) when PSS was last read
        self.result = TreeUsage()
        self._last: dict[int, ProcStat] = {}  # every process seen, as last seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-sampler", daemon=True)

    def _loop(self) -> None:
        r = self.result
        while True:
            tree = tree_stats(self.root)
            self._last.update(tree)
            rss = sum(s.rss_kib for s in tree.values())
            r.peak_rss_mib = max(r.peak_rss_mib, rss / 1024)
            r.peak_processes = max(r.peak_processes, len(tree))
            grew = rss > self._rss_at_pss * (1.0 + self.PSS_ON_GROWTH)
            if r.samples % self.pss_every == 0 or grew:
                self._rss_at_pss = rss
                pss = sum(_pss_kib(p) for p in tree)
                r.peak_pss_mib = max(r.peak_pss_mib, pss / 1024)
                r.pss_samples += 1
            r.samples += 1
            r.sampler_cpu_seconds = time.thread_time()
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        by_name: dict[str, dict[str, float]] = {}
        for s in self._last.values():
            d = by_name.setdefault(
                s.comm, {"processes": 0, "user_s": 0.0, "sys_s": 0.0, "minor_faults": 0}
            )
            d["processes"] += 1
            d["user_s"] += s.user_s
            d["sys_s"] += s.sys_s
            d["minor_faults"] += s.minor_faults
        self.result.cpu_by_name = by_name
