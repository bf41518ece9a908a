"""DPFL-BCS's run-time estimation at t = T0 (§9): Γ̂_n, ρ̂_min, P2 and Table III.

Paper: "The Power of Bias: Optimizing Client Selection in Federated Learning with Heterogeneous
Differential Privacy" (Ma et al.; seed 003, implementation spec shared/specs/dpfl-bcs.md, cited
as §). Pure functions over floats and numpy arrays (numpy and scipy only: no torch, no Ray).

Γ̂_n (Eq. 8, `estimate_noniid_degree`), ρ̂_min (Eq. 9, `estimate_rho_min`), the
bound-predicted loss (Eq. 10, `bound_predicted_loss`) and P2 (`solve_p2`, §9.5), plus the
paper's Table III (`TABLE_III`) for the ``table3`` override. Symbols that clash in the paper
get distinct names here: the learning-rate offset γ is ``lr_offset``, the non-IID degree Γ_n
is ``noniid`` and the gradient variance σ² of Assumption 3 is ``grad_var``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy.optimize import brentq, minimize_scalar

from raydpfl.papers.dpfl_bcs._checks import (
    _array,
    _count,
)
from raydpfl.papers.dpfl_bcs.bound import _bound, _BoundSums, convergence_bound


def estimate_noniid_degree(loss_before: object, loss_after: object) -> np.ndarray:
    """Γ̂_n = min over n's stage-1 participations of |F̂_n(ŵ^{t−1}) − F̂_n(w_n^t)| (Eq. 8, §9.2).

    Args:
        loss_before, loss_after: Arrays of shape (T0, N): row t−1 holds the reports of round t,
            F̂_n(ŵ^{t−1}) and F̂_n(w_n^t), and NaN where client n was not selected.

    Clients never selected in stage 1 get the mean of the others' Γ̂_n, as the paper says.
    """
    before = np.asarray(loss_before, dtype=float)
    after = np.asarray(loss_after, dtype=float)
    if before.ndim != 2 or before.shape != after.shape:
        raise ValueError("loss_before and loss_after must be 2-D arrays of the same shape")
    if not np.array_equal(np.isnan(before), np.isnan(after)):
        raise ValueError("loss_before and loss_after must be reported for the same rounds")
    if np.any(np.isinf(before)) or np.any(np.isinf(after)):
        raise ValueError("loss reports must be finite (NaN marks a missing report)")
    seen = ~np.all(np.isnan(before), axis=0)
    if not seen.any():
        raise ValueError("no client reported losses in stage 1")
    gamma = np.empty(before.shape[1])
    gamma[seen] = np.nanmin(np.abs(before[:, seen] - after[:, seen]), axis=0)
    gamma[~seen] = gamma[seen].mean()
    return gamma


def stage1_global_loss(reference_losses: object) -> float:
    """F̂(ŵ^{T0−1}) = mean of F̂_n(ŵ^{T0−1}) over the clients of S_{T0} (§9.3–9.4).

    ``reference_losses`` has one entry per client, NaN for clients not in S_{T0}.
    """
    ref = np.asarray(reference_losses, dtype=float)
    if ref.ndim != 1 or np.any(np.isinf(ref)) or np.all(np.isnan(ref)):
        raise ValueError("reference_losses must be 1-D, finite, with at least one report")
    return float(np.nanmean(ref))


def estimate_rho_min(
    counts: object, reference_losses: object, clients_per_round: int, stage1_rounds: int
) -> float:
    """ρ̂_min = Σ_n C_n·F̂_n(ŵ^{T0−1}) / (K·(T0−1)·F̂(ŵ^{T0−1})) (Eq. 9, §9.3).

    Args:
        counts: C_n, client n's selections in rounds 1..T0−1 (not T0).
        reference_losses: F̂_n(ŵ^{T0−1}) as reported in round T0; NaN for clients not in S_{T0},
            who are assigned the mean F̂(ŵ^{T0−1}) (F_n* = 0 throughout).
        clients_per_round: K.
        stage1_rounds: T0 (≥ 2).

    With Σ C_n = K(T0−1) this is the C-weighted mean of F̂_n/F̂, ≈ 1 (Table III: 0.94–1.11).
    """
    c = _array("counts", counts)
    ref = np.asarray(reference_losses, dtype=float)
    if ref.shape != c.shape:
        raise ValueError("counts and reference_losses must have the same length")
    k = _count("clients_per_round", clients_per_round)
    t0 = _count("stage1_rounds", stage1_rounds)
    if t0 < 2:
        raise ValueError(f"stage1_rounds must be >= 2 (Eq. 9 divides by T0 − 1), got {t0}")
    if np.any(c < 0) or c.sum() > k * (t0 - 1) + 1e-9:
        raise ValueError(f"counts must be >= 0 and sum to at most K·(T0−1) = {k * (t0 - 1)}")
    mean_loss = stage1_global_loss(ref)
    if mean_loss <= 0:
        # Heavy noise on the reports (σ/η, §4.5) can drive the mean below 0; Eq. 9 is then
        # meaningless, and the caller should fall back (e.g. to ρ̂ = 1 or Table III).
        raise ValueError(f"mean reported loss must be > 0 for Eq. 9, got {mean_loss}")
    filled = np.where(np.isnan(ref), mean_loss, ref)
    return float(np.sum(c * filled) / (k * (t0 - 1) * mean_loss))


def bound_predicted_loss(
    counts: object, phi: object, noniid: object, *, elapsed_rounds: int, **constants: float
) -> float:
    """F̃(ŵ^{T0−1}): Theorem 5's bound after T0−1 rounds with F* = 0 (Eq. 10, §9.4).

    Eq. (10) is Eq. (4) with T → T0 − 1 (``elapsed_rounds``) and T_n → C_n (``counts``, the
    selections in rounds 1..T0−1); Γ_n and ρ_min are the estimates of Eqs. (8)–(9). The
    ``constants`` are `convergence_bound`'s keyword arguments other than ``horizon``:
    init_distance_sq, lr_offset, grad_var, smoothness, strong_convexity, rho_min,
    noise_lambda, z and clients_per_round.
    """
    horizon = _count("elapsed_rounds", elapsed_rounds)
    return convergence_bound(counts, phi, noniid, **constants, horizon=horizon)


class P2Estimate(NamedTuple):
    """P2's solution (§9.4–9.5); only (L, μ, γ) reach P1, through `p1_ratio`."""

    init_distance_sq: float
    lr_offset: float
    grad_var: float
    smoothness: float
    strong_convexity: float
    residual: float  # F̂(ŵ^{T0−1}) − F̃(ŵ^{T0−1}) at the returned point
    sweeps: int


#: §9.5 [REC] box of P2's variables; L > μ is kept by coupling their bounds.
P2_MAX = {"init_distance_sq": 1e6, "grad_var": 1e6, "smoothness": 1e4, "lr_offset": 1e4}
P2_MIN_STRONG_CONVEXITY = 1e-6
P2_START = {
    "init_distance_sq": 0.0,
    "grad_var": 0.0,
    "smoothness": 1.0,
    "strong_convexity": 0.5,
    "lr_offset": 16.0,  # γ0 = 8·L0/μ0, Theorem 5's choice at the start point
}


def solve_p2(
    observed_loss: float,
    counts: object,
    phi: object,
    noniid: object,
    *,
    rho_min: float,
    noise_lambda: float,
    z: float,
    clients_per_round: int,
    elapsed_rounds: int,
    max_sweeps: int = 50,
    rel_tol: float = 1e-10,
) -> P2Estimate:
    """P2: min |F̂(ŵ^{T0−1}) − F̃(ŵ^{T0−1})| over X = ‖ŵ⁰−w*‖², γ, σ², L, μ (§9.4–9.5).

    §9.5 [REC]: deterministic alternating (coordinate) minimisation of the residual from the
    fixed start X = 0, σ² = 0, L = 1, μ = 0.5, γ = 16, in the order X, σ², L, μ, γ, within
    X, σ² ∈ [0, 1e6], L ∈ [μ(1+1e-6), 1e4], μ ∈ [1e-6, L(1−1e-6)], γ ∈ [0, 1e4]; at most
    ``max_sweeps`` sweeps, stopping once |r| < rel_tol·max(1, |F̂|). Each coordinate step goes
    to an exact root with `brentq` when the residual changes sign on the coordinate's interval,
    else to `minimize_scalar(method="bounded")` on r² — and never accepts a worse point.

    P2 is not identifiable: F̃ is affine and increasing in X and σ², so almost any (L, μ, γ)
    admits a zero residual, and the answer is set by the start point and the order. Typically
    the first X or σ² step already zeroes the residual and (L, μ, γ) stay at the start values.
    Log the result, or inject Table III with `TABLE_III` and `p1_ratio`.

    Args:
        observed_loss: F̂(ŵ^{T0−1}) from `stage1_global_loss`.
        counts, phi, noniid, rho_min, noise_lambda, z, clients_per_round, elapsed_rounds: as
            in `bound_predicted_loss` (elapsed_rounds = T0 − 1).
    """
    f_obs = float(observed_loss)
    if not math.isfinite(f_obs):
        raise ValueError(f"observed_loss must be finite, got {observed_loss}")
    point = dict(P2_START)
    # Validate once through the public bound (which P2 must match), then evaluate the same
    # formula from pre-computed sums: the coordinate searches call it thousands of times.
    bound_predicted_loss(
        counts,
        phi,
        noniid,
        **point,
        rho_min=rho_min,
        noise_lambda=noise_lambda,
        z=z,
        clients_per_round=clients_per_round,
        elapsed_rounds=elapsed_rounds,
    )
    c, phi_a, gam = (np.asarray(a, dtype=float) for a in (counts, phi, noniid))
    sums = _BoundSums(
        float(np.sum(c ** (z + 1) * phi_a)), float(np.sum(c * gam)), float(np.sum(gam)), c.size
    )
    k, t_e, lam, rho = int(clients_per_round), float(elapsed_rounds), float(noise_lambda), rho_min
    sweeps_max = _count("max_sweeps", max_sweeps)

    def residual(v: dict[str, float]) -> float:
        f_bound = _bound(
            sums,
            v["init_distance_sq"],
            v["lr_offset"],
            v["grad_var"],
            v["smoothness"],
            v["strong_convexity"],
            float(rho),
            lam,
            k,
            t_e,
        )
        return f_obs - f_bound

    def bounds(name: str) -> tuple[float, float]:
        if name == "smoothness":
            return point["strong_convexity"] * (1 + 1e-6), P2_MAX["smoothness"]
        if name == "strong_convexity":
            return P2_MIN_STRONG_CONVEXITY, point["smoothness"] * (1 - 1e-6)
        return 0.0, P2_MAX[name]

    target = rel_tol * max(1.0, abs(f_obs))
    r = residual(point)
    sweeps = 0
    order = ("init_distance_sq", "grad_var", "smoothness", "strong_convexity", "lr_offset")
    while abs(r) >= target and sweeps < sweeps_max:
        sweeps += 1
        for name in order:
            lo, hi = bounds(name)

            def along(v: float, name: str = name) -> float:
                return residual({**point, name: v})

            point[name] = _coordinate_step(along, lo, hi, point[name])
            r = residual(point)
            if abs(r) < target:
                break
    return P2Estimate(**point, residual=r, sweeps=sweeps)


def _coordinate_step(resid: Callable[[float], float], lo: float, hi: float, x: float) -> float:
    # Minimise |resid| over [lo, hi]: an exact root if the sign changes on the interval, else
    # the bounded minimum of resid²; keep x if nothing beats it (monotone descent).
    if not lo < hi:
        return x
    r_lo, r_hi = resid(lo), resid(hi)
    if r_lo == 0:
        candidate = lo
    elif r_hi == 0:
        candidate = hi
    elif r_lo * r_hi < 0:
        candidate = brentq(resid, lo, hi, xtol=1e-14 * max(1.0, hi), maxiter=500)
    else:
        res = minimize_scalar(
            lambda v: resid(v) ** 2,
            bounds=(lo, hi),
            method="bounded",
            options={"xatol": 1e-12 * max(1.0, hi)},
        )
        candidate = min((lo, hi, float(res.x)), key=lambda v: abs(resid(v)))
    return candidate if abs(resid(candidate)) < abs(resid(x)) else x


class Table3Row(NamedTuple):
    """One row of the paper's Table III (estimated problem constants)."""

    rho_min: float
    lr_offset: float
    smoothness: float
    strong_convexity: float


#: Table III of the seed (§9.6), keyed by (dataset, mechanism): the ``table3`` override of
#: §9.5. Note γ̂ ≠ 8L̂/μ̂ in every row: the authors treated γ as a free variable.
TABLE_III: dict[tuple[str, str], Table3Row] = {
    ("lending_club", "gaussian"): Table3Row(0.937, 0.277, 0.997, 0.239),
    ("lending_club", "laplace"): Table3Row(1.040, 1.046, 3.472, 1.063),
    ("mnist", "gaussian"): Table3Row(1.063, 1.960, 5.514, 4.986),
    ("mnist", "laplace"): Table3Row(1.039, 53.565, 106.463, 55.018),
    ("fashion_mnist", "gaussian"): Table3Row(1.050, 12.117, 18.062, 14.198),
    ("fashion_mnist", "laplace"): Table3Row(0.962, 144.688, 406.756, 200.645),
    ("femnist", "gaussian"): Table3Row(1.037, 5.971, 11.815, 10.515),
    ("femnist", "laplace"): Table3Row(1.053, 118.286, 310.663, 153.461),
    ("cifar10", "gaussian"): Table3Row(1.097, 1.958, 5.859, 5.678),
    ("cifar10", "laplace"): Table3Row(1.109, 66.112, 125.825, 63.722),
}
