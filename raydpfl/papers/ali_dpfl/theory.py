"""ALI-DPFL's derived quantities: the iteration budget R_c and the optimal τ*.

Paper: "ALI-DPFL: Differentially Private Federated Learning with Adaptive Local
Iterations" (seed 002; implementation spec shared/specs/ali-dpfl.md, cited as §). Pure
functions, no state: the server half of ALI-DPFL calls them after every aggregation.

- `classic_epsilon`: RDP of the sampled Gaussian mechanism at integer orders, composed
  over T steps, converted with the classic bound ε = min_α T·R(α) + log(1/δ)/(α−1)
  (§4.7, the seed's Def. 4 / Thm. 2 with its typos fixed).
- `iteration_budget`: R_c, the most DP-SGD iterations the budget (ε, δ) allows
  (Algorithm 3), in the core's exact mode and in the paper-compatible mode that
  reproduces the paper's R_c values (`paper_compat_iteration_budget`, this paper's own,
  registered with the core as mode ``paper_compat``).
- `tau_star`: the continuous minimiser of the convergence bound in τ (Eq. 9, Lemma 2),
  and `choose_local_steps`, the integer τ of the next round (Lemma 1 and 2, §3.5).
"""

from __future__ import annotations

import math
from typing import Literal

# The classic conversion and the exact step budget are generic accounting (also behind
# `raydpfl privacy steps`): they live in the core and are ALI-DPFL's names here too. The
# authors' Algorithm 3 as they coded it is this paper's, below.
from raydpfl.privacy.accounting.calibration import bisect_steps_within
from raydpfl.privacy.accounting.step_budget import CLASSIC_ORDERS as ALI_DPFL_ORDERS
from raydpfl.privacy.accounting.step_budget import classic_epsilon, iteration_budget

__all__ = [
    "ALI_DPFL_ORDERS",
    "TAU_MAX",
    "classic_epsilon",
    "iteration_budget",
    "noise_term",
    "paper_compat_iteration_budget",
    "round_tau",
    "tau_star",
]

#: [CODE] caps τ* at 100 (§3.5).
TAU_MAX = 100


def paper_compat_iteration_budget(
    epsilon: float, delta: float, sampling_rate: float, noise_multiplier: float
) -> int:
    """R_c as the authors' code computes it (Algorithm 3, §4.7 [CODE]): the classic
    conversion on the paper's orders, bisected over real T on [0, 1e5] until
    ε(hi) − ε ≤ 0.01, returning int(hi). ε(R_c) may exceed the budget by up to 0.01. It
    reproduces the paper's R_c (79, 177, 317, ... for σ = 1.1, q = 0.015, δ = 1e-5).
    Registered with the core as ``iteration_budget(mode="paper_compat")``."""
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    return bisect_steps_within(
        lambda t: classic_epsilon(sampling_rate, noise_multiplier, t, delta), epsilon
    )


def noise_term(
    noise_multiplier: float, clip_norm: float, num_params: int, min_batch: float
) -> float:
    """N_dp = σ²C²d / B̂² (§3.5): the DP noise's contribution to the bound."""
    if min_batch <= 0:
        raise ValueError(f"min_batch (B̂) must be > 0, got {min_batch}")
    return noise_multiplier**2 * clip_norm**2 * num_params / min_batch**2


def tau_star(
    *,
    mu: float,
    gamma: float,
    total_iterations: float,
    clip_norm: float,
    noise_multiplier: float,
    num_params: int,
    min_batch: float,
    variant: Literal["paper", "code", "consistent"] = "paper",
) -> float:
    """The continuous τ* minimising the convergence bound (Eq. 9; Lemma 2).

        τ* = sqrt(1 + (4/μ² + 3C² + 2ΓTμ + N_dp) / ((2 + 1/T)(C² + N_dp)))

    with N_dp = σ²C²d/B̂². ``code`` uses the authors' denominator (2 + 2/T);
    ``consistent`` uses β = 2/μ throughout, (2 + 2/T) with ΓTμ (§4.5 "Variants").

    Args:
        mu: The run-time μ estimate (> 0).
        gamma: Heterogeneity Γ ≥ 0.
        total_iterations: T = min(R_s·τ_prev, R_c).
        clip_norm: C.
        noise_multiplier: σ.
        num_params: d, trainable parameters.
        min_batch: B̂ = min_i q·|D_i|.
        variant: Which of the three forms above.
    """
    if mu <= 0 or total_iterations <= 0:
        raise ValueError(f"mu and total_iterations must be > 0, got {mu}, {total_iterations}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    n_dp = noise_term(noise_multiplier, clip_norm, num_params, min_batch)
    t = total_iterations
    heterogeneity = (1.0 if variant == "consistent" else 2.0) * gamma * t * mu
    num = 4 / mu**2 + 3 * clip_norm**2 + heterogeneity + n_dp
    den = (2 + (1 if variant == "paper" else 2) / t) * (clip_norm**2 + n_dp)
    return math.sqrt(1 + num / den)


def round_tau(tau_raw: float, *, tau_max: int = TAU_MAX, remaining: int | None = None) -> int:
    """The integer τ used in a round: half-up rounding, clamped to [1, tau_max] ([CODE]),
    and never more than the `remaining` iterations of the budget (§3.5 [REC])."""
    tau = min(max(int(tau_raw + 0.5), 1), tau_max)
    if remaining is not None:
        tau = max(1, min(tau, remaining))
    return tau


def choose_local_steps(
    *,
    rounds_budget: int,
    iteration_budget: int,
    previous_tau: int,
    iterations_done: int,
    **tau_star_args: float,
) -> int:
    """τ for the next round (§3.3 step 2, Lemma 1 and 2).

    Lemma 1: with R_s ≥ R_c rounds there is no round limit to work around, and τ = 1
    minimises the bound. Otherwise τ* of Eq. 9 at T = min(R_s·τ_prev, R_c), rounded,
    and capped by the iterations left (R_c − t).
    """
    remaining = iteration_budget - iterations_done
    if remaining <= 0:
        return 0
    if rounds_budget >= iteration_budget:
        return 1
    total = min(rounds_budget * previous_tau, iteration_budget)
    return round_tau(tau_star(total_iterations=total, **tau_star_args), remaining=remaining)
