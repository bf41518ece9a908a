"""The one-run audit's statistics: guesses from scores, and the ε lower bound.

Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023
(arXiv:2305.08846). The auditor's game (the paper's Algorithm 1):

1. m canaries; canary i is included independently with probability 1/2 (S_i = ±1);
2. the mechanism runs once; the auditor computes a score Y_i per canary;
3. it guesses T_i = +1 ("in") for the k₊ highest scores, T_i = −1 ("out") for the k₋
   lowest, and abstains on the rest: r = k₊ + k₋ guesses;
4. W = the number of correct guesses (T_i = S_i).

If the mechanism is ε-DP with respect to each canary (add/remove adjacency), W is
stochastically dominated by Binomial(r, e^ε/(1+e^ε)) (the paper's main theorem), so the
observation W ≥ v has p-value P[Binomial(r, e^ε/(1+e^ε)) ≥ v]. For (ε, δ)-DP the paper's
δ > 0 theorem adds a term: p = P[B ≥ v] + 2mδ · max_{1≤i≤v} P[v > B ≥ v − i]/i, which is the
p-value computation of the paper's Appendix D (`p_value`). The empirical lower bound at
confidence 1 − α is the largest ε whose p-value is below α: every smaller ε (at that δ)
is rejected by the observation (`epsilon_lower_bound`, by bisection on the monotone
p-value). The guess sizes k₊, k₋ must be fixed before the scores are seen, or the stated
confidence does not hold.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.stats

__all__ = ["correct_guesses", "epsilon_lower_bound", "p_value"]


def p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """P-value of ≥ v correct guesses out of r under the null "the mechanism is (ε, δ)-DP".

    Steinke et al. 2023: the main theorem (δ = 0: W ≤_st Binomial(r, e^ε/(1+e^ε))) and its
    δ > 0 form, p = β + 2mδ·α with β = P[B ≥ v] and α = max_{i=1..v} P[v > B ≥ v − i]/i,
    B ~ Binomial(r, e^ε/(1+e^ε)) (the computation of the paper's Appendix D).

    Args:
        m: Canaries, each included independently with probability 1/2.
        r: Guesses made (abstentions excluded), r ≤ m.
        v: Correct guesses, v ≤ r.
        epsilon: ε ≥ 0 of the null hypothesis.
        delta: δ in [0, 1] of the null hypothesis.
    """
    if not (0 <= v <= r <= m):
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if not epsilon >= 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))  # accuracy of ε-DP randomized response
    beta = float(scipy.stats.binom.sf(v - 1, r, q))  # P[B >= v]
    if delta == 0 or v == 0:
        return min(beta, 1.0)
    # P[v > B >= v - i] for i = 1..v, as a running sum of the pmf at v-1, v-2, ..., 0.
    window = np.cumsum(scipy.stats.binom.pmf(np.arange(v - 1, -1, -1), r, q))
    alpha = float(np.max(window / np.arange(1, v + 1)))
    return min(beta + alpha * delta * 2 * m, 1.0)


def epsilon_lower_bound(
    m: int, r: int, v: int, *, delta: float = 0.0, confidence: float = 0.95
) -> float:
    """The largest ε that v correct guesses of r reject at `confidence` (0 if none).

    The p-value (`p_value`) increases with ε; the bound is sup{ε : p(ε) < 1 − confidence},
    found by bisection to 1e-6 in ε. With δ = 0 and every guess right (v = r) it solves
    (e^ε/(1+e^ε))^r = 1 − confidence in closed form: ε = logit((1 − confidence)^(1/r)).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    level = 1.0 - confidence
    if r == 0 or p_value(m, r, v, 0.0, delta) >= level:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < level:
        lo, hi = hi, 2.0 * hi
        if hi > 1e4:  # unreachable: as ε grows P[B >= v] → 1 > 1 − confidence
            return math.inf
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) < level:
            lo = mid
        else:
            hi = mid
    return lo


def correct_guesses(
    scores: np.ndarray,
    included: np.ndarray,
    k_plus: int,
    k_minus: int,
    tiebreak: np.random.Generator,
) -> int:
    """W of the paper's Algorithm 1: "in" for the `k_plus` highest scores, "out" for the
    `k_minus` lowest, abstain on the rest; ties are broken by a random order from
    `tiebreak` (so equal scores carry no information about inclusion)."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    m = len(scores)
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > m:
        raise ValueError(f"need k_plus, k_minus >= 0 and k_plus + k_minus <= {m}")
    order = np.lexsort((tiebreak.permutation(m), scores))  # ascending score
    top = order[m - k_plus :] if k_plus else order[:0]
    bottom = order[:k_minus]
    return int(included[top].sum() + (~included[bottom]).sum())
