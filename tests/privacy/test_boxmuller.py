"""The Box–Muller Gaussian sampler (privacy.noise_sampler: boxmuller): its kernel's
ln and sin/cos polynomials against numpy, the stream format of
raydpfl/privacy/noise/boxmuller.py's docstring rebuilt independently (SplitMix64 in Python
integers, the transform in numpy), its bound on |z|, its tails and the independence of a
pair's two values.

What every counter-based sampler must do (normality, independence across streams, the
one-draw-per-call contract, routing) is tested for it in test_counter_noise.py. Each
statistical check uses fixed seeds and a bound whose false-failure probability for a
correct N(0, 1) sampler is stated (≤ 1e-6), so a failure means a wrong distribution,
not bad luck.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
import torch
from scipy import stats

from raydpfl.privacy.noise import _boxmuller_kernel as kernel
from raydpfl.privacy.noise import boxmuller, counter_noise
from raydpfl.privacy.noise._boxmuller_kernel import cos_sin_2pi, cos_sin_2pi32, ln, ln32
from raydpfl.privacy.noise.boxmuller import BoxMullerGenerator

Z_BOUND = 5.0  # two-sided normal probability 5.7e-7
MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _each(fn):
    """A numba loop applying the kernel function `fn` to every element of an array."""

    @numba.njit
    def each(u):
        out = np.empty_like(u)
        for i in range(u.shape[0]):
            out[i] = fn(u[i])
        return out

    return each


def _each_pair(fn):
    """A numba loop applying `fn` (→ (cos, sin)) to every element; two arrays."""

    @numba.njit
    def each(t):
        c = np.empty_like(t)
        s = np.empty_like(t)
        for i in range(t.shape[0]):
            x, y = fn(t[i])
            c[i] = x
            s[i] = y
        return c, s

    return each


_ln_all, _ln32_all = _each(ln), _each(ln32)
_cos_sin_all, _cos_sin32_all = _each_pair(cos_sin_2pi), _each_pair(cos_sin_2pi32)


def _gen(seed: int) -> BoxMullerGenerator:
    g = BoxMullerGenerator()
    g.manual_seed(seed)
    return g


def _draws(seed: int, n: int, std: float = 1.0, dtype=torch.float64) -> np.ndarray:
    return counter_noise.normal((n,), std, _gen(seed), dtype).numpy()


# --- the kernel's elementary functions ----------------------------------------------


def test_ln_matches_numpy_over_the_uniforms_it_takes():
    """u = (k + ½)·2⁻⁵³, k a 53-bit integer: the sampler's uniforms, over the whole of
    (0, 1), plus a spread of tiny ones and the two ends."""
    rng = np.random.default_rng(0)
    k = rng.integers(0, 1 << 53, size=1_000_000, dtype=np.int64)
    u = (k.astype(np.float64) + 0.5) * 2.0**-53
    tiny = np.ldexp(rng.uniform(0.5, 1.0, 10_000), rng.integers(-54, -1, 10_000))
    ends = np.array([2.0**-54, 1.5 * 2.0**-54, 2.0**-53, 0.5, math.sqrt(0.5), 1 - 2.0**-53])
    ends = np.concatenate([ends, np.nextafter(ends, 0), np.nextafter(ends, 1)])
    ends = ends[(ends >= 2.0**-54) & (ends < 1)]
    near_sqrt2_boundary = np.sqrt(0.5) * 2.0 ** -np.arange(0, 54, dtype=np.float64)
    for x in (u, tiny, ends, near_sqrt2_boundary):
        got, want = _ln_all(x), np.log(x)
        assert np.all(np.abs(got - want) <= 1e-13 * np.abs(want)), x[
            np.argmax(np.abs(got - want) / np.abs(want))
        ]
    assert _ln_all(np.array([2.0**-54]))[0] == -54 * math.log(2)


def test_cos_sin_2pi_matches_numpy():
    rng = np.random.default_rng(1)
    t = rng.integers(0, 1 << 53, size=1_000_000, dtype=np.int64).astype(np.float64) * 2.0**-53
    quarters = np.arange(9) / 8  # multiples of an eighth turn: the rotation's seams
    seams = np.concatenate([quarters, quarters - 2.0**-53, quarters + 2.0**-53])
    special = np.array([0.0, 0.125, 0.25 - 2.0**-53, 0.5, 0.75, 1 - 2.0**-53])
    for x in (t, special, seams[(seams >= 0) & (seams < 1)]):
        c, s = _cos_sin_all(x)
        assert np.max(np.abs(c - np.cos(2 * np.pi * x))) < 1e-14
        assert np.max(np.abs(s - np.sin(2 * np.pi * x))) < 1e-14
        assert np.all(np.abs(c) <= 1) and np.all(np.abs(s) <= 1)
    c, s = _cos_sin_all(np.array([0.0, 0.25, 0.5, 0.75]))
    np.testing.assert_array_equal(c, [1.0, 0.0, -1.0, 0.0])
    np.testing.assert_array_equal(np.abs(s), [0.0, 1.0, 0.0, 1.0])
    assert s[1] == 1.0 and s[3] == -1.0


def test_ln32_matches_numpy_to_float32_precision():
    """The float32 path's uniforms are the 53-bit ones rounded to float32; the error is
    a few float32 units (2⁻²⁴ = 6e-8) relative, and exact at the smallest u."""
    rng = np.random.default_rng(2)
    k = rng.integers(0, 1 << 53, size=1_000_000, dtype=np.int64)
    u = ((k.astype(np.float64) + 0.5) * 2.0**-53).astype(np.float32)
    tiny = np.ldexp(rng.uniform(0.5, 1.0, 10_000), rng.integers(-54, -1, 10_000))
    near_one = 1 - np.arange(1, 2000) * 2.0**-24
    boundary = np.sqrt(0.5) * 2.0 ** -np.arange(0, 54, dtype=np.float64)
    for x in (u, tiny, near_one, boundary):
        x = x.astype(np.float32)
        x = x[(x > 0) & (x < 1)]
        got, want = _ln32_all(x).astype(np.float64), np.log(x.astype(np.float64))
        assert np.all(np.abs(got - want) <= 3e-7 * np.abs(want))
    assert _ln32_all(np.array([2.0**-54], np.float32))[0] == np.float32(-54) * kernel.LN2_F32
    assert _ln32_all(np.array([1.0], np.float32))[0] == 0.0  # u rounded up to 1: ρ = 0


def test_cos_sin_2pi32_matches_numpy_to_float32_precision():
    t = np.arange(1 << 24, dtype=np.float32) * np.float32(2.0**-24)  # every 24-bit turn
    c, s = _cos_sin32_all(t)
    angle = 2 * np.pi * t.astype(np.float64)
    assert np.max(np.abs(c - np.cos(angle))) < 2e-7
    assert np.max(np.abs(s - np.sin(angle))) < 2e-7
    assert np.all(np.abs(c) <= 1) and np.all(np.abs(s) <= 1)
    c, s = _cos_sin32_all(np.array([0.0, 0.25, 0.5, 0.75], np.float32))
    np.testing.assert_array_equal(c, [1.0, 0.0, -1.0, 0.0])
    np.testing.assert_array_equal(s, [0.0, 1.0, 0.0, -1.0])


# --- the stream format, rebuilt from the docstring -------------------------------------


def _mix(z: int) -> int:
    """SplitMix64's output function on a Python int (mod 2⁶⁴)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _reference_pair(w: int, j: int, std: float) -> tuple[float, float]:
    """Pair j's (z₁, z₂) of the call keyed by the torch draw `w` (docstring, steps 2–5)."""
    key = _mix((w + GAMMA) & MASK)
    w1 = _mix((key + (2 * j + 1) * GAMMA) & MASK)
    w2 = _mix((key + (2 * j + 2) * GAMMA) & MASK)
    u = ((w1 >> 11) + 0.5) * 2.0**-53
    t = (w2 >> 11) * 2.0**-53
    r = std * np.sqrt(-2.0 * np.log(u))
    return r * np.cos(2 * np.pi * t), r * np.sin(2 * np.pi * t)


F32 = np.float32


def _reference_pair32(w: int, j: int, std: float) -> tuple[np.float32, np.float32]:
    """Pair j's float32 (z₁, z₂) (docstring, step 5's float32 path), rebuilt operation
    by operation in numpy float32 (each op rounded once, as the kernel's)."""
    key = _mix((w + GAMMA) & MASK)
    w1 = _mix((key + (2 * j + 1) * GAMMA) & MASK)
    w2 = _mix((key + (2 * j + 2) * GAMMA) & MASK)
    u = F32((float(w1 >> 11) + 0.5) * 2.0**-53)
    t = F32(w2 >> 40) * F32(2.0**-24)
    # ln u: u = m·2^e, m in [√½, √2), 2·s·(1 + z/3 + z²/5 + z³/7 + z⁴/9)
    m, e = np.frexp(u)  # m in [½, 1)
    m, e = F32(m * F32(2.0)), int(e) - 1
    if m > F32(math.sqrt(2.0)):
        m, e = m * F32(0.5), e + 1
    s = (m - F32(1.0)) / (m + F32(1.0))
    z = s * s
    p = F32(1.0 / 9.0)
    for coef in (1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0, 1.0):
        p = p * z + F32(coef)
    log_u = F32(e) * F32(math.log(2.0)) + F32(2.0) * s * p
    r = np.sqrt(F32(-2.0) * log_u) * F32(std)
    # cos, sin 2πt: nearest quarter turn q, θ in [−π/4, π/4]
    x4 = F32(4.0) * t
    q = int(x4 + F32(0.5))
    th = (x4 - F32(q)) * F32(math.pi / 2)
    z = th * th
    sp = F32(1.0 / 362880.0)
    for coef in (-1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0):
        sp = sp * z + F32(coef)
    sin_th = th + th * z * sp
    cp = F32(-1.0 / 3628800.0)
    for coef in (1.0 / 40320.0, -1.0 / 720.0, 1.0 / 24.0, -0.5):
        cp = cp * z + F32(coef)
    cos_th = F32(1.0) + z * cp
    c, sn = [(cos_th, sin_th), (-sin_th, cos_th), (-cos_th, -sin_th), (sin_th, -cos_th)][q & 3]
    return r * c, r * sn


def test_float32_values_are_the_documented_float32_arithmetic_bit_for_bit():
    """float32 tensors: the bits of step 5's float32 path (an independent numpy
    rebuild), within ~4e-7·ρ of the float64 values of the same call."""
    for seed, p, std in ((0, 40, 1.0), (31, 7, 2.5), (32, 1, 0.3), (33, 0, 1.0)):
        n = 2 * p + 1
        out = _draws(seed, n, std, torch.float32)
        w = int(
            torch.empty((), dtype=torch.int64).random_(
                generator=torch.Generator().manual_seed(seed)
            )
        )
        want = np.empty(n, np.float32)
        for j in range(p):
            want[j], want[p + j] = _reference_pair32(w, j, std)
        want[n - 1] = _reference_pair32(w, p, std)[0]
        np.testing.assert_array_equal(out, want)
        wide = _draws(seed, n, std)
        assert np.all(np.abs(out - wide) <= 5e-7 * std * boxmuller.MAX_ABS)


def test_the_values_follow_the_documented_stream_format():
    """An n = 2p + 1 tensor: value j is pair j's cosine, value p + j its sine, the last
    value pair p's cosine; the key is the one ``random_`` draw of the torch stream."""
    for seed, p, std in ((0, 40, 1.0), (31, 7, 2.5), (32, 1, 0.3), (33, 0, 1.0)):
        n = 2 * p + 1
        out = _draws(seed, n, std)
        w = int(
            torch.empty((), dtype=torch.int64).random_(
                generator=torch.Generator().manual_seed(seed)
            )
        )
        want = np.empty(n)
        for j in range(p):
            want[j], want[p + j] = _reference_pair(w, j, std)
        want[n - 1] = _reference_pair(w, p, std)[0]
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-13 * std)
    # an even n has no extra cosine: the halves are pairs 0..p-1 exactly
    out = _draws(34, 6)
    w = int(
        torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(34))
    )
    pairs = [_reference_pair(w, j, 1.0) for j in range(3)]
    np.testing.assert_allclose(
        out, [z for z, _ in pairs] + [z for _, z in pairs], rtol=1e-12, atol=1e-13
    )


DTYPES = pytest.mark.parametrize("dtype", [torch.float64, torch.float32])


@DTYPES
def test_the_bits_do_not_depend_on_the_loops_remainder(dtype):
    """Pair j is a function of (key, j) only: tensors of n and n + 2 values (whatever the
    vector loop's remainder) agree on pair j's cosine at index j and on its sine; an odd
    tensor's last value is the cosine that the next even size puts at index p."""
    for n in (1, 2, 3, 5, 8, 15, 16, 17, 63, 64, 1001):
        p = n // 2
        a, b = _draws(40, n, 1.7, dtype), _draws(40, n + 2, 1.7, dtype)
        np.testing.assert_array_equal(a[:p], b[:p])
        np.testing.assert_array_equal(a[p : 2 * p], b[p + 1 : 2 * p + 1])
        if n % 2:
            assert a[-1] == _draws(40, n + 1, 1.7, dtype)[p]


@DTYPES
@pytest.mark.parametrize(
    ("q", "p", "b"),
    [(7, 5, 3), (3, 1, 2), (1, 9, 1), (513, 64, 3), (10, 33, 0), (1, 1, 2), (4, 4, 6)],
)
def test_add_low_rank_is_the_product_then_the_values_bit_for_bit(dtype, q, p, b):
    """`add_low_rank`: value i of the q×p matrix becomes (out_i + Σ_b g[b, row]·a[b, col],
    b in turn) + z_i with z the values `fill` draws for the same seed, bit for bit (a
    numpy rebuild), whatever the shape: odd sizes, a half that ends mid-row, one row,
    one column, an empty batch."""
    np_dtype = np.float32 if dtype == torch.float32 else np.float64
    rng = np.random.default_rng(q * 1000 + p * 10 + b)
    out = rng.standard_normal(q * p).astype(np_dtype)
    g = rng.standard_normal((b, q)).astype(np_dtype)
    a = rng.standard_normal((b, p)).astype(np_dtype)
    want = out.reshape(q, p).copy()
    for k in range(b):
        want = want + g[k][:, None] * a[k][None, :]
    z = np.empty(q * p, np_dtype)
    boxmuller.BoxMullerGenerator.fill(z, 77, 0.3)
    want = want.reshape(-1) + z
    got = out.copy()
    boxmuller.BoxMullerGenerator.add_low_rank(got, 77, 0.3, g, a)
    np.testing.assert_array_equal(got, want)


# --- the bound on |z|, the tails, the two halves of a pair -----------------------------


@DTYPES
def test_the_largest_value_is_bounded_by_max_abs(dtype):
    assert math.sqrt(-2 * math.log(2.0**-54)) == boxmuller.MAX_ABS
    assert 8.65 < boxmuller.MAX_ABS < 8.66
    # the smallest uniform, (0 + ½)·2⁻⁵³, gives exactly that radius in the kernel; in
    # float32 that radius rounded (u = 2⁻⁵⁴ is a float32)
    assert math.sqrt(-2.0 * _ln_all(np.array([2.0**-54]))[0]) == boxmuller.MAX_ABS
    rho32 = np.sqrt(np.float32(-2.0) * _ln32_all(np.array([2.0**-54], np.float32))[0])
    assert abs(rho32 - boxmuller.MAX_ABS) <= 2**-20
    bound = boxmuller.MAX_ABS if dtype == torch.float64 else float(rho32) * (1 + 2**-22)
    x = np.concatenate([_draws(seed, 1_000_000, 1.0, dtype) for seed in (50, 51)])
    assert np.max(np.abs(x)) <= bound
    assert np.max(np.abs(_draws(52, 100_000, 3.0, dtype))) <= 3.0 * bound * (1 + 2**-22)


@DTYPES
def test_the_tails_carry_their_mass(dtype):
    """Counts in bands of |z| over 4M draws, against the normal's probabilities, each
    within 5 binomial standard deviations (the far tail comes from the smallest u)."""
    x = np.concatenate([_draws(seed, 1_000_000, 1.0, dtype) for seed in (60, 61, 62, 63)])
    n = x.size
    for lo, hi in ((4.0, boxmuller.MAX_ABS), (3.0, 4.0), (2.0, 2.2), (0.0, 0.05)):
        p = 2 * (stats.norm.cdf(hi) - stats.norm.cdf(lo))
        count = np.count_nonzero((np.abs(x) >= lo) & (np.abs(x) < hi))
        assert abs(count - n * p) / math.sqrt(n * p * (1 - p)) < Z_BOUND, (lo, hi)


@DTYPES
def test_a_pairs_two_values_are_independent(dtype):
    """z₁ = ρ cos 2πt and z₂ = ρ sin 2πt share ρ: uncorrelated, and so are their squares
    (a wrong angle or radius shows there), over 500k pairs; and the angle is uniform
    (a chi-square over 64 sectors of atan2(z₂, z₁))."""
    n = 500_000
    x = _draws(70, 2 * n, 1.0, dtype).astype(np.float64)
    z1, z2 = x[:n], x[n:]
    assert abs(np.corrcoef(z1, z2)[0, 1]) * math.sqrt(n) < Z_BOUND
    assert abs(np.corrcoef(z1**2, z2**2)[0, 1]) * math.sqrt(n) < Z_BOUND
    # sign quadrants equally likely
    quadrant = (z1 > 0).astype(int) * 2 + (z2 > 0)
    assert stats.chisquare(np.bincount(quadrant, minlength=4)).pvalue > 1e-6
    sectors = np.floor((np.arctan2(z2, z1) / (2 * np.pi) % 1.0) * 64).astype(int)
    assert stats.chisquare(np.bincount(sectors, minlength=64)).pvalue > 1e-6
    # the radius: ρ² = z₁² + z₂² is exponential with mean 2 (a KS test, DKW bound)
    d = stats.kstest(z1**2 + z2**2, "expon", args=(0, 2)).statistic
    assert d < math.sqrt(math.log(2 / 1e-6) / 2) / math.sqrt(n)
