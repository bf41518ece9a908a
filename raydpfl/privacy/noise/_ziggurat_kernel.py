"""The compiled loops of `raydpfl.privacy.noise.ziggurat` (its docstring has the stream format).
Separate so that numba is imported, and the loops compiled or loaded from their on-disk
cache, only when the ziggurat sampler is used."""

from __future__ import annotations

import math

import numba
import numpy as np

from raydpfl.privacy.noise._splitmix import GOLDEN, INV53, mix, u64, word

FIXUP_SALT = 0xD1B54A32D192ED03  # separates the fix-up stream's key from the main key
TAIL_R = 3.6541528853610088  # ziggurat.R


@numba.njit(cache=True, nogil=True)
def fill(out, seed, std, edges, ratios, density):
    """Fills the 1-d array `out` with N(0, std²) (see `raydpfl.privacy.noise.ziggurat`)."""
    key = mix(u64(seed) + u64(GOLDEN))
    fix_key = mix(u64(seed) ^ u64(FIXUP_SALT))
    n = out.shape[0]
    rejected = np.empty((n + 7) // 8 * 8, np.uint8)  # pass 1 writes flags 0..n-1
    rejected[n:] = 0
    # pass 1: every value's first attempt, from word i + 1 of the main stream
    for i in range(n):
        r = word(key, u64(i) + u64(1))
        layer = r & u64(255)
        u = np.float64(np.int64(r >> u64(11))) * INV53
        signed = std - 2.0 * std * np.float64(np.int64((r >> u64(8)) & u64(1)))
        out[i] = u * edges[layer] * signed
        rejected[i] = np.uint8(u >= ratios[layer])
    # pass 2: the ~1.5% outside their layer's rectangle, in position order, each finished
    # with words of the fix-up stream (a wedge test, the tail, or fresh attempts)
    c = u64(0)
    blocks = rejected.view(np.uint64)  # 8 flags per load: most blocks have none
    for b in range(blocks.shape[0]):
        if blocks[b] == 0:
            continue
        for i in range(8 * b, min(8 * b + 8, n)):
            if rejected[i] != 0:
                c = _finish(out, i, key, fix_key, c, std, edges, ratios, density)


@numba.njit(cache=True, nogil=True)
def _finish(out, i, key, fix_key, c, std, edges, ratios, density):
    """Completes value i, rejected at its first attempt, with fix-up words from c + 1 on;
    returns the last fix-up word used."""
    r = word(key, u64(i) + u64(1))
    while True:
        layer = np.int64(r & u64(255))
        negative = (r >> u64(8)) & u64(1)
        u = np.float64(np.int64(r >> u64(11))) * INV53
        x = u * edges[layer]
        if u < ratios[layer]:
            break  # a fresh attempt inside its rectangle
        if layer == 0:  # the base strip beyond R: the tail, Marsaglia (1964), exact
            while True:
                c += u64(1)
                u1 = (np.float64(np.int64(word(fix_key, c) >> u64(11))) + 0.5) * INV53
                c += u64(1)
                u2 = (np.float64(np.int64(word(fix_key, c) >> u64(11))) + 0.5) * INV53
                tail = -math.log(u1) / TAIL_R
                if -2.0 * math.log(u2) > tail * tail:
                    break
            x = TAIL_R + tail
            break
        c += u64(1)  # the wedge between the rectangle and the density
        v = np.float64(np.int64(word(fix_key, c) >> u64(11))) * INV53
        lo = density[layer]
        hi = density[layer + 1]
        if lo + v * (hi - lo) < math.exp(-0.5 * x * x):
            break
        c += u64(1)  # rejected: a fresh attempt (new layer, sign and uniform)
        r = word(fix_key, c)
    out[i] = -x * std if negative else x * std
    return c
