"""FedFDP's convergence bound and λ* (shared/specs/fedfdp.md §7; Eqs. 17–22 and
Thm. 0.A.1 / Eq. 29 of Ling et al., seed 001).

The paper's Cardano closed form and a numeric minimiser of the convergence bound, with
`DegenerateBoundWarning` when the bound cannot give an interior optimum (§7.5).
"""

from __future__ import annotations

import cmath
import math
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.optimize import minimize_scalar

from raydpfl.privacy.accounting._checks import _count, _non_negative, _positive, _real

__all__ = [
    "BoundCoefficients",
    "BoundConstants",
    "DegenerateBoundWarning",
    "LambdaStar",
    "bound_coefficients",
    "cardano_roots",
    "convergence_bound",
    "lambda_star_cardano",
    "lambda_star_numeric",
]


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
