"""DPFL-BCS's convergence bound (Theorem 5, Eq. 4) and the coefficients of P1 (§8.1, §8.4).

Paper: "The Power of Bias: Optimizing Client Selection in Federated Learning with Heterogeneous
Differential Privacy" (Ma et al.; seed 003, implementation spec shared/specs/dpfl-bcs.md, cited
as §). Pure functions over floats and numpy arrays (numpy and scipy only: no torch, no Ray).

`convergence_bound` evaluates Theorem 5's bound for a participation plan; `p1_coefficients`
and `p1_ratio` are the constants through which the bound enters the selection problem P1.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from raydpfl.papers.dpfl_bcs._checks import (
    _array,
    _count,
    _nonnegative,
    _positive,
)


def convergence_bound(
    plan: object,
    phi: object,
    noniid: object,
    *,
    init_distance_sq: float,
    lr_offset: float,
    grad_var: float,
    smoothness: float,
    strong_convexity: float,
    rho_min: float,
    noise_lambda: float,
    z: float,
    clients_per_round: int,
    horizon: float,
) -> float:
    """Theorem 5's bound on E[F(ŵ^T)] − F* for the plan {T_n} (Eq. 4, §7.3).

    (1/(γ+T))·(Lγ/2)·‖ŵ⁰−w*‖² + (1/(γ+T))·4Lσ²/(μ²K)
    + (1/((γ+T)T))·(4L²/(Kμ²))·Σ T_nΓ_n                     (non-IID)
    + (3L/(2μ))·Σ (T_n/(KT) − ρ_min/N)·Γ_n                  (biased selection)
    + (1/((γ+T)T))·(4LΛ/(K²μ²))·Σ T_n^{z+1}Φ_n              (noise).

    γ (``lr_offset``) is taken as given: Theorem 5 sets γ = 8L/μ, but P2 and Table III treat
    it as free (§9.5).
    """
    t_n = _array("plan", plan)
    phi = _array("phi", phi)
    gam = _array("noniid", noniid)
    if not (t_n.shape == phi.shape == gam.shape):
        raise ValueError("plan, phi and noniid must have the same length")
    x = _nonnegative("init_distance_sq", init_distance_sq)
    g = _nonnegative("lr_offset", lr_offset)
    s2 = _nonnegative("grad_var", grad_var)
    lip = _positive("smoothness", smoothness)
    mu = _positive("strong_convexity", strong_convexity)
    rho = _nonnegative("rho_min", rho_min)
    lam = _positive("noise_lambda", noise_lambda)
    z = _positive("z", z)
    k = _count("clients_per_round", clients_per_round)
    horizon = _positive("horizon", horizon)
    sums = _BoundSums(
        noise=float(np.sum(t_n ** (z + 1) * phi)),
        plan_noniid=float(np.sum(t_n * gam)),
        noniid=float(np.sum(gam)),
        clients=t_n.size,
    )
    return _bound(sums, x, g, s2, lip, mu, rho, lam, k, horizon)


class _BoundSums(NamedTuple):
    # The plan-dependent sums of Eq. (4): Σ T_n^{z+1}Φ_n, Σ T_nΓ_n, Σ Γ_n and N.
    noise: float
    plan_noniid: float
    noniid: float
    clients: int


def _bound(
    sums: _BoundSums,
    x: float,
    g: float,
    s2: float,
    lip: float,
    mu: float,
    rho: float,
    lam: float,
    k: int,
    horizon: float,
) -> float:
    gt = g + horizon
    return (
        x * lip * g / (2.0 * gt)
        + 4.0 * lip * s2 / (gt * mu**2 * k)
        + 4.0 * lip**2 / (gt * horizon * k * mu**2) * sums.plan_noniid
        + 1.5 * lip / mu * (sums.plan_noniid / (k * horizon) - rho * sums.noniid / sums.clients)
        + 4.0 * lip * lam / (gt * horizon * k**2 * mu**2) * sums.noise
    )


def p1_coefficients(
    smoothness: float,
    strong_convexity: float,
    lr_offset: float,
    noise_lambda: float,
    clients_per_round: int,
    horizon: float,
) -> tuple[float, float]:
    """(Ω_A, Ω_B) of P1's objective 𝒥 = Ω_A·Σ T_n^{z+1}Φ_n + Ω_B·Σ T_nΓ_n (§IV-A, §8.1).

    Ω_A = 4LΛ/((γ+T)·T·K²μ²) and Ω_B = 4L²/((γ+T)·T·Kμ²) + 3L/(2TKμ); T is the horizon of the
    stage being planned (T − T0 in stage 2, §13.8).
    """
    lip, mu, g, lam, k, t = _p1_constants(
        smoothness, strong_convexity, lr_offset, noise_lambda, clients_per_round, horizon
    )
    omega_a = 4.0 * lip * lam / ((g + t) * t * k**2 * mu**2)
    omega_b = 4.0 * lip**2 / ((g + t) * t * k * mu**2) + 3.0 * lip / (2.0 * t * k * mu)
    return omega_a, omega_b


def p1_ratio(
    smoothness: float,
    strong_convexity: float,
    lr_offset: float,
    noise_lambda: float,
    clients_per_round: int,
    horizon: float,
) -> float:
    """R = Ω_B/Ω_A = K·(L + 3μ(γ+T_s)/8)/Λ, the only combination of constants P1 needs (§8.4).

    The estimated (or Table III) L, μ, γ reach the selection only through R.
    """
    lip, mu, g, lam, k, t = _p1_constants(
        smoothness, strong_convexity, lr_offset, noise_lambda, clients_per_round, horizon
    )
    return k * (lip + 3.0 * mu * (g + t) / 8.0) / lam


def _p1_constants(
    lip: float, mu: float, g: float, lam: float, k: int, t: float
) -> tuple[float, float, float, float, int, float]:
    # (L, μ, γ, Λ, K, T) of `p1_coefficients` and `p1_ratio`, checked in that order.
    return (
        _positive("smoothness", lip),
        _positive("strong_convexity", mu),
        _nonnegative("lr_offset", g),
        _positive("noise_lambda", lam),
        _count("clients_per_round", k),
        _positive("horizon", t),
    )
