"""Accounting for truncated Poisson samples (``privacy.batch_shape: fixed``).

The mechanism. One step draws a Poisson(q) sample S of the client's records D (each
record independently with probability q); if |S| > B it keeps a uniformly random subset
of exactly B of them (`raydpfl.privacy.per_sample.dpsgd.truncate_sample`); it releases
the sum of the kept records' contributions, each clipped to L2 norm C, plus
N(0, σ²C² I). Under add/remove-one-record adjacency this is dp-accounting's
``TruncatedSubsampledGaussianDpEvent(N, q, B, σ)``, whose N is the size of the *larger*
dataset of the adjacent pair. For a client with n records the pair is (D − {x}, D)
(N = n) or (D, D + {x}) (N = n + 1); the pair is fixed for the whole run, so the
client's ε is the larger of the two compositions (each at one N for every step).

Two accountings, by the ledger's accountant:

``pld`` — exact up to discretisation (`pld_epsilon`): dp-accounting's PLD accountant
composes the truncated events (its `from_truncated_subsampled_gaussian_mechanism`: with
probability P[Bin(N−1, q) ≥ B] the record's presence also displaces another record, a
replace-one Gaussian of sensitivity 2C at the conditional sampling rate; otherwise the
untruncated subsampled Gaussian), at N = n and at N = n + 1, with the rest of the
history, and takes the larger ε.

``rdp``, ``dp_rdp``, ``prv`` — a coupling bound (`coupling_epsilon`), proved here. Couple
the truncated mechanism M_B with the untruncated M on the same Poisson draws and noise:
their outputs differ only in a step where truncation happens, which on a dataset of at
most n + 1 records has probability at most η = P[Bin(n + 1, q) > B], whatever happened
in earlier steps (the draws are independent of the past). Over the T truncated steps of
a history the whole transcripts differ with probability at most H = Σ_t η_t (union
bound), so TV(M_B(D), M(D)) ≤ H for both datasets of the pair. If the untruncated
history is (ε, δ₀)-DP then for every event E

    P[M_B(D) ∈ E] ≤ P[M(D) ∈ E] + H ≤ e^ε P[M(D') ∈ E] + δ₀ + H
                 ≤ e^ε P[M_B(D') ∈ E] + δ₀ + (1 + e^ε) H,

so the truncated history is (ε, δ₀ + (1 + e^ε) H)-DP. The ledger's ε at δ is the least
ε with ε ≥ ε_M(δ − (1 + e^ε) H) (ε_M: the accountant's ε of the untruncated history),
found by a fixed-point iteration and returned only once it satisfies that inequality
(∞ when (1 + e^ε) H reaches δ). It is tight when truncation is rare (a cap some
standard deviations above q·n, the use it is meant for) and useless when it is common;
the PLD accountant handles both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "coupling_epsilon",
    "pld_epsilon",
    "truncated_event",
    "truncation_probability",
]

#: Fixed-point iterations of `coupling_epsilon` (it converges in two or three when
#: (1 + e^ε) H is small beside δ, the only case where the bound is finite and useful).
_MAX_ITERATIONS = 50


def truncation_probability(dataset_size: int, sampling_rate: float, max_batch_size: int) -> float:
    """η = P[Bin(n + 1, q) > B]: the probability that a Poisson(q) sample of a dataset of
    at most n + 1 records (either dataset of an adjacent pair around the client's n) is
    truncated at B. 0 when B ≥ n + 1."""
    if max_batch_size >= dataset_size + 1:
        return 0.0
    from scipy import stats

    return float(stats.binom.sf(max_batch_size, dataset_size + 1, sampling_rate))


def truncated_event(
    sigma: float, q: float, max_batch_size: int, dataset_size: int, *, added: bool
) -> Any:
    """dp-accounting's event of one truncated step, for the pair that removes one of the
    client's records (N = n) or adds one (`added`, N = n + 1)."""
    import dp_accounting

    return dp_accounting.TruncatedSubsampledGaussianDpEvent(
        dataset_size=dataset_size + int(added),
        sampling_probability=q,
        truncated_batch_size=max_batch_size,
        noise_multiplier=sigma,
    )


def pld_epsilon(
    gauss: Sequence[tuple[float, float, int]],
    laplace: Sequence[tuple[float, int]],
    truncated: Sequence[tuple[float, float, int, int, int]],
    delta: float,
) -> float:
    """ε at δ of a history with truncated steps, by dp-accounting's PLD accountant: the
    larger of the compositions at N = n and at N = n + 1 (module docstring)."""
    import dp_accounting
    from dp_accounting import pld

    worst = 0.0
    for added in (False, True):
        accountant = pld.PLDAccountant()
        for sigma, q, steps in gauss:
            accountant.compose(
                dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                steps,
            )
        for scale, steps in laplace:
            accountant.compose(dp_accounting.LaplaceDpEvent(scale), steps)
        for sigma, q, cap, n, steps in truncated:
            accountant.compose(truncated_event(sigma, q, cap, n, added=added), steps)
        eps = float(accountant.get_epsilon(delta))
        if math.isnan(eps):
            return math.inf
        worst = max(worst, eps)
    return worst


def coupling_epsilon(
    untruncated_epsilon: Callable[[float], float],
    truncation_mass: float,
    delta: float,
) -> float:
    """The least ε (up to the iteration's float rounding) with
    ε ≥ ε_M(δ − (1 + e^ε) H), where `untruncated_epsilon` is ε_M (the accountant's ε of
    the history with every truncated step replaced by its untruncated one) and
    `truncation_mass` is H = Σ η_t (module docstring). ∞ when no ε satisfies it."""
    if truncation_mass <= 0.0:
        return untruncated_epsilon(delta)

    def slack(eps: float) -> float:
        if eps > 700.0:
            return math.inf
        return (1.0 + math.exp(eps)) * truncation_mass

    eps = 0.0
    for _ in range(_MAX_ITERATIONS):
        rest = delta - slack(eps)
        if not rest > 0.0:
            return math.inf
        nxt = untruncated_epsilon(rest)
        if not math.isfinite(nxt):
            return math.inf
        if nxt <= eps:  # eps satisfies eps >= ε_M(δ − (1 + e^eps) H): a valid ε
            return eps
        # ε_M is decreasing in δ, the slack increasing in ε: the iterates increase to the
        # least fixed point; a hair above it satisfies the inequality.
        eps = nxt if nxt - eps > 1e-12 * max(1.0, nxt) else nxt * (1 + 1e-9) + 1e-12
    return math.inf
