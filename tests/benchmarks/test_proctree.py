"""benchmarks/_proctree.py: the tree sampler's PSS peak follows memory growth between
its periodic readings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _proctree import TreeSampler  # noqa: E402

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc smaps_rollup"
)

# A child that touches 200 MiB after half a second and holds it for a second.
_GROW = (
    "import time; time.sleep(0.5); b = bytearray(200 << 20); "
    "b[::4096] = b'x' * len(b[::4096]); time.sleep(1.0)"
)


def test_pss_is_read_when_the_tree_grows_between_periodic_readings():
    proc = subprocess.Popen([sys.executable, "-c", _GROW])
    # periodic PSS only at tick 0 (before the allocation): growth must trigger a reading
    with TreeSampler(proc.pid, interval=0.05, pss_every=10**6) as sampler:
        assert proc.wait(timeout=30) == 0
    usage = sampler.result
    assert usage.peak_rss_mib > 180
    assert usage.peak_pss_mib > 180  # read while the 200 MiB were resident
    assert 2 <= usage.pss_samples < usage.samples  # growth readings, not every tick


def test_a_flat_tree_costs_no_extra_pss_reading():
    # The child says when its interpreter has started: on a loaded machine start-up can
    # outlast several ticks, and its growth would rightly trigger readings.
    idle = "import sys, time; print('ready', flush=True); time.sleep(1.0)"
    proc = subprocess.Popen([sys.executable, "-c", idle], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    with TreeSampler(proc.pid, interval=0.05, pss_every=10**6) as sampler:
        proc.wait(timeout=30)
    proc.stdout.close()
    # the first tick reads PSS; an idle interpreter's RSS stays within 2% after it
    assert sampler.result.pss_samples <= 3 < sampler.result.samples
