"""Fast Gaussian noise on the CPU: a ziggurat sampler compiled with numba (opt-in).

Why: a DP-SGD step on a mid-size model draws one N(0, σ²C²) value per parameter, and
torch's CPU generator is a scalar Mersenne Twister: 582,026 draws (FedAvgCNN) take about
as long as the step's forward pass, ~35% of a W2 step (benchmarks/README.md). This
sampler makes the same-distribution draws several times faster (measured in
benchmarks/README.md, "Gaussian noise"), with its own documented stream.

``privacy.noise_sampler: ziggurat`` selects it. A client's stream is then a
`ZigguratGenerator`, a `raydpfl.privacy.noise.counter_noise.CounterNoiseGenerator`: still a
`torch.Generator` seeded exactly as before (so Poisson sampling and every other draw an
algorithm makes from it are unchanged), which `raydpfl.privacy.per_sample.dpsgd`'s Gaussian
functions recognise. The default (``torch``) is untouched, so existing runs keep their
bits. ``boxmuller`` (`raydpfl.privacy.noise.boxmuller`) is faster still on SIMD CPUs.

Stream format, per call (one noise tensor of n values):

1. ``w``: one draw of ``Tensor.random_`` (an integer in [0, 2**63)) from the client's
   generator: the only draw the call takes from it, so the torch stream advances by
   the same amount whatever the tensor's size;
2. two counter-based SplitMix64 streams (Steele, Lea & Flood 2014): word k of a stream
   with key K is mix(K + k·γ), γ = 0x9E3779B97F4A7C15, mix = SplitMix64's output
   function; the main key is mix(w + γ), the fix-up key mix(w XOR 0xD1B54A32D192ED03);
3. value i (row-major) makes its first ziggurat attempt with word i + 1 of the main
   stream: the 256-layer ziggurat of Marsaglia and Tsang (2000, "The Ziggurat Method for
   Generating Random Variables") with Doornik's (2005) fix: the word gives the layer
   (bits 0–7), the sign (bit 8) and a 53-bit uniform (bits 11–63), so layer and value
   are independent. An attempt inside its layer's rectangle (~98.5%) is the value;
4. the other values, in position order, are finished with consecutive words of the
   fix-up stream: the wedge test (one word), the tail beyond R = 3.6541528853610088 by
   Marsaglia's (1964) exact method (two words per try, uniforms in (0, 1)), or a fresh
   attempt (one word: layer, sign, uniform) after a rejection;
5. the value is computed in float64, multiplied by the std and rounded once to the
   tensor's dtype.

Counter-based words make the first pass free of serial dependencies (twice torch's
speed on one core here; benchmarks/README.md, "Gaussian noise").

The output is an exact sampler of N(0, std²) up to the 53-bit uniforms (the ziggurat
is a rejection method, not an approximation). Like torch's generator it is a seeded
PRNG: reproducible, not hardened against floating-point attacks (use
``privacy.secure_noise`` for a released model). Tested in
tests/privacy/test_ziggurat.py: moments, a Kolmogorov–Smirnov test, the tail mass,
independence across derived streams and lags, and the one-draw-per-call contract.
"""

from __future__ import annotations

import math

import numpy as np

from raydpfl.privacy.noise.counter_noise import CounterNoiseGenerator, kernel_fill

#: The rightmost layer edge and the common layer area of the 256-layer ziggurat
#: (Marsaglia & Tsang 2000, Table 1, for f(x) = exp(-x²/2)).
R = 3.6541528853610088
V = 4.92867323399e-3
LAYERS = 256


def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Layer edges X[0..256] (X[0] = V/f(R), the base strip's width; X[1] = R; X[256] =
    0), the fast-path acceptance ratios X[i+1]/X[i] and f(X[i])."""
    x = np.zeros(LAYERS + 1)
    x[0] = V / math.exp(-0.5 * R * R)
    x[1] = R
    for i in range(2, LAYERS):
        x[i] = math.sqrt(-2.0 * math.log(V / x[i - 1] + math.exp(-0.5 * x[i - 1] ** 2)))
    return x, x[1:] / x[:-1], np.exp(-0.5 * x * x)


EDGES, RATIOS, DENSITY = _tables()


def _fill(out: np.ndarray, seed: int, std: float) -> None:
    fill = kernel_fill("raydpfl.privacy.noise._ziggurat_kernel", "ziggurat")
    fill(out, np.uint64(seed), float(std), EDGES, RATIOS, DENSITY)


class ZigguratGenerator(CounterNoiseGenerator):
    """A client's stream when ``privacy.noise_sampler`` is ``ziggurat``: a CPU
    `torch.Generator` (seeded by the caller as any client stream) whose Gaussian noise
    `raydpfl.privacy.per_sample.dpsgd` draws with `counter_noise.fill_normal_` (module
    docstring)."""

    sampler = "ziggurat"
    fill = staticmethod(_fill)
