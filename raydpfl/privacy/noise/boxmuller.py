"""Fast Gaussian noise on the CPU: a vectorised Box–Muller sampler compiled with numba
(opt-in, ``privacy.noise_sampler: boxmuller``).

Why: a DP-SGD step on a mid-size model draws one N(0, σ²C²) value per parameter, and
torch's CPU generator is a scalar Mersenne Twister (582,026 draws for FedAvgCNN take
about 2 ms, a third of a W2 step). The ziggurat (`raydpfl.privacy.noise.ziggurat`) gains
1.3×: its table lookups and rejections keep it scalar. Box–Muller needs neither: every
value is the same branch-free arithmetic on two counter-based words, which the compiler
turns into SIMD code (benchmarks/README.md, "Gaussian noise", has the figures).

A client's stream is a `BoxMullerGenerator` (a `raydpfl.privacy.noise.counter_noise`
stream: seeded as the default one, so Poisson sampling and every other draw are
unchanged). Stream format, per call (one noise tensor of n values):

1. ``w``: one ``Tensor.random_`` draw (an integer in [0, 2**63)) from the client's
   torch generator, the only draw the call takes from it;
2. a counter-based SplitMix64 stream (Steele, Lea & Flood 2014): word k of the stream
   with key K is mix(K + k·γ), γ = 0x9E3779B97F4A7C15, mix = SplitMix64's output
   function; the key is mix(w + γ);
3. pair j = 0, 1, … takes words 2j + 1 and 2j + 2: u = (bits 11–63 of the first + ½)·2⁻⁵³
   in (0, 1), t = (bits 11–63 of the second)·2⁻⁵³ in [0, 1), and (Box & Muller 1958)
   ρ = √(−2 ln u), z₁ = ρ·cos 2πt, z₂ = ρ·sin 2πt: two independent N(0, 1) values;
4. with p = ⌊n/2⌋, value j (row-major) is pair j's z₁ for j < p and pair (j − p)'s z₂
   for p ≤ j < 2p (so both halves are written contiguously); an odd n's last value is
   pair p's z₁;
5. float64 tensors: each value is computed in float64 as (std·ρ)·cos 2πt or
   (std·ρ)·sin 2πt. float32 tensors (model parameters, hence the noise of nearly every
   run): the arithmetic is float32, with u the 53-bit uniform above rounded once to
   float32, t = (bits 40–63 of the second word)·2⁻²⁴ (24 bits: float32's precision),
   std rounded to float32 and the float32 polynomials of `_boxmuller_kernel`
   (`ln32`, `cos_sin_2pi32`); twice the vector lanes, 0.54 instead of 0.94 ms per
   582,026 values. A float32 value differs from the float64 one of the same call by
   at most ~4e-7·ρ·std (the angle's last bits and float32 rounding).

Stream change (2026-11-27): before, float32 tensors got the float64 value rounded once
(step 5's float64 path); runs with ``noise_sampler: boxmuller`` on float32 models draw
different noise since (same distribution, same bounds). ``torch`` and ``ziggurat``
streams did not change.

Exactness: Box–Muller is an exact transform of two uniforms; here ln, sin and cos are
polynomials accurate to ~1e-14 relative in float64 and to a few float32 units in float32
(tested against numpy). The 53-bit u bounds |z| by √(2·54·ln 2) = 8.65 in both paths
(float32 keeps u's exponent: the smallest u, 2⁻⁵⁴, is a float32): the normal mass
beyond it is 5e-18 (torch's own CPU Box–Muller, on 24-bit uniforms, stops at 5.77,
mass 8e-9). Like torch's generator it is a seeded PRNG: reproducible, not hardened
against floating-point attacks (use ``privacy.secure_noise`` for a released model). No
fast-math: the bits are the same on every x86-64 CPU whatever its vector width. Tested
in tests/privacy/test_boxmuller.py and tests/privacy/test_counter_noise.py.
"""

from __future__ import annotations

import math

import numpy as np

from raydpfl.privacy.noise.counter_noise import CounterNoiseGenerator, kernel_fill

#: The largest |z| the 53-bit u can produce: √(−2 ln(2⁻⁵⁴)).
MAX_ABS = math.sqrt(2.0 * 54 * math.log(2.0))


def _kernel(kind: str, out: np.ndarray, seed: int, std: float, *factors: np.ndarray) -> None:
    """Runs kernel `kind` ("fill", "add" or "add_low_rank", the last with its factors
    g, a) for `out`'s dtype: the float32 path (`fill32`, ...) or the float64 one (step 5
    of the format)."""
    name = kind + "32" if out.dtype == np.float32 else kind
    kernel_fill("raydpfl.privacy.noise._boxmuller_kernel", "boxmuller", name)(
        out, np.uint64(seed), float(std), *factors
    )


def _fill(out: np.ndarray, seed: int, std: float) -> None:
    _kernel("fill", out, seed, std)


def _add(out: np.ndarray, seed: int, std: float) -> None:  # out + _fill's values
    _kernel("add", out, seed, std)


def _add_low_rank(out: np.ndarray, seed: int, std: float, g: np.ndarray, a: np.ndarray) -> None:
    """(out + Σ_b g[b]ᵀ a[b]) + _fill's values, `out` the flat q×p matrix, one pass."""
    _kernel("add_low_rank", out, seed, std, g, a)


class BoxMullerGenerator(CounterNoiseGenerator):
    """A client's stream when ``privacy.noise_sampler`` is ``boxmuller``: a CPU
    `torch.Generator` (seeded by the caller as any client stream) whose Gaussian noise
    `raydpfl.privacy.per_sample.dpsgd` draws with `counter_noise.fill_normal_` (module
    docstring)."""

    sampler = "boxmuller"
    fill = staticmethod(_fill)
    add = staticmethod(_add)
    add_low_rank = staticmethod(_add_low_rank)
