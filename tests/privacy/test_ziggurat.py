"""The ziggurat Gaussian sampler (privacy.noise_sampler: ziggurat): its tables and the
slow paths (the tail beyond R, the wedges) that only it has.

What every counter-based sampler must do (normality, independence, the one-draw-per-call
contract, routing) is tested for it in test_counter_noise.py. Each statistical check uses
fixed seeds and a bound whose false-failure probability for a correct N(0, 1) sampler is
stated (≤ 1e-6), so a failure means a wrong distribution, not bad luck.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from raydpfl.privacy.noise import counter_noise, ziggurat
from raydpfl.privacy.noise.ziggurat import ZigguratGenerator

N = 1_000_000
Z_BOUND = 5.0  # two-sided normal probability 5.7e-7


def _gen(seed: int) -> ZigguratGenerator:
    g = ZigguratGenerator()
    g.manual_seed(seed)
    return g


def _draws(seed: int, n: int = N, std: float = 1.0) -> np.ndarray:
    return counter_noise.normal((n,), std, _gen(seed), torch.float64).numpy()


def test_tables_close_the_ziggurat():
    """256 layers of equal area V between x[1] = R and x[256] = 0: the recursion's last
    step lands on f = 1 (to the constants' 12 digits), and the edges decrease."""
    x = ziggurat.EDGES
    assert x[1] == ziggurat.R and x[-1] == 0.0
    assert np.all(np.diff(x[1:]) < 0)
    top = ziggurat.V / x[255] + math.exp(-0.5 * x[255] ** 2)
    assert top == pytest.approx(1.0, abs=1e-9)
    # the base strip: rectangle R·f(R) plus the tail mass beyond R equals V
    tail = math.sqrt(math.pi / 2) * math.erfc(ziggurat.R / math.sqrt(2))
    assert ziggurat.R * math.exp(-0.5 * ziggurat.R**2) + tail == pytest.approx(
        ziggurat.V, rel=1e-9
    )
    np.testing.assert_array_equal(ziggurat.RATIOS, x[1:] / x[:-1])
    np.testing.assert_array_equal(ziggurat.DENSITY, np.exp(-0.5 * x * x))


def test_the_tail_and_the_wedges_carry_their_mass():
    """Counts in bands that only the slow paths produce: beyond R (the tail method) and
    near the layer edges (the wedges), against the normal's probabilities, each within 5
    binomial standard deviations, over 4M draws."""
    x = np.concatenate([_draws(seed) for seed in (2, 3, 4, 5)])
    n = x.size
    bands = [(ziggurat.R, np.inf), (3.0, ziggurat.R), (2.0, 2.2), (0.0, 0.05)]
    # between consecutive layer edges, where a layer's attempts go to its wedge test
    bands += [(ziggurat.EDGES[i + 1], ziggurat.EDGES[i]) for i in (1, 10, 100, 250)]
    for lo, hi in bands:
        p = 2 * (stats.norm.cdf(hi) - stats.norm.cdf(lo))
        count = np.count_nonzero((np.abs(x) >= lo) & (np.abs(x) < hi))
        assert abs(count - n * p) / math.sqrt(n * p * (1 - p)) < Z_BOUND, (lo, hi)
