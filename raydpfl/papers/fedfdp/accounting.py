"""FedFDP's accounting (shared/specs/fedfdp.md §6, Eqs. 23–28 of Ling et al., seed 001).

Per client, T·τ gradient steps SGM(q, σ) composed with T loss releases SGM(q_l, σ_l) on an
independent Poisson batch (§11 A6). `max_rounds` is the round budget of that composition;
`max_rounds_paper` replays the paper's own count, which charges the gradient mechanism
only and so under-reports ε (§6.3). `paper_epsilon` is the authors' accountant.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np

from raydpfl.privacy.accounting._checks import _count, _non_negative, _positive, _rate
from raydpfl.privacy.accounting.accountants import (
    ACCOUNTANTS,
    HistoryEntry,
    compute_epsilon,
    validate_delta,
)
from raydpfl.privacy.accounting.calibration import bisect_steps_within, largest_feasible_steps

__all__ = [
    "PAPER_ORDERS",
    "fedfdp_history",
    "max_rounds",
    "max_rounds_paper",
    "paper_epsilon",
]

#: The RDP orders of the authors' accountant (§6.2 [CODE]): integers 2..63, 128, 256, 512.
PAPER_ORDERS: tuple[int, ...] = (*range(2, 64), 128, 256, 512)


def fedfdp_history(
    rounds: int,
    *,
    sampling_rate: float,
    noise_multiplier: float,
    loss_noise_multiplier: float,
    loss_sampling_rate: float | None = None,
    local_steps: int = 1,
    loss_batch: Literal["independent", "shared"] = "independent",
) -> list[HistoryEntry]:
    """One client's privacy history after `rounds` FedFDP rounds, both mechanisms (Eq. 28).

    Per round: `local_steps` gradient steps SGM(q, σ) (Eq. 23; one in the paper) and one
    loss release SGM(q_l, σ_l) (Eq. 27). Unit: one record of this client; every
    participation is charged, no client-sampling amplification (§6.1, §11 A10).

    - ``independent`` (default, §11 A6 [REC], as the authors' code): the loss batch is a
      fresh Poisson(q_l) sample, so the two mechanisms compose additively (Def. 4):
      ``[(σ, q, T·τ), (σ_l, q_l, T)]``.
    - ``shared``: the loss is evaluated on the batch of the round's last gradient step
      (Alg. 2 as printed). That pair is one SGM releasing two Gaussian blocks, i.e. one
      SGM(q, σ_eff) with σ_eff = (σ⁻² + σ_l⁻²)^(−1/2) (§6.4); it replaces that step:
      ``[(σ, q, T·(τ − 1)), (σ_eff, q, T)]``. Additive accounting would under-report here.

    Args:
        rounds: T ≥ 0, rounds this client took part in.
        sampling_rate: q, the gradient batch rate.
        noise_multiplier: σ of the gradient steps.
        loss_noise_multiplier: σ_l of the loss release (5.0 in the paper).
        loss_sampling_rate: q_l of the independent loss batch; defaults to q. Must equal q
            (or be None) for ``shared``.
        local_steps: τ ≥ 1 gradient steps per round.
        loss_batch: ``independent`` or ``shared``, see above.

    Returns:
        ``(noise_multiplier, sampling_rate, steps)`` entries for
        `raydpfl.privacy.accounting.accountants.compute_epsilon` (zero-step entries are kept; the
        accountant drops them).
    """
    rounds = _count(rounds, "rounds")
    local_steps = _count(local_steps, "local_steps", minimum=1)
    q = _rate(sampling_rate, "sampling_rate")
    sigma = _non_negative(noise_multiplier, "noise_multiplier")
    sigma_l = _non_negative(loss_noise_multiplier, "loss_noise_multiplier")
    q_l = q if loss_sampling_rate is None else _rate(loss_sampling_rate, "loss_sampling_rate")
    if loss_batch == "independent":
        return [(sigma, q, rounds * local_steps), (sigma_l, q_l, rounds)]
    if loss_batch != "shared":
        raise ValueError(f"loss_batch must be independent or shared, got {loss_batch!r}")
    if q_l != q:
        raise ValueError(
            f"a shared loss batch has the gradient rate q={q}; got loss_sampling_rate={q_l}"
        )
    # Two Gaussian blocks with unit sensitivity after scaling by σC and σ_l·C_l: the joint
    # sensitivity is sqrt(σ⁻² + σ_l⁻²), i.e. noise multiplier σ_eff. σ or σ_l = 0 → 0 (no DP).
    sigma_eff = 0.0 if sigma == 0.0 or sigma_l == 0.0 else (sigma**-2 + sigma_l**-2) ** -0.5
    return [(sigma, q, rounds * (local_steps - 1)), (sigma_eff, q, rounds)]


@functools.lru_cache(maxsize=256)
def _paper_rdp_one_step(noise_multiplier: float, sampling_rate: float) -> np.ndarray:
    # R(α) = log A_α(q, σ) / (α − 1) at the integer orders of the authors' code: Eq. 26 with
    # the log that Eqs. 23 and 27 drop (§6.1). opacus evaluates this sum in log space.
    from opacus.accountants.analysis.rdp import compute_rdp

    vec = np.asarray(
        compute_rdp(
            q=sampling_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(PAPER_ORDERS)
        ),
        dtype=np.float64,
    )
    vec.setflags(write=False)
    return vec


def paper_epsilon(history: Iterable[Sequence[float]], delta: float) -> float:
    """ε of a history under the authors' accountant (§6.2 [CODE]; Lemma 1 / Eq. 28).

    RDP at α ∈ {2..63, 128, 256, 512}, summed over entries, converted with Balle et al.
    2020 Prop. 12: ε = min_α [R(α) + ln((α−1)/α) − (ln δ + ln α)/(α−1)], with the code's
    short-cut ε_α = 0 when δ² + expm1(−R(α)) ≥ 0. Steps may be fractional (the code's
    search runs over real step counts). Use it to reproduce the paper's numbers; the ledger
    charges with `raydpfl.privacy.accounting.accountants` instead.

    Args:
        history: ``(noise_multiplier, sampling_rate, steps)`` entries, steps ≥ 0 real.
        delta: In (0, 1).
    """
    delta = validate_delta(delta)
    rdp = np.zeros(len(PAPER_ORDERS))
    for i, entry in enumerate(history):
        try:
            sigma, q, steps = entry
        except (TypeError, ValueError):
            raise ValueError(f"history[{i}] must be a (sigma, q, steps) triple") from None
        sigma = _non_negative(sigma, f"history[{i}] noise_multiplier")
        q = _rate(q, f"history[{i}] sampling_rate")
        steps = _non_negative(steps, f"history[{i}] steps")
        if steps == 0.0 or q == 0.0:
            continue
        if sigma == 0.0:
            return math.inf
        rdp = rdp + steps * _paper_rdp_one_step(sigma, q)
    alphas = np.asarray(PAPER_ORDERS, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        eps = rdp + np.log1p(-1.0 / alphas) - np.log(delta * alphas) / (alphas - 1.0)
        eps = np.where(delta**2 + np.expm1(-rdp) >= 0.0, 0.0, eps)
    best = float(np.nanmin(eps)) if not np.isnan(eps).all() else math.inf
    return max(0.0, best)


def _epsilon(history: list[HistoryEntry], delta: float, accountant: str) -> float:
    if accountant == "paper":
        return paper_epsilon(history, delta)
    return compute_epsilon(history, delta, accountant)


def max_rounds(
    target_epsilon: float, delta: float, *, accountant: str = "rdp", **history: Any
) -> int:
    """Rounds a per-client budget allows, both mechanisms charged (Thm. 6.3, Eq. 28).

    The largest integer T with ε(`fedfdp_history`(T, ...)) ≤ target, never an overshoot
    (§11 A6 [REC] "strict"). E.g. q = 0.05, σ = 2, σ_l = 5, ε = 3.52, δ = 1e-5 → 683
    rounds, against the paper's 778 (§6.3).

    Args:
        target_epsilon: ε > 0.
        delta: δ in (0, 1).
        accountant: One of `raydpfl.privacy.accounting.accountants.ACCOUNTANTS` (what the ledger
            charges), or ``paper`` for `paper_epsilon`.
        **history: `fedfdp_history`'s keyword arguments (sampling_rate,
            noise_multiplier, loss_noise_multiplier, loss_sampling_rate, local_steps,
            loss_batch).
    """
    target = _positive(target_epsilon, "target_epsilon")
    delta = validate_delta(delta)
    if accountant != "paper" and accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be paper or one of {ACCOUNTANTS}, got {accountant!r}")
    fedfdp_history(0, **history)  # validates the arguments once, before the search

    def feasible(t: int) -> bool:
        return _epsilon(fedfdp_history(t, **history), delta, accountant) <= target

    return largest_feasible_steps(feasible)


def max_rounds_paper(
    target_epsilon: float,
    delta: float,
    *,
    sampling_rate: float,
    noise_multiplier: float,
    local_steps: int = 1,
    mode: Literal["paper_compat", "strict"] = "paper_compat",
) -> int:
    """Rounds as the paper counts them: the gradient mechanism only (§6.2–6.3).

    The loss upload is not charged, so the true ε after these rounds exceeds the target
    (3.76 instead of 3.52 at the default setting, §6.3): use it to reproduce the paper's
    round counts, never to spend a budget. Accountant: `paper_epsilon`.

    Args:
        target_epsilon, delta: The budget.
        sampling_rate, noise_multiplier: q and σ of the gradient steps.
        local_steps: τ; rounds = steps // τ (the code's T = max_steps / local_iterations).
        mode: ``paper_compat`` replays the code: bisection over real step counts on
            [0, 1e5] until ε(hi) − target ≤ 0.01, returning int(hi) (may overshoot ε by up
            to 0.01). It gives 778 at q = 0.05, σ = 2, ε = 3.52, δ = 1e-5, and
            6/115/268/463/708 for σ = 1/1.5/2/2.5/3 at ε = 2 (001 Fig. 4). ``strict``
            returns the largest integer step count with ε ≤ target (776 at the default).
    """
    target = _positive(target_epsilon, "target_epsilon")
    delta = validate_delta(delta)
    q = _rate(sampling_rate, "sampling_rate")
    sigma = _non_negative(noise_multiplier, "noise_multiplier")
    local_steps = _count(local_steps, "local_steps", minimum=1)
    if mode == "paper_compat":
        steps = bisect_steps_within(lambda t: paper_epsilon([(sigma, q, t)], delta), target)
    elif mode == "strict":
        steps = largest_feasible_steps(lambda t: paper_epsilon([(sigma, q, t)], delta) <= target)
    else:
        raise ValueError(f"mode must be paper_compat or strict, got {mode!r}")
    return steps // local_steps
