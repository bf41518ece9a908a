"""`tune_allocator`: glibc thresholds set once per process, opt-out by environment."""

import os
import subprocess
import sys

import pytest

from raydpfl.backends import allocator

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="mallopt is glibc's",
)


def _run(env_value: str | None) -> str:
    env = dict(os.environ)
    env.pop("RAYDPFL_MALLOC_TUNE", None)
    if env_value is not None:
        env["RAYDPFL_MALLOC_TUNE"] = env_value
    code = (
        "from raydpfl.backends.allocator import tune_allocator as t; "
        "print(t(), t())"  # the second call answers from the first
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@glibc
def test_thresholds_are_set_once_per_process():
    assert _run(None) == "True True"


@glibc
def test_environment_opts_out():
    assert _run("0") == "False False"
    assert _run("off") == "False False"


def test_thresholds_keep_a_step_working_set_in_the_heap():
    # W1's largest per-step blocks are a few MiB; an evaluation batch of 10,000 images
    # may exceed the mmap threshold and is then mapped and unmapped as before.
    assert allocator.MMAP_THRESHOLD >= 32 << 20
    assert allocator.TRIM_THRESHOLD >= allocator.MMAP_THRESHOLD
