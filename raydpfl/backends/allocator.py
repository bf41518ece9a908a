"""Allocator settings for long-lived training processes (glibc `mallopt`).

A DP-SGD step allocates and frees the same few large tensors every step (activations,
unfolded patches, per-sample weight gradients: megabytes each). With glibc's defaults
those blocks go back to the kernel when freed (`munmap`, or trimming the heap top) and
are faulted in again, zeroed page by page, on the next step. On W1 that is ~2.3 million
minor page faults per 400 steps and about a fifth of the process's time in the kernel
(measured: `benchmarks/README.md`, "Allocation"). Raising the mmap and trim thresholds
keeps freed blocks in the heap for the next step: the allocator reuses them, the
process's resident size stays at its working set's peak instead of oscillating.

Applied by the backends to the processes that train (the local backend's process, each
Ray worker actor and the server actor). ``RAYDPFL_MALLOC_TUNE=0`` leaves the allocator
alone. A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: Blocks up to this size come from the heap, not from their own mmap (glibc's default
#: is 128 KiB, raised dynamically up to 32 MiB as blocks are freed).
MMAP_THRESHOLD = 64 << 20
#: Free memory at the heap top kept for reuse before it is returned to the kernel.
TRIM_THRESHOLD = 256 << 20

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_applied: bool | None = None


def tune_allocator() -> bool:
    """Sets the thresholds once per process; True if they are in effect."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("RAYDPFL_MALLOC_TUNE", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _applied
