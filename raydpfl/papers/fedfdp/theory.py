"""FedFDP's mathematics: fair clipping, the private loss upload, accounting and λ*.

Paper: "FedFDP: Fairness-Aware Federated Learning with Differential Privacy" (Ling et al.;
seed 001, the LNCS version, is primary; equation numbers below are 001's). Implementation
spec: shared/specs/fedfdp.md, cited as §. Pure functions, no state; torch only where
per-sample tensors are involved.

- Fair clipping (Eq. 13): per-sample weights c_j with Σ_j c_j g_j the fairness-scaled,
  clipped gradient sum. `fair_clip_weights` is the sign-safe default (‖c_j g_j‖ ≤ C for
  every λ, §11 A5); `fair_clip_weights_paper` is Eq. 13 verbatim and reports whether a
  weight went negative (then the sum's sensitivity is unbounded and the run is not DP).
- The loss upload (Eqs. 14–15): per-sample losses clipped to [0, C_l], summed, Gaussian
  noise σ_l·C_l, divided by a caller-chosen denominator; the next round's C_l is the
  released value with a floor (§5.3, §11 A7).
- Accounting (§6, Eqs. 23–28): per client, T·τ gradient steps SGM(q, σ) composed with T loss
  releases SGM(q_l, σ_l) on an independent Poisson batch (§11 A6). `max_rounds` is the
  round budget of that composition; `max_rounds_paper` replays the paper's own count,
  which charges the gradient mechanism only and so under-reports ε (§6.3).
- λ* (§7, Eqs. 17–22): the paper's Cardano closed form and a numeric minimiser of the
  convergence bound, with `DegenerateBoundWarning` when the bound cannot give an interior
  optimum (§7.5).
"""

from __future__ import annotations

import cmath
import functools
import math
import numbers
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from raydpfl.algorithms.local_dp_sgd import clip_losses, private_mean_loss
from raydpfl.privacy._checks import _non_negative, _positive, _real
from raydpfl.privacy.accountants import (
    ACCOUNTANTS,
    HistoryEntry,
    compute_epsilon,
    validate_delta,
)
from raydpfl.privacy.calibration import bisect_steps_within, largest_feasible_steps
from raydpfl.privacy.dpsgd import CLIP_EPS

__all__ = [
    "LOSS_CLIP_FLOOR",
    "PAPER_ORDERS",
    "BoundCoefficients",
    "BoundConstants",
    "DegenerateBoundWarning",
    "LambdaStar",
    "bound_coefficients",
    "cardano_roots",
    "clip_losses",
    "convergence_bound",
    "fair_clip_weights",
    "fair_clip_weights_paper",
    "fairness_scale",
    "fedfdp_history",
    "lambda_star_cardano",
    "lambda_star_numeric",
    "max_rounds",
    "max_rounds_paper",
    "next_loss_clip_bound",
    "paper_epsilon",
    "private_mean_loss",
]

#: Default floor of the adaptive loss bound C_l (§11 A7 [REC]): keeps C_l out of the
#: absorbing state C_l = 0. Data-independent, so the max() is post-processing.
LOSS_CLIP_FLOOR: float = 1e-3

#: The RDP orders of the authors' accountant (§6.2 [CODE]): integers 2..63, 128, 256, 512.
PAPER_ORDERS: tuple[int, ...] = (*range(2, 64), 128, 256, 512)


def _rate(value: object, name: str) -> float:
    x = _real(value, name)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return x


def _count(value: object, name: str, *, minimum: int = 0) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------------------- #
# Fair clipping (Eq. 13)
# --------------------------------------------------------------------------------------- #
def _check_per_sample(norms: torch.Tensor, losses: torch.Tensor) -> None:
    for name, t in (("norms", norms), ("losses", losses)):
        if not isinstance(t, torch.Tensor) or t.ndim != 1:
            raise ValueError(f"{name} must be a 1-D torch.Tensor (one value per sample)")
    if norms.shape != losses.shape:
        raise ValueError(
            f"norms and losses must have the same length, got {norms.shape[0]} and "
            f"{losses.shape[0]}"
        )
    if bool(torch.isnan(norms).any()) or bool((norms < 0).any()):
        raise ValueError("norms must be >= 0 and not NaN")
    if bool(torch.isnan(losses).any()):
        raise ValueError("losses must not be NaN")


def fairness_scale(losses: torch.Tensor, global_loss: float, lam: float) -> torch.Tensor:
    """s_j = 1 + λ·Δ_j with Δ_j = ℓ_j − F(w_t): the per-sample factor of Eq. 11.

    Args:
        losses: 1-D tensor of per-sample losses ℓ_j = F_i(w_t^i, ξ_j) (±inf allowed).
        global_loss: F(w_t), the broadcast aggregate of last round's uploaded losses.
        lam: λ. The paper requires λ ≥ 0; any finite value is accepted here.

    Returns:
        s, a tensor like `losses`. λ = 0 gives exactly 1 (not 1 + 0·ℓ, which is NaN for an
        infinite loss), so FedFDP with λ = 0 is plain DP-SGD clipping bit for bit.
    """
    global_loss = _real(global_loss, "global_loss")
    lam = _real(lam, "lam")
    if lam == 0.0:
        return torch.ones_like(losses)
    return 1.0 + lam * (losses - global_loss)


def fair_clip_weights(
    norms: torch.Tensor,
    losses: torch.Tensor,
    global_loss: float,
    lam: float,
    clip_norm: float,
    *,
    negative: Literal["abs", "descent", "zero"] = "abs",
) -> torch.Tensor:
    """Sign-safe fair-clipping weights: Eq. 13 with its sensitivity restored (§11 A5).

    With s_j = 1 + λ(ℓ_j − F(w_t)) (`fairness_scale`), Eq. 13 is c_j = min(s_j, C/‖g_j‖).
    For s_j < 0 that min is s_j itself and ‖c_j g_j‖ = |s_j|·‖g_j‖ is unbounded (§5.1),
    so the weight for s_j < 0 is replaced according to `negative`:

    - ``abs`` (default, §11 A5 [REC]): c_j = sign(s_j)·min(|s_j|, C/(‖g_j‖ + 1e-6)), i.e.
      the fairness-scaled gradient s_j·g_j of Eq. 11 (an ascent step when s_j < 0), clipped
      to norm C. Continuous in s_j.
    - ``descent``: c_j = C/(‖g_j‖ + 1e-6), a full-norm descent step, which is what the
      authors' code intends (§5.1 [CODE]). Their literal expression s·min(C/(s‖g‖ + 1e-6), 1)
      is not used: for s < 0 with |s|·‖g‖ just above 1e-6 its denominator nears 0 and the
      weight, hence the norm, is unbounded.
    - ``zero``: c_j = 0 (s_j clamped to 0; the sample is dropped).

    For s_j ≥ 0 all three equal Eq. 13 (with the 1e-6 guard of
    `raydpfl.privacy.dpsgd.clip_weights`; λ = 0 reproduces those weights exactly). Every
    mode keeps ‖c_j g_j‖ ≤ C for any λ and any losses, so Σ_j c_j g_j has L2 sensitivity C
    (add/remove one record) and the step stays the subsampled Gaussian mechanism.

    Args:
        norms: 1-D tensor of per-sample gradient norms ‖g_j‖ (≥ 0).
        losses: 1-D tensor of per-sample losses ℓ_j at the same model, same order.
        global_loss: F(w_t).
        lam: λ (any finite value).
        clip_norm: C > 0.
        negative: The rule for samples with s_j < 0, see above.

    Returns:
        Weights c_j (dtype and device of `norms`) with Σ_j c_j g_j the clipped sum of Eq. 12.

    Raises:
        ValueError: On malformed tensors, NaN inputs, C ≤ 0, or an unknown `negative`.
    """
    clip_norm = _positive(clip_norm, "clip_norm")
    if negative not in ("abs", "descent", "zero"):
        raise ValueError(f"negative must be one of abs, descent, zero, got {negative!r}")
    _check_per_sample(norms, losses)
    s = fairness_scale(losses, global_loss, lam).to(norms.dtype)
    cap = clip_norm / (norms + CLIP_EPS)
    # min(|s|, cap) is finite even for |s| = inf, where s·min(1, C/(|s|‖g‖)) would be inf·0.
    if negative == "abs":
        return torch.sign(s) * torch.minimum(s.abs(), cap)
    if negative == "descent":
        return torch.where(s < 0, cap, torch.minimum(s, cap))
    return torch.minimum(s.clamp(min=0.0), cap)


def fair_clip_weights_paper(
    norms: torch.Tensor,
    losses: torch.Tensor,
    global_loss: float,
    lam: float,
    clip_norm: float,
) -> tuple[torch.Tensor, bool]:
    """Eq. 13 verbatim: c_j = min(1 + λΔ_j, C/(‖g_j‖ + 1e-6)).

    Not DP whenever some 1 + λΔ_j < 0 (which needs λ > 1/(F(w_t) − ℓ_j), §5.1): that
    weight is negative and unbounded, so the clipped sum has no sensitivity bound. The flag
    lets the caller mark such a run as not differentially private.

    Args:
        norms, losses, global_loss, lam, clip_norm: As in `fair_clip_weights`.

    Returns:
        (weights, any_negative): the weights, and whether any weight is < 0.

    Raises:
        ValueError: On malformed tensors, NaN inputs, or C ≤ 0.
    """
    clip_norm = _positive(clip_norm, "clip_norm")
    _check_per_sample(norms, losses)
    s = fairness_scale(losses, global_loss, lam).to(norms.dtype)
    weights = torch.minimum(s, clip_norm / (norms + CLIP_EPS))
    return weights, bool((weights < 0).any())


# --------------------------------------------------------------------------------------- #
# The loss upload (Eqs. 14–15)
# --------------------------------------------------------------------------------------- #
# `clip_losses` (Eq. 15) and `private_mean_loss` (Eq. 14, Alg. 2 L9–L11) are the noisy
# loss query the DP algorithms share (`raydpfl.algorithms.local_dp_sgd`, imported above):
# Adap DP-FL's schedule loss is the same mechanism. FedFDP uses it in float64.


def next_loss_clip_bound(
    noisy_loss: float, *, floor: float = LOSS_CLIP_FLOOR, multiplier: float = 1.0
) -> float:
    """C_l^{i,t+1} = max(floor, multiplier·F̃_i^{t}) (Eq. 14 as read in §5.3; §11 A7).

    The paper sets the next bound to the noisy mean just released (post-processing, no
    extra privacy cost). With floor = 0 this is the authors' code, where a non-positive
    release makes C_l = 0 for ever (every later upload is exactly 0); the default floor
    1e-3 avoids that. `multiplier` > 1 counters the downward drift caused by clipping at
    the previous mean (E[min(X, c)] ≤ min(E X, c)); 1.0 is the paper.

    Args:
        noisy_loss: F̃_i released this round (any finite value).
        floor: ≥ 0, data-independent.
        multiplier: > 0.
    """
    noisy_loss = _real(noisy_loss, "noisy_loss")
    floor = _non_negative(floor, "floor")
    multiplier = _positive(multiplier, "multiplier")
    return max(floor, multiplier * noisy_loss)


# --------------------------------------------------------------------------------------- #
# Accounting (§6; Eqs. 23–28)
# --------------------------------------------------------------------------------------- #
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
        `raydpfl.privacy.accountants.compute_epsilon` (zero-step entries are kept; the
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
    charges with `raydpfl.privacy.accountants` instead.

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
    target_epsilon: float,
    delta: float,
    *,
    sampling_rate: float,
    noise_multiplier: float,
    loss_noise_multiplier: float,
    loss_sampling_rate: float | None = None,
    local_steps: int = 1,
    loss_batch: Literal["independent", "shared"] = "independent",
    accountant: str = "rdp",
) -> int:
    """Rounds a per-client budget allows, both mechanisms charged (Thm. 6.3, Eq. 28).

    The largest integer T with ε(`fedfdp_history`(T, ...)) ≤ target, never an overshoot
    (§11 A6 [REC] "strict"). E.g. q = 0.05, σ = 2, σ_l = 5, ε = 3.52, δ = 1e-5 → 683
    rounds, against the paper's 778 (§6.3).

    Args:
        target_epsilon: ε > 0.
        delta: δ in (0, 1).
        sampling_rate, noise_multiplier, loss_noise_multiplier, loss_sampling_rate,
            local_steps, loss_batch: As in `fedfdp_history`.
        accountant: One of `raydpfl.privacy.accountants.ACCOUNTANTS` (what the ledger
            charges), or ``paper`` for `paper_epsilon`.
    """
    target = _positive(target_epsilon, "target_epsilon")
    delta = validate_delta(delta)
    if accountant != "paper" and accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be paper or one of {ACCOUNTANTS}, got {accountant!r}")
    kwargs = dict(
        sampling_rate=sampling_rate,
        noise_multiplier=noise_multiplier,
        loss_noise_multiplier=loss_noise_multiplier,
        loss_sampling_rate=loss_sampling_rate,
        local_steps=local_steps,
        loss_batch=loss_batch,
    )
    fedfdp_history(0, **kwargs)  # validates the arguments once, before the search

    def feasible(t: int) -> bool:
        return _epsilon(fedfdp_history(t, **kwargs), delta, accountant) <= target

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


# --------------------------------------------------------------------------------------- #
# Convergence bound and λ* (§7; Eqs. 17–22, Thm. 0.A.1 / Eq. 29)
# --------------------------------------------------------------------------------------- #
class DegenerateBoundWarning(UserWarning):
    """The λ-bound of Eq. 17 cannot yield the paper's interior optimum λ* (§7.5).

    Issued when a5 = 2·Q0 ≤ 0 (per-sample loss minus the mean loss takes both signs, so
    Q0 < 0 in practice: the bound has a pole at λ = 1/(2|Q0|) and the paper's sign
    arguments fail), or when 𝒢(0) = a3 − a4·a5 ≥ 0 (the bound does not decrease at λ = 0,
    so its minimiser over λ ≥ 0 is the boundary λ* = 0, i.e. no fairness term).
    """


@dataclass(frozen=True)
class BoundConstants:
    """The constants of Theorem 0.A.1 (Eq. 29) and Eq. 17; the paper never estimates them.

    Attributes:
        L: Smoothness (Assumption 1), > 0.
        mu: Strong convexity (Assumption 2), > 0.
        G: Per-sample gradient-norm bound (Assumption 3), > 0.
        Gamma: Heterogeneity Γ = F* − Σ p_i F_i* ≥ 0.
        Q0, Q1: Bounds Q0 ≤ Δ_i^j ≤ Q1 on per-sample loss minus global loss; Q1 > 0.
        dist0_sq: E‖w_1 − w*‖² ≥ 0.
        sigma: Gradient noise multiplier σ ≥ 0.
        C: Gradient clip norm > 0.
        d: Number of model parameters ≥ 1.
        B_hat: B̂ = min_i |B_i| > 0.
    """

    L: float
    mu: float
    G: float
    Gamma: float
    Q0: float
    Q1: float
    dist0_sq: float
    sigma: float
    C: float
    d: int
    B_hat: float

    def __post_init__(self) -> None:
        for name in ("L", "mu", "G", "C", "B_hat", "Q1"):
            _positive(getattr(self, name), name)
        for name in ("Gamma", "dist0_sq", "sigma"):
            _non_negative(getattr(self, name), name)
        _real(self.Q0, "Q0")
        _count(self.d, "d", minimum=1)
        if self.Q0 > self.Q1:
            raise ValueError(f"Q0 must be <= Q1, got Q0={self.Q0}, Q1={self.Q1}")


class BoundCoefficients(NamedTuple):
    """a1..a5 of Eq. 17: 𝓕(λ) = (a1λ³ + a2λ² + a3λ + a4) / (a5λ + 1)."""

    a1: float
    a2: float
    a3: float
    a4: float
    a5: float

    def objective(self, lam: float) -> float:
        """𝓕(λ); +inf where a5λ + 1 ≤ 0 (past the pole the bound is void)."""
        den = self.a5 * lam + 1.0
        if den <= 0.0:
            return math.inf
        return (((self.a1 * lam + self.a2) * lam + self.a3) * lam + self.a4) / den

    def numerator_derivative(self, lam: complex | float) -> complex | float:
        """𝒢(λ) = 2a1a5λ³ + (3a1 + a2a5)λ² + 2a2λ + a3 − a4a5 (Eq. 19): 𝓕' = 𝒢/(a5λ+1)²."""
        a1, a2, a3, a4, a5 = self
        return ((2 * a1 * a5 * lam + 3 * a1 + a2 * a5) * lam + 2 * a2) * lam + a3 - a4 * a5


def bound_coefficients(constants: BoundConstants, *, drop_mu_sq: bool = True) -> BoundCoefficients:
    """a1..a5 of Eq. 17 (λ-form of Eq. 29 with 1 + Q0λ ≤ C_t^{i,j} ≤ 1 + Q1λ).

    Substituting C_t = 1 + Q1λ into A and 2C_t − 1 ≥ 1 + 2Q0λ into Eq. 29 gives
    E[F(w_T)] − F* ≤ (L/(2μ²T))·(A + μ²‖w_1 − w*‖²(1 + 2Q0λ)) / (1 + 2Q0λ), hence

        a1 = G²Q1³,  a2 = 6G²Q1²,  a3 = 9Q1G² + 2LΓQ1 + 2Q0·k,
        a4 = 4G² + 2LΓ + 2σ²C²d/B̂² + k,  a5 = 2Q0,

    with k = μ²·E‖w_1 − w*‖². The paper writes k = E‖w_1 − w*‖² (§7.3 [CHECK]: it drops
    μ²; the two agree only for μ = 1). That changes the bound's value but not its argmin,
    contrary to §7.3: the k-terms contribute k(1 + 2Q0λ)/(1 + 2Q0λ) = k, a constant, and
    cancel from 𝒢(λ) (a3 − a4a5 has no k), so λ* depends on neither μ nor ‖w_1 − w*‖².

    Args:
        constants: The bound's constants.
        drop_mu_sq: True (default) reproduces Eq. 17 as printed; False is the exact
            transcription of Eq. 29.
    """
    c = constants
    k = c.dist0_sq if drop_mu_sq else c.mu**2 * c.dist0_sq
    g2 = c.G**2
    noise = 2 * c.sigma**2 * c.C**2 * c.d / c.B_hat**2
    return BoundCoefficients(
        a1=g2 * c.Q1**3,
        a2=6 * g2 * c.Q1**2,
        a3=9 * c.Q1 * g2 + 2 * c.L * c.Gamma * c.Q1 + 2 * c.Q0 * k,
        a4=4 * g2 + 2 * c.L * c.Gamma + noise + k,
        a5=2 * c.Q0,
    )


def convergence_bound(
    lam: float, constants: BoundConstants, rounds: int, *, drop_mu_sq: bool = True
) -> float:
    """P(λ) = (L/(2μT))·𝓕(λ) (Eq. 17); with drop_mu_sq=False, (L/(2μ²T))·𝓕(λ) (Eq. 29).

    Returns +inf for λ ≥ 1/(2|Q0|) when Q0 < 0: there 1 + 2Q0λ ≤ 0 and the lower bound on
    2C_t − 1 used by the paper is not positive, so Eq. 29 gives no bound.

    Args:
        lam: λ ≥ 0.
        constants: The bound's constants.
        rounds: T ≥ 1.
        drop_mu_sq: See `bound_coefficients`.
    """
    lam = _non_negative(lam, "lam")
    rounds = _count(rounds, "rounds", minimum=1)
    mu_power = 1 if drop_mu_sq else 2
    prefactor = constants.L / (2 * constants.mu**mu_power * rounds)
    return prefactor * bound_coefficients(constants, drop_mu_sq=drop_mu_sq).objective(lam)


def _warn_if_degenerate(coeffs: BoundCoefficients, stacklevel: int = 3) -> bool:
    # With Q1 > 0 every degenerate case has λ* = 0 exactly. a5 ≥ 0: 𝒢' > 0 on λ > 0 (all
    # terms of Eq. 21 are ≥ 0), so 𝒢(0) ≥ 0 keeps 𝓕 increasing. a5 < 0: 𝒢(0) > 0 (§7.5),
    # and by Descartes' rule (coefficient signs −, ±, +, +) 𝒢 has exactly one positive root
    # r; 𝓕 → +inf at the pole (its numerator is A(1 + Q1λ) > 0 there), so 𝓕 increases just
    # below the pole, hence r lies beyond it and 𝓕 increases on the whole feasible range.
    reasons = []
    if coeffs.a5 < 0:
        reasons.append(
            f"Q0 = a5/2 = {coeffs.a5 / 2:.6g} < 0, so the bound has a pole at "
            f"λ = 1/(2|Q0|) = {-1 / coeffs.a5:.6g} and the paper's argument that 𝒢 is "
            "increasing with a single positive root fails"
        )
    elif coeffs.a5 == 0:
        reasons.append("Q0 = 0, so 𝒢 (Eq. 19) is not a cubic and Cardano's formula is void")
    g0 = coeffs.a3 - coeffs.a4 * coeffs.a5
    if g0 >= 0:
        reasons.append(
            f"𝒢(0) = a3 − a4·a5 = {g0:.6g} ≥ 0, so the bound increases from λ = 0 on the "
            "whole feasible range and its minimiser is λ* = 0 (no fairness term; the "
            "closed form's largest root is not a minimiser; and a bound on the "
            "convergence of F says nothing about Ψ anyway)"
        )
    if reasons:
        warnings.warn(
            "degenerate FedFDP convergence bound (spec §7.5): " + "; ".join(reasons),
            DegenerateBoundWarning,
            stacklevel=stacklevel,
        )
    return bool(reasons)


def cardano_roots(coeffs: BoundCoefficients) -> tuple[complex, complex, complex]:
    """The roots λ_1, λ_2, λ_3 of 𝒢 (Eq. 19) by the paper's Cardano route (Eq. 22).

    λ = x − (a2a5 + 3a1)/(6a1a5) gives x³ + a6·x + a7 = 0 with
    a6 = −(3a1 − a2a5)²/(12a1²a5²) and
    a7 = [108a1²a5²(a3 − a4a5) − 36a1a2a5(3a1 + a2a5) + 2(3a1 + a2a5)³]/(216a1³a5³);
    x_1 = u + v, x_2 = ωu + ω²v, x_3 = ω²u + ωv with u³ = −a7/2 + √(a7²/4 + a6³/27) and
    ω = (−1 + √3 i)/2. The paper writes v as the other cube root; taken as principal
    complex roots the pair can be wrong (e.g. the principal ∛ of a negative real is not
    real), so v = −a6/(3u), which makes u·v = −a6/3 as Cardano requires.

    Raises:
        ValueError: If a1·a5 = 0 (𝒢 is not a cubic).
    """
    a1, a2, a3, a4, a5 = coeffs
    if a1 * a5 == 0:
        raise ValueError("Cardano's formula needs a1·a5 != 0 (Q0 = 0 makes 𝒢 quadratic)")
    b = 3 * a1 + a2 * a5
    a6 = -((3 * a1 - a2 * a5) ** 2) / (12 * a1**2 * a5**2)
    a7 = (108 * a1**2 * a5**2 * (a3 - a4 * a5) - 36 * a1 * a2 * a5 * b + 2 * b**3) / (
        216 * a1**3 * a5**3
    )
    root = cmath.sqrt(a7**2 / 4 + a6**3 / 27)
    # Take u from the larger of the two radicands so that u != 0 unless a6 = a7 = 0.
    plus, minus = -a7 / 2 + root, -a7 / 2 - root
    u = (plus if abs(plus) >= abs(minus) else minus) ** (1 / 3)
    v = -a6 / (3 * u) if u != 0 else 0j
    omega = complex(-0.5, math.sqrt(3) / 2)
    shift = b / (6 * a1 * a5)
    xs = (u + v, omega * u + omega**2 * v, omega**2 * u + omega * v)
    return tuple(complex(x - shift) for x in xs)  # type: ignore[return-value]


def lambda_star_cardano(constants: BoundConstants, *, drop_mu_sq: bool = True) -> float:
    """The paper's closed-form λ* (§5.1, Eqs. 19–22): the largest real root of 𝒢.

    Valid only when Q0 > 0 and 𝒢(0) < 0; otherwise a `DegenerateBoundWarning` is issued
    and the paper's rule is still applied, so the value may be negative or lie past the
    pole 1/(2|Q0|). Use `lambda_star_numeric` for the minimiser of the bound itself.

    Args:
        constants: The bound's constants.
        drop_mu_sq: See `bound_coefficients`.

    Raises:
        ValueError: If Q0 = 0 (Cardano's formula is undefined).
    """
    coeffs = bound_coefficients(constants, drop_mu_sq=drop_mu_sq)
    if coeffs.a5 == 0:
        raise ValueError("Q0 = 0 gives a5 = 0: 𝒢 is quadratic and Cardano's formula is void")
    _warn_if_degenerate(coeffs)
    roots = cardano_roots(coeffs)
    # A real root comes out of complex arithmetic with a rounding-sized imaginary part.
    scale = max(1.0, *(abs(r) for r in roots))
    real = [r.real for r in roots if abs(r.imag) <= 1e-7 * scale]
    if not real:  # a cubic always has a real root; keep the least-imaginary one
        real = [min(roots, key=lambda r: abs(r.imag)).real]
    return max(real)


class LambdaStar(NamedTuple):
    """The minimiser of the bound over the feasible λ and where it lies."""

    lam: float
    at_boundary: bool
    objective: float


def lambda_star_numeric(
    constants: BoundConstants,
    *,
    drop_mu_sq: bool = True,
    lambda_max: float | None = None,
    grid_points: int = 4097,
) -> LambdaStar:
    """λ* = argmin of 𝓕 (Eq. 17) over the feasible λ ≥ 0, found numerically (§7.6 [REC]).

    Feasible: 0 ≤ λ < 1/(2|Q0|) when Q0 < 0 (beyond it Eq. 29 gives no bound), else
    0 ≤ λ ≤ `lambda_max`; without `lambda_max` the upper end is found by doubling from 1
    until 𝓕 increases (𝓕 is unimodal on λ ≥ 0 when Q0 ≥ 0). 𝓕 is evaluated on a grid, and
    the best grid cell is refined with scipy's bounded Brent method; λ = 0 is always a
    candidate. This uses 𝓕 only, never 𝒢 or Cardano, so it independently checks
    `lambda_star_cardano`. Issues a `DegenerateBoundWarning` in the cases of §7.5; there
    the result is λ* = 0 (provably, see the comment in `_warn_if_degenerate`), and otherwise
    it is the positive root of 𝒢 that the closed form gives.

    Args:
        constants: The bound's constants.
        drop_mu_sq: See `bound_coefficients`.
        lambda_max: Optional cap on λ (> 0).
        grid_points: Grid size (≥ 3).

    Returns:
        `LambdaStar`(λ*, whether λ* is at an end of the feasible range, 𝓕(λ*)).
    """
    grid_points = _count(grid_points, "grid_points", minimum=3)
    cap = None if lambda_max is None else _positive(lambda_max, "lambda_max")
    coeffs = bound_coefficients(constants, drop_mu_sq=drop_mu_sq)
    _warn_if_degenerate(coeffs)
    f = coeffs.objective
    if coeffs.a5 < 0:
        pole = -1.0 / coeffs.a5
        # 𝓕 → +inf at the pole; stop just short of it so every grid value is finite.
        hi = pole * (1.0 - 1e-9) if cap is None else min(cap, pole * (1.0 - 1e-9))
    elif cap is not None:
        hi = cap
    else:
        hi = 1.0
        while f(2.0 * hi) < f(hi) and hi < 1e15:
            hi *= 2.0
        hi *= 2.0
    grid = np.linspace(0.0, hi, grid_points)
    values = np.array([f(x) for x in grid])
    k = int(np.argmin(values))
    lo_b, hi_b = grid[max(k - 1, 0)], grid[min(k + 1, grid_points - 1)]
    res = minimize_scalar(
        f, bounds=(lo_b, hi_b), method="bounded", options={"xatol": 1e-12 * max(1.0, hi_b)}
    )
    candidates = [(float(values[k]), float(grid[k])), (f(0.0), 0.0), (float(res.fun), res.x)]
    value, lam = min(candidates)
    at_end = lam == 0.0 or (cap is not None and lam >= hi * (1 - 1e-9))
    return LambdaStar(lam=float(lam), at_boundary=bool(at_end), objective=float(value))
