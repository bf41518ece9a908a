"""Calibration of single-release mechanisms: Gaussian ((ε, δ) classic and analytic, zCDP)
and Laplace, plus the zCDP ↔ (ε, δ) conversions.

Generic privacy arithmetic, used by any algorithm that releases a statistic once per
participation (DPFL-BCS's full-batch steps, loss reports, a registered algorithm's own
release). The Poisson-subsampled Gaussian of DP-SGD is calibrated in
`raydpfl.privacy.accounting.calibration` instead, through the accountants. Every function rejects
bad input with a ValueError naming the argument.
"""

from __future__ import annotations

import math

from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtr

__all__ = [
    "check_delta",
    "check_nonnegative",
    "check_positive",
    "gaussian_sigma_analytic",
    "gaussian_sigma_classic",
    "gaussian_sigma_zcdp",
    "laplace_scale",
    "zcdp_epsilon",
    "zcdp_rho",
]


def check_positive(name: str, value: float) -> float:
    """`value` as a float, refused (naming `name`) unless finite and > 0."""
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def check_nonnegative(name: str, value: float) -> float:
    """`value` as a float, refused (naming `name`) unless finite and >= 0."""
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value


def check_delta(name: str, value: float) -> float:
    """`value` as a float, refused (naming `name`) unless in the open interval (0, 1)."""
    value = float(value)
    if not 0 < value < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value}")
    return value


def zcdp_rho(epsilon: float, delta: float) -> float:
    """The zCDP budget ρ whose Bun–Steinke conversion is exactly (ε, δ)-DP (Bun & Steinke
    2016, Prop. 1.3; DPFL-BCS §4.4, ``zcdp``).

    Solves ε = ρ + 2·√(ρ·ln(1/δ)) for ρ: ρ = (√(ln(1/δ) + ε) − √ln(1/δ))².
    """
    eps = check_positive("epsilon", epsilon)
    log_inv = math.log(1.0 / check_delta("delta", delta))
    # (√(a+ε) − √a)² written as ε²/(√(a+ε) + √a)² to avoid cancellation when ε ≪ ln(1/δ).
    return eps**2 / (math.sqrt(log_inv + eps) + math.sqrt(log_inv)) ** 2


def zcdp_epsilon(rho: float, delta: float) -> float:
    """ε of ρ-zCDP at δ by the Bun–Steinke conversion ε = ρ + 2√(ρ ln(1/δ)) (§4.4, §10)."""
    rho = check_nonnegative("rho", rho)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / check_delta("delta", delta)))


def gaussian_sigma_classic(sensitivity: float, epsilon: float, delta: float) -> float:
    """σ = √(2 ln(1.25/δ))·Δ/ε, the single-query Gaussian mechanism of Theorem 1.

    Theorem 1 holds only for ε ∈ (0, 1) (and asks for c² > 2 ln(1.25/δ); the boundary value is
    the customary choice). Use `gaussian_sigma_analytic` for ε ≥ 1.
    """
    delta = check_delta("delta", delta)
    eps = check_positive("epsilon", epsilon)
    if eps >= 1:
        raise ValueError(f"Theorem 1 needs epsilon < 1, got {eps}; use the analytic mechanism")
    return (
        math.sqrt(2.0 * math.log(1.25 / delta)) * check_positive("sensitivity", sensitivity) / eps
    )


def _analytic_delta(scale: float, eps: float) -> float:
    # Balle & Wang (2018), Thm 8, with σ = scale·Δ:
    # δ(σ) = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ); the second term in log space.
    a, b = 0.5 / scale, eps * scale
    return float(ndtr(a - b) - math.exp(eps + log_ndtr(-a - b)))


def gaussian_sigma_analytic(sensitivity: float, epsilon: float, delta: float) -> float:
    """The smallest σ for which N(0, σ²I) is (ε, δ)-DP: the analytic Gaussian mechanism.

    Balle & Wang (2018), Theorem 8; valid for every ε > 0. §4.4 and §13.24 [REC] use it in
    ``paper_alg2`` when a participation's ε^l ≥ 1, where Theorem 1 does not apply.
    """
    sens = check_positive("sensitivity", sensitivity)
    eps = check_positive("epsilon", epsilon)
    delta = check_delta("delta", delta)
    # δ(s) falls from 1 (s → 0) to 0 (s → ∞); bracket the root in log s and solve.
    lo, hi = 1e-8, max(1.0, math.sqrt(2.0 * math.log(1.25 / delta)) / eps)
    while _analytic_delta(hi, eps) > delta:
        hi *= 2.0
    log_s = brentq(
        lambda u: _analytic_delta(math.exp(u), eps) - delta,
        math.log(lo),
        math.log(hi),
        xtol=1e-13,
        maxiter=500,
    )
    # brentq may land a hair below the root; step up to the first σ that certifies δ.
    s = math.exp(log_s)
    while _analytic_delta(s, eps) > delta:
        s = math.nextafter(s, math.inf) * (1 + 1e-14)
    return s * sens


def gaussian_sigma_zcdp(sensitivity: float, rho: float) -> float:
    """σ = Δ/√(2ρ): the Gaussian mechanism with L2 sensitivity Δ is Δ²/(2σ²)-zCDP (§4.4)."""
    return check_positive("sensitivity", sensitivity) / math.sqrt(2.0 * check_positive("rho", rho))


def laplace_scale(sensitivity: float, epsilon: float) -> float:
    """b = Δ₁/ε: the Laplace mechanism with L1 sensitivity Δ₁ and scale b is ε-DP
    (Dwork et al. 2006, Theorem 3.6 of Dwork & Roth)."""
    return check_positive("sensitivity", sensitivity) / check_positive("epsilon", epsilon)
