"""The compiled loops of `raydpfl.privacy.noise.boxmuller` (its docstring has the stream format):
`fill` for float64 tensors, `fill32` for float32 ones, and `add`/`add32`, which add the
same values into a tensor instead of writing them (out[j] + z_j, one rounding: the bits
of ``out + fill(...)``). `add_low_rank`/`add_low_rank32` first add a rank-B product
Σ_b g_b a_bᵀ into a matrix, then the values, in one pass over it (a small batch's
Linear weight update and its noise).

Every operation is branch-free IEEE arithmetic (no libm call, no fast-math, so no fused
multiply-adds), so LLVM vectorises the loops and the bits do not depend on the CPU's
vector width. ln and sin/cos are evaluated by the short polynomials below: in float64
accurate to a few units of float64's last place, in float32 (`ln32`, `cos_sin_2pi32`)
to a few units of float32's (tests/privacy/test_boxmuller.py checks them against numpy
and rebuilds `fill32`'s bits in numpy). `fill32` runs 16 float32 lanes per AVX-512
vector where `fill` runs 8 float64 ones: 0.54 against 0.94 ms for FedAvgCNN's 582,026
values on one core (benchmarks/README.md, "Gaussian noise")."""

from __future__ import annotations

import math

import numba
import numpy as np

from raydpfl.privacy.noise._splitmix import GOLDEN, INV53, mix, u64, word

f32 = np.float32

LN2 = 0.6931471805599453
SQRT2 = 1.4142135623730951
HALF_PI = 1.5707963267948966
MANTISSA = (1 << 52) - 1
EXPONENT_OF_ONE = 1023 << 52


@numba.njit(inline="always", error_model="numpy")
def ln(u):
    """ln u for a normal positive float64: u = m·2^e with m in [√½, √2), then
    ln m = 2·atanh(s), s = (m − 1)/(m + 1), |s| ≤ 0.172, by its series to s¹⁵ (the
    remainder is below 2e-14 relative)."""
    b = np.float64(u).view(np.int64)
    e = ((b >> 52) & 0x7FF) - 1023
    m = np.int64((b & MANTISSA) | EXPONENT_OF_ONE).view(np.float64)
    big = m > SQRT2
    m = m * 0.5 if big else m
    e = e + 1 if big else e
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    p = 1.0 / 15.0
    p = p * z + 1.0 / 13.0
    p = p * z + 1.0 / 11.0
    p = p * z + 1.0 / 9.0
    p = p * z + 1.0 / 7.0
    p = p * z + 1.0 / 5.0
    p = p * z + 1.0 / 3.0
    p = p * z + 1.0
    return np.float64(e) * LN2 + 2.0 * s * p


@numba.njit(inline="always", error_model="numpy")
def cos_sin_2pi(t):
    """(cos 2πt, sin 2πt) for t in [0, 1): the nearest quarter turn q, the rest
    θ = (4t − q)·π/2 in [−π/4, π/4] by Taylor series to θ¹⁵ and θ¹⁶ (remainders below
    3e-15), rotated by q quarter turns."""
    x4 = 4.0 * t
    q = np.int64(x4 + 0.5)
    th = (x4 - np.float64(q)) * HALF_PI
    z = th * th
    sp = -1.0 / 1307674368000.0
    sp = sp * z + 1.0 / 6227020800.0
    sp = sp * z - 1.0 / 39916800.0
    sp = sp * z + 1.0 / 362880.0
    sp = sp * z - 1.0 / 5040.0
    sp = sp * z + 1.0 / 120.0
    sp = sp * z - 1.0 / 6.0
    s = th + th * z * sp
    cp = 1.0 / 20922789888000.0
    cp = cp * z - 1.0 / 87178291200.0
    cp = cp * z + 1.0 / 479001600.0
    cp = cp * z - 1.0 / 3628800.0
    cp = cp * z + 1.0 / 40320.0
    cp = cp * z - 1.0 / 720.0
    cp = cp * z + 1.0 / 24.0
    cp = cp * z - 0.5
    c = 1.0 + z * cp
    q = q & 3
    swap = (q & 1) == 1
    x = s if swap else c
    y = c if swap else s
    x = -x if ((q + 1) & 2) != 0 else x  # quarter turns 1 and 2: cos < 0
    y = -y if (q & 2) != 0 else y  # quarter turns 2 and 3: sin < 0
    return x, y


@numba.njit(inline="always", error_model="numpy")
def pair(key, j, std):
    """Pair j's std·√(−2 ln u) and its angle's (cos, sin): u from word 2j + 1 (53 bits,
    in (0, 1)), the angle's turn t from word 2j + 2 (53 bits, in [0, 1))."""
    w1 = word(key, u64(2 * j) + u64(1))
    w2 = word(key, u64(2 * j) + u64(2))
    u = (np.float64(np.int64(w1 >> u64(11))) + 0.5) * INV53
    t = np.float64(np.int64(w2 >> u64(11))) * INV53
    c, s = cos_sin_2pi(t)
    return math.sqrt(-2.0 * ln(u)) * std, c, s


@numba.njit(inline="always", error_model="numpy")
def _loop(out, seed, std, accumulate, pair_of):
    """`fill` (accumulate False) or `add` (True) with the pair function `pair_of`
    (`pair` for float64, `pair32` for float32): the value layout of step 4."""
    key = mix(u64(seed) + u64(GOLDEN))
    n = out.shape[0]
    pairs = n // 2
    # cosines to out[0:pairs], sines to out[pairs:2·pairs]. (An offset written as
    # n − pairs stops LLVM from vectorising the loop: keep it `pairs`.) `accumulate` is
    # the same for the whole loop: LLVM unswitches it (two vector loops, same speed).
    for j in range(pairs):
        r, c, s = pair_of(key, j, std)
        out[j] = out[j] + r * c if accumulate else r * c
        out[pairs + j] = out[pairs + j] + r * s if accumulate else r * s
    if n > 2 * pairs:  # odd n: the last value is pair `pairs`'s cosine
        r, c, s = pair_of(key, pairs, std)
        out[n - 1] = out[n - 1] + r * c if accumulate else r * c


@numba.njit(cache=True, nogil=True, error_model="numpy")
def fill(out, seed, std):
    """Fills the 1-d array `out` with N(0, std²) (see `raydpfl.privacy.noise.boxmuller`)."""
    _loop(out, seed, std, False, pair)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def add(out, seed, std):
    """Adds `fill`'s values to the 1-d float64 array `out` in place."""
    _loop(out, seed, std, True, pair)


# ---- float32 -----------------------------------------------------------------------
# Constants are float64 literals rounded once to float32 (np.float32(x)); the numpy
# rebuild of the stream in the tests uses the same roundings.
SQRT2_F32 = f32(SQRT2)
LN2_F32 = f32(LN2)
HALF_PI_F32 = f32(HALF_PI)
INV24_F32 = f32(1.0 / 16777216.0)  # 2**-24


@numba.njit(inline="always", error_model="numpy")
def ln32(u):
    """ln u for a normal positive float32, in float32: u = m·2^e with m in [√½, √2),
    ln m = 2·atanh(s), s = (m − 1)/(m + 1), |s| ≤ 0.172, by its series to s⁹ (the
    remainder is below 3e-9 relative, under float32's 6e-8)."""
    b = f32(u).view(np.int32)
    e = ((b >> 23) & 0xFF) - 127
    m = np.int32((b & 0x7FFFFF) | (127 << 23)).view(np.float32)
    big = m > SQRT2_F32
    m = m * f32(0.5) if big else m
    e = e + 1 if big else e
    s = (m - f32(1.0)) / (m + f32(1.0))
    z = s * s
    p = f32(1.0 / 9.0)
    p = p * z + f32(1.0 / 7.0)
    p = p * z + f32(1.0 / 5.0)
    p = p * z + f32(1.0 / 3.0)
    p = p * z + f32(1.0)
    return f32(e) * LN2_F32 + f32(2.0) * s * p


@numba.njit(inline="always", error_model="numpy")
def cos_sin_2pi32(t):
    """(cos 2πt, sin 2πt) in float32 for t in [0, 1): as `cos_sin_2pi`, with the Taylor
    series to θ⁹ and θ¹⁰ (remainders below 3e-9)."""
    x4 = f32(4.0) * t
    q = np.int32(x4 + f32(0.5))
    th = (x4 - f32(q)) * HALF_PI_F32
    z = th * th
    sp = f32(1.0 / 362880.0)
    sp = sp * z - f32(1.0 / 5040.0)
    sp = sp * z + f32(1.0 / 120.0)
    sp = sp * z - f32(1.0 / 6.0)
    s = th + th * z * sp
    cp = f32(-1.0 / 3628800.0)
    cp = cp * z + f32(1.0 / 40320.0)
    cp = cp * z - f32(1.0 / 720.0)
    cp = cp * z + f32(1.0 / 24.0)
    cp = cp * z - f32(0.5)
    c = f32(1.0) + z * cp
    q = q & 3
    swap = (q & 1) == 1
    x = s if swap else c
    y = c if swap else s
    x = -x if ((q + 1) & 2) != 0 else x
    y = -y if (q & 2) != 0 else y
    return x, y


@numba.njit(inline="always", error_model="numpy")
def pair32(key, j, std):
    """Pair j in float32: u from word 2j + 1 (53 bits, in (0, 1), rounded once to
    float32), the turn t from the top 24 bits of word 2j + 2; std·√(−2 ln u) and the
    angle's (cos, sin)."""
    w1 = word(key, u64(2 * j) + u64(1))
    w2 = word(key, u64(2 * j) + u64(2))
    u = f32((np.float64(np.int64(w1 >> u64(11))) + 0.5) * INV53)
    t = f32(np.int32(w2 >> u64(40))) * INV24_F32
    c, s = cos_sin_2pi32(t)
    return np.sqrt(f32(-2.0) * ln32(u)) * std, c, s


@numba.njit(cache=True, nogil=True, error_model="numpy")
def fill32(out, seed, std):
    """Fills the 1-d float32 array `out` with N(0, std²) (`raydpfl.privacy.noise.boxmuller`)."""
    _loop(out, seed, f32(std), False, pair32)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def add32(out, seed, std):
    """Adds `fill32`'s values to the 1-d float32 array `out` in place: the noisy update
    p ← p + (−lr/B)·σC·z without a noise tensor
    (`raydpfl.privacy.per_sample.dpsgd.dp_sgd_step_`)."""
    _loop(out, seed, f32(std), True, pair32)


# ---- noise plus a low-rank product, one pass ----------------------------------------
@numba.njit(inline="always", error_model="numpy")
def _add_products(o, g, row, a, col):
    """o[t] += g[b, row]·a[b, col + t] for b = 0, 1, … in turn (one rounding per product
    and per sum). `o` is a stretch of one row of the matrix, in L1 while the B passes run."""
    m = o.shape[0]
    for b in range(a.shape[0]):
        gb = g[b, row]
        ab = a[b, col : col + m]
        for t in range(m):
            o[t] = o[t] + gb * ab[t]


@numba.njit(error_model="numpy")
def _add_pairs(o1, o2, key, j0, std, pair_of):
    """o1[t] += z₁ and o2[t] += z₂ of pair j0 + t: `_loop`'s add on two stretches (views,
    so LLVM sees non-negative indices from 0 and vectorises)."""
    for t in range(o1.shape[0]):
        r, c, s = pair_of(key, u64(j0) + u64(t), std)
        o1[t] = o1[t] + r * c
        o2[t] = o2[t] + r * s


@numba.njit(inline="always", error_model="numpy")
def _loop_low_rank(out, seed, std, g, a, pair_of):
    """out (the flat q×p matrix, row-major) ← (out + Σ_b g[b]ᵀ a[b]) + `fill`'s values,
    value by value: the pairs of `_loop` in stretches within which both halves' values
    stay in one row, each stretch's products added just before its noise."""
    key = mix(u64(seed) + u64(GOLDEN))
    n = out.shape[0]
    pairs = n // 2
    p = a.shape[1]
    j0 = 0
    while j0 < pairs:
        r1 = j0 // p  # the rows of value j0 and of value pairs + j0
        r2 = (pairs + j0) // p
        j1 = min((r1 + 1) * p, (r2 + 1) * p - pairs, pairs)
        o1 = out[j0:j1]
        o2 = out[pairs + j0 : pairs + j1]
        _add_products(o1, g, r1, a, j0 - r1 * p)
        _add_products(o2, g, r2, a, pairs + j0 - r2 * p)
        _add_pairs(o1, o2, key, j0, std, pair_of)
        j0 = j1
    if n > 2 * pairs:  # odd n: the last value is pair `pairs`'s cosine
        last = n - 1
        _add_products(out[last:], g, last // p, a, last - (last // p) * p)
        r, c, _ = pair_of(key, u64(pairs), std)
        out[last] = out[last] + r * c


@numba.njit(cache=True, nogil=True, error_model="numpy")
def add_low_rank(out, seed, std, g, a):
    """`add` after adding Σ_b g[b]ᵀ a[b] into `out`, the flat float64 q×p matrix
    (g: (B, q), a: (B, p)), in one pass: (out + Σ_b g_b a_b) + z, value by value."""
    _loop_low_rank(out, seed, std, g, a, pair)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def add_low_rank32(out, seed, std, g, a):
    """`add_low_rank` for float32 (`add32`'s values): a small batch's Linear weight
    update and its noise in one pass over the weight (`raydpfl.privacy.per_sample.dpsgd`)."""
    _loop_low_rank(out, seed, f32(std), g, a, pair32)
