"""Counter-based SplitMix64 words for the compiled noise kernels (`_ziggurat_kernel`,
`_boxmuller_kernel`); numba is imported only when a kernel is."""

from __future__ import annotations

import numba

u64 = numba.uint64
GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's Weyl increment
INV53 = 1.0 / 9007199254740992.0  # 2**-53


@numba.njit(cache=True, nogil=True, inline="always")
def mix(z):
    """SplitMix64's output function (Steele, Lea & Flood 2014; Vigna's constants)."""
    z = (z ^ (z >> u64(30))) * u64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> u64(27))) * u64(0x94D049BB133111EB)
    return z ^ (z >> u64(31))


@numba.njit(cache=True, nogil=True, inline="always")
def word(key, counter):
    """The `counter`-th (1-based) SplitMix64 output of the stream whose state starts at
    `key`: computable for any counter, so a pass over them has no serial dependency."""
    return mix(key + counter * u64(GOLDEN))
