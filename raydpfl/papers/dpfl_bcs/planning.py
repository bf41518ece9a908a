"""DPFL-BCS's selection problem P1: participation plans and selection probabilities (§8).

Paper: "The Power of Bias: Optimizing Client Selection in Federated Learning with Heterogeneous
Differential Privacy" (Ma et al.; seed 003, implementation spec shared/specs/dpfl-bcs.md, cited
as §). Pure functions over floats and numpy arrays (numpy and scipy only: no torch, no Ray).

Proposition 1's closed form (`proposition1_plan`), the exact relaxed solution by KKT
water-filling (`solve_p1`) and an SLSQP cross-check (`solve_p1_slsqp`), integer plans by
largest remainder (`round_plan`, §8.5) and the selection probabilities p_n
(`selection_probabilities`).

Assumed throughout (the spec's [REC] choices, §13): plans are integers (a participation spends
remaining budget / T_n with T_n ≥ 1, so it can never overdraw); P1 carries the per-round cap
T_n ≤ T_s (p_n ≤ 1/K); stage 2 plans over T_s = T − T0 with the remaining budgets.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq, minimize

from raydpfl.papers.dpfl_bcs._checks import (
    _array,
    _count,
    _nonnegative,
    _positive,
    _upper,
)

# --------------------------------------------------------------------------------------------
# §8: problem P1 (min 𝒥 s.t. Σ T_n = K·T_s, 0 ≤ T_n ≤ U), normalised by Ω_A so that
# 𝒥/Ω_A = Σ Φ_n T_n^{z+1} + R·Σ Γ_n T_n.


def p1_objective(plan: object, phi: object, noniid: object, ratio: float, z: float) -> float:
    """𝒥/Ω_A = Σ Φ_n·T_n^{z+1} + R·Σ Γ_n·T_n, P1's objective up to the factor Ω_A (§8.4)."""
    t_n = _array("plan", plan)
    phi, gam = _p1_inputs(phi, noniid, ratio, z)
    if t_n.shape != phi.shape:
        raise ValueError("plan and phi must have the same length")
    t_n = np.maximum(t_n, 0.0)
    return float(np.sum(phi * t_n ** (z + 1)) + ratio * np.sum(gam * t_n))


def _p1_inputs(
    phi: object, noniid: object, ratio: float, z: float
) -> tuple[np.ndarray, np.ndarray]:
    phi = _array("phi", phi, positive=True)
    gam = _array("noniid", noniid)
    if gam.shape != phi.shape:
        raise ValueError("phi and noniid must have the same length")
    _nonnegative("ratio", ratio)
    _positive("z", z)
    return phi, gam


def _p1_problem(
    phi: object, noniid: object, ratio: float, total: float, upper: float, z: float
) -> tuple[np.ndarray, np.ndarray, float, float]:
    # The checked (Φ, Γ, U, total) of the relaxed P1, refused if the box cannot hold total.
    phi, gam = _p1_inputs(phi, noniid, ratio, z)
    upper = _upper(upper)
    total = float(total)
    _p1_feasible(phi.size, total, upper)
    return phi, gam, upper, total


def _p1_feasible(n: int, total: float, upper: float) -> None:
    _positive("total", total)
    if n * upper < total * (1 - 1e-12):
        raise ValueError(
            f"P1 is infeasible: {n} clients with at most {upper:g} participations each "
            f"cannot make up total = {total:g}"
        )


def proposition1_plan(phi: object, z: float, total: float) -> np.ndarray:
    """Proposition 1: T_{n,0}* = total / Σ_{n′} (Φ_n/Φ_{n′})^{1/z}, i.e. T_n ∝ Φ_n^{−1/z}.

    The minimiser of P1 when Γ_n = 0 (IID data) with no cap (§8.3, Appendix D); total = K·T.
    GM: T_n ∝ D_n²ε_n²/ln(1/δ_n); LM: T_n ∝ D_n·ε_n. It may exceed the per-round cap T
    (§8.7); the capped IID plan is `solve_p1` with noniid = 0.
    """
    phi = _array("phi", phi, positive=True)
    z = _positive("z", z)
    total = _positive("total", total)
    # Weights Φ^{−1/z} normalised in log space, so extreme Φ cannot overflow.
    log_w = -np.log(phi) / z
    w = np.exp(log_w - log_w.max())
    return total * w / w.sum()


def solve_p1(
    phi: object,
    noniid: object,
    ratio: float,
    total: float,
    upper: float = math.inf,
    z: float = 1.0,
) -> np.ndarray:
    """Exact minimiser of the relaxed P1 with box 0 ≤ T_n ≤ U, by KKT water-filling (§8.4).

    P1 (Eq. 5) relaxed to real T_n is convex (Theorem 6). With multiplier θ for Σ T_n = total
    the KKT conditions give T_n(θ) = min(U, [(θ − RΓ_n)_+ / ((z+1)Φ_n)]^{1/z}), non-decreasing
    in θ; the unique θ* with Σ T_n(θ*) = total is found by `scipy.optimize.brentq`.

    Args:
        phi: Φ_n (> 0), from `noise_constants`.
        noniid: Γ_n (Γ̂_n from `estimate_noniid_degree`; zeros give the IID plan).
        ratio: R = Ω_B/Ω_A from `p1_ratio` (irrelevant when noniid is zero).
        total: K·T_s.
        upper: U; §8.5 [REC] is U = T_s (a client joins a round at most once, p_n ≤ 1/K).
            ``inf`` with noniid = 0 reproduces Proposition 1.
        z: 1 for GM, 2 for LM (or an ablation's override).
    """
    phi, gam, upper, total = _p1_problem(phi, noniid, ratio, total, upper, z)
    if upper < math.inf and phi.size * upper <= total:
        return np.full(phi.size, upper)  # the box leaves exactly one feasible point
    offset = ratio * gam
    slope = (z + 1.0) * phi

    def plan_at(theta: float) -> np.ndarray:
        return np.minimum(upper, (np.maximum(theta - offset, 0.0) / slope) ** (1.0 / z))

    # At θ = min RΓ_n every T_n is 0; at θ_hi every T_n ≥ min(U, total), so the sum ≥ total.
    lo = float(offset.min())
    hi = float(np.max(offset + slope * min(upper, total) ** z))
    # The spec's xtol ≈ 1e-14·θ_hi is too coarse when θ* ≪ θ_hi (U = inf, z = 2 missed Σ T_n by
    # ~1e-8·total); a negligible absolute xtol leaves brentq's relative tolerance in charge.
    theta = brentq(
        lambda th: float(plan_at(th).sum()) - total,
        lo,
        hi,
        xtol=1e-30 * (hi - lo),
        rtol=4 * np.finfo(float).eps,
        maxiter=1000,
    )
    return plan_at(theta)


def solve_p1_slsqp(
    phi: object,
    noniid: object,
    ratio: float,
    total: float,
    upper: float = math.inf,
    z: float = 1.0,
) -> np.ndarray:
    """Relaxed P1 by `scipy.optimize.minimize(method="SLSQP")`: the test oracle of §8.6.

    Same problem and arguments as `solve_p1`, solved generically (bounds [0, U], equality
    Σ T_n = total, analytic gradients, start at the uniform plan). Slower and less exact than
    the water-filling; use it only to cross-check.
    """
    phi, gam, upper, total = _p1_problem(phi, noniid, ratio, total, upper, z)
    x0 = np.full(phi.size, total / phi.size)
    # Normalise 𝒥 to ≈ 1 at the start so SLSQP's absolute ftol means the same on every scale.
    scale = p1_objective(x0, phi, gam, ratio, z) or 1.0

    def fun(x: np.ndarray) -> float:
        x = np.maximum(x, 0.0)
        return float(np.sum(phi * x ** (z + 1)) + ratio * np.sum(gam * x)) / scale

    def jac(x: np.ndarray) -> np.ndarray:
        return ((z + 1) * phi * np.maximum(x, 0.0) ** z + ratio * gam) / scale

    res = minimize(
        fun,
        x0,
        jac=jac,
        method="SLSQP",
        bounds=[(0.0, None if upper == math.inf else upper)] * phi.size,
        constraints=[
            {
                "type": "eq",
                "fun": lambda x: np.array([x.sum() - total]),
                "jac": lambda x: np.ones((1, x.size)),
            }
        ],
        options={"ftol": 1e-13, "maxiter": 2000},
    )
    if not res.success:
        raise RuntimeError(f"SLSQP did not converge: {res.message}")
    return np.clip(res.x, 0.0, upper)


def round_plan(plan: object, total: int, upper: float = math.inf) -> np.ndarray:
    """Integer plan by largest remainder: floor every T_n, then +1 to the largest fractions.

    §8.5 [REC]: the result sums to exactly ``total`` (K·T_s), keeps 0 ≤ T_n ≤ U and moves no
    entry by 1 or more. Ties in the fractional part go to the lower client index, so the plan
    is deterministic. ``plan`` must already satisfy the constraints (to 1e-9·total), as the
    output of `solve_p1` does; clients rounded to 0 get p_n = 0 for the stage.
    """
    x = _array("plan", plan)
    total = _count("total", total)
    upper = _upper(upper)
    if upper < math.inf and not upper.is_integer():
        raise ValueError(f"upper must be an integer or inf, got {upper}")
    tol = 1e-9 * total
    if np.any(x < -tol) or np.any(x > upper + tol):
        raise ValueError(f"plan must lie in [0, {upper:g}]")
    if abs(x.sum() - total) > tol:
        raise ValueError(f"plan sums to {x.sum():.12g}, not total = {total}")
    x = np.clip(x, 0.0, upper)
    base = np.floor(x)
    frac = x - base
    deficit = total - int(base.sum())
    eligible = np.flatnonzero(base + 1 <= upper)
    # Stable sort on −frac: largest remainder first, lower index first among ties.
    order = eligible[np.argsort(-frac[eligible], kind="stable")]
    if not 0 <= deficit <= order.size:
        raise ValueError("plan cannot be rounded within the bounds")  # unreachable if checked
    base[order[:deficit]] += 1
    return base.astype(np.int64)


def selection_probabilities(plan: object, clients_per_round: int, horizon: int) -> np.ndarray:
    """p_n = T_n/(K·T_s) (§5 framework step 1; Algorithm 1 line 27 with T_s = T − T0).

    Σ p_n = 1; the per-round inclusion probability is K·p_n = T_n/T_s, which the cap T_n ≤ T_s
    keeps ≤ 1.
    """
    t_n = _array("plan", plan)
    k = _count("clients_per_round", clients_per_round)
    t_s = _count("horizon", horizon)
    if np.any(t_n < 0):
        raise ValueError("plan must be >= 0")
    if abs(t_n.sum() - k * t_s) > 1e-9 * k * t_s:
        raise ValueError(f"plan sums to {t_n.sum():.12g}, not K·T_s = {k * t_s}")
    return t_n / (k * t_s)
