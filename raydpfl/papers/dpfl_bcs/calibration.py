"""DPFL-BCS's noise calibration: sensitivities, budget split, Gaussian and Laplace noise (§4).

Paper: "The Power of Bias: Optimizing Client Selection in Federated Learning with Heterogeneous
Differential Privacy" (Ma et al.; seed 003, implementation spec shared/specs/dpfl-bcs.md, cited
as §). Pure functions over floats and numpy arrays (numpy and scipy only: no torch, no Ray).

- Sensitivities of the full-batch clipped local step (`gradient_sensitivity`,
  `stage1_sensitivity`, Lemmas 1–2, Eq. 13), the per-participation budget split
  (`per_participation_budget`), Gaussian noise in the three modes of §4.4
  (`gaussian_noise_std`: ``zcdp`` — the sound default, ``paper_alg2`` — literal Algorithm 2
  (`paper_alg2_sigma`), ``thm2_c2`` — literal Lemma 1), Laplace noise (`laplace_noise_scale`)
  and the noise on stage-1 loss reports (`loss_report_noise_scale`, §4.5).
- The unified noise constants (Λ, z, Φ_n) of Eq. (7) (`noise_constants`,
  `expected_noise_sq_norm`, §4.2, §9.1).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import numpy as np

from raydpfl.papers.dpfl_bcs._checks import (
    _count,
    _delta,
    _positive,
)

# The generic single-release calibrations live in raydpfl.privacy.accounting.single_release;
# re-exported here because the paper's calibration modes (§4.4) are written in their terms.
from raydpfl.privacy.accounting.single_release import (  # noqa: F401
    gaussian_sigma_analytic,
    gaussian_sigma_classic,
    gaussian_sigma_zcdp,
    laplace_scale,
    zcdp_epsilon,
    zcdp_rho,
)

Mechanism = Literal["gaussian", "laplace"]
GaussianCalibration = Literal["zcdp", "paper_alg2", "thm2_c2"]

#: §9.1 [REC]: the c2 of Theorem 2 is never given; √2 is the small-ε limit of the c2 that makes
#: ``thm2_c2`` equal to the rigorous ``zcdp`` calibration (§4.4 table: 1.42–1.67).
DEFAULT_C2 = math.sqrt(2.0)

_MECHANISMS = ("gaussian", "laplace")
_CALIBRATIONS = ("zcdp", "paper_alg2", "thm2_c2")


# --------------------------------------------------------------------------------------------
# §4: sensitivities, budget split and noise calibration (per participation, per coordinate).


def gradient_sensitivity(lr: float, clip: float, dataset_size: float) -> float:
    """Sensitivity of the stage-2 upload g = η·(1/D_n)·Σ clipped per-sample gradients.

    Lemma 1 (GM, L2) and Lemma 2 (LM, L1), §4.1: Δg_n = 2·η_t·Ξ/D_n under replace-one
    adjacency, with Ξ = the clip bound B in the mechanism's norm (L2 for GM, L1 for LM).
    """
    lr, clip = _positive("lr", lr), _positive("clip", clip)
    return 2.0 * lr * clip / _positive("dataset_size", dataset_size)


def stage1_sensitivity(lr: float, clip: float, loss_bound: float, dataset_size: float) -> float:
    """Sensitivity of the stage-1 upload [g; η·F_n(ŵ^{t−1}); η·F_n(w_n^t)] (Eq. 13, §4.1).

    Δg′_n = (2η_tΞ + 2η_tΘ)/D_n: each per-sample-loss mean (losses clipped to [0, Θ]) moves by
    at most Θ/D_n, and the triangle inequality makes the sum a valid L1 and L2 bound. As the
    spec notes (§10), F_n(w_n^t) is evaluated at the clean local model, which itself depends on
    the data, so Θ/D_n is the paper's claim rather than a proof; this returns the paper's value.
    """
    loss_part = 2.0 * _positive("lr", lr) * _positive("loss_bound", loss_bound)
    return gradient_sensitivity(lr, clip, dataset_size) + loss_part / float(dataset_size)


def per_participation_budget(
    epsilon: float, delta: float, participations: int
) -> tuple[float, float]:
    """(ε^l, δ^l) = (ε/T_n, δ/T_n): the even split of Algorithm 2, line 5 (§4.3).

    Pass the stage's budget: the full (ε_n, δ_n) with the Proposition-1 plan in stage 1, the
    remaining budget with the P1 plan in stage 2. Use δ = 0 for the Laplace mechanism. Basic
    composition over the T_n participations then spends exactly the given budget.
    """
    eps = _positive("epsilon", epsilon)
    delta = float(delta)
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    t = _count("participations", participations)
    return eps / t, delta / t


def gaussian_noise_std(
    sensitivity: float,
    epsilon: float,
    delta: float,
    participations: int,
    *,
    calibration: GaussianCalibration = "zcdp",
    c2: float = DEFAULT_C2,
) -> float:
    """Per-coordinate Gaussian noise std of one participation out of T_n (§4.4, §6.5 Noise).

    (ε, δ) is the budget of the stage (full budget in stage 1, remaining in stage 2) and
    ``participations`` its integer plan T_n.

    - ``zcdp`` (default; sound and exactly z = 1): ρ = `zcdp_rho`(ε, δ), ρ^l = ρ/T_n,
      σ = Δ/√(2ρ^l) = Δ·√(T_n/(2ρ)). A zCDP ledger that carries the remaining ρ instead of
      (ε, δ) calls `gaussian_sigma_zcdp`(Δ, ρ_remaining/T_n) directly.
    - ``paper_alg2`` (literal Algorithm 2, for reproduction): (ε^l, δ^l) = (ε/T_n, δ/T_n) and
      Theorem 1, σ = √(2 ln(1.25/δ^l))·Δ/ε^l; the analytic Gaussian mechanism when ε^l ≥ 1
      (§13.24). Sound by basic composition, but σ ∝ T_n, i.e. z ≈ 2, not Lemma 1's z = 1.
    - ``thm2_c2`` (literal Lemma 1 / Theorem 2): σ = c2·Δ·√(T_n ln(1/δ))/ε; a valid guarantee
      only if c2 is large enough (compare with ``zcdp``).
    """
    sens = _positive("sensitivity", sensitivity)
    eps = _positive("epsilon", epsilon)
    delta = _delta("delta", delta)
    t = _count("participations", participations)
    if calibration == "zcdp":
        return gaussian_sigma_zcdp(sens, zcdp_rho(eps, delta) / t)
    if calibration == "paper_alg2":
        return paper_alg2_sigma(sens, *per_participation_budget(eps, delta, t))
    if calibration == "thm2_c2":
        return _positive("c2", c2) * sens * math.sqrt(t * math.log(1.0 / delta)) / eps
    raise ValueError(f"calibration must be one of {_CALIBRATIONS}, got {calibration!r}")


def paper_alg2_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Gaussian noise std of one (ε^l, δ^l) participation by Algorithm 2 (§4.4 ``paper_alg2``).

    Theorem 1, σ = √(2 ln(1.25/δ^l))·Δ/ε^l, while ε^l < 1; the analytic Gaussian mechanism
    when ε^l ≥ 1, where Theorem 1 does not hold (§13.24).
    """
    if epsilon < 1:
        return gaussian_sigma_classic(sensitivity, epsilon, delta)
    return gaussian_sigma_analytic(sensitivity, epsilon, delta)


def laplace_noise_scale(sensitivity: float, epsilon: float, participations: int = 1) -> float:
    """Per-coordinate Laplace scale b = Δ₁·T_n/ε of one participation out of T_n.

    Theorem 3 with ε^l = ε/T_n (Algorithm 2's split), which is exactly Theorem 4's b = TΔ₁/ε
    and Lemma 2 (variance 2b² per coordinate, z = 2). ε is the stage's (remaining) budget.
    """
    eps_l, _ = per_participation_budget(epsilon, 0.0, participations)
    return laplace_scale(sensitivity, eps_l)


def loss_report_noise_scale(coordinate_scale: float, lr: float) -> float:
    """Scale of the noise on a reported stage-1 loss value: coordinate scale / η_t (§4.5).

    Algorithm 2's `Loss` adds one coordinate of the (d+2)-vector's noise to η_t·F_n and divides
    by η_t again, so F̂_n carries the same law with its scale (Gaussian σ or Laplace b) divided
    by η_t. Pass the scale calibrated with `stage1_sensitivity`.
    """
    return _positive("coordinate_scale", coordinate_scale) / _positive("lr", lr)


# --------------------------------------------------------------------------------------------
# §4.2 / §9.1: the unified noise constants.


class NoiseConstants(NamedTuple):
    """E‖Z_n^t‖² = Λ·η_t²·T_n^z·Φ_n (the unified form after Lemmas 1–2; Eq. 7)."""

    noise_lambda: float
    z: float
    phi: np.ndarray


def noise_constants(
    mechanism: Mechanism,
    clip: float,
    dim: int,
    dataset_size: object,
    *,
    epsilon: object = None,
    delta: object = None,
    rho: object = None,
    calibration: GaussianCalibration = "zcdp",
    c2: float = DEFAULT_C2,
) -> NoiseConstants:
    """(Λ, z, Φ_n) of Eq. (7) for every client, from its (remaining) budget and D_n (§9.1).

    - Laplace (Lemma 2): Λ = 8·d·Ξ_L², z = 2, Φ_n = 1/(D_n²ε_n²).
    - Gaussian, ``paper_alg2`` or ``thm2_c2`` (Lemma 1): Λ = 4·Ξ_G²·d·c2², z = 1,
      Φ_n = ln(1/δ_n)/(D_n²ε_n²). Under ``paper_alg2`` this is the paper's (inconsistent) z = 1
      model, kept on purpose for reproduction (§4.4); override z in P1 for ablations.
    - Gaussian, ``zcdp`` (§4.4 [REC]): Λ = 4·Ξ_G²·d, z = 1, Φ_n = 1/(2·D_n²·ρ_n), with ρ_n given
      directly (a zCDP ledger's remaining ρ) or converted from (ε_n, δ_n) by `zcdp_rho`.

    ``clip`` is Ξ = B; budgets and sizes broadcast to one value per client. Stage 1's larger
    sensitivity (Ξ + Θ, Eq. 13) would scale Λ alone, by the same factor for every client, so
    Proposition 1 is unaffected; like the paper, Λ here uses Ξ.
    """
    clip = _positive("clip", clip)
    d = _count("dim", dim)
    sizes = np.atleast_1d(np.asarray(dataset_size, dtype=float))
    if not np.all(np.isfinite(sizes) & (sizes > 0)):
        raise ValueError("dataset_size must be finite and > 0")
    if mechanism == "laplace":
        eps = _budget_array("epsilon", epsilon)
        sizes, eps = np.broadcast_arrays(sizes, eps)
        return NoiseConstants(8.0 * d * clip**2, 2.0, 1.0 / (sizes**2 * eps**2))
    if mechanism != "gaussian":
        raise ValueError(f"mechanism must be one of {_MECHANISMS}, got {mechanism!r}")
    if calibration == "zcdp":
        if rho is None:
            eps = _budget_array("epsilon", epsilon)
            deltas = _delta_array(delta)
            eps, deltas = np.broadcast_arrays(eps, deltas)
            rho = [zcdp_rho(e, dl) for e, dl in zip(eps, deltas, strict=True)]
        rhos = _budget_array("rho", rho)
        sizes, rhos = np.broadcast_arrays(sizes, rhos)
        return NoiseConstants(4.0 * d * clip**2, 1.0, 1.0 / (2.0 * sizes**2 * rhos))
    if calibration not in _CALIBRATIONS:
        raise ValueError(f"calibration must be one of {_CALIBRATIONS}, got {calibration!r}")
    eps = _budget_array("epsilon", epsilon)
    deltas = _delta_array(delta)
    sizes, eps, deltas = np.broadcast_arrays(sizes, eps, deltas)
    c2 = _positive("c2", c2)
    return NoiseConstants(
        4.0 * d * clip**2 * c2**2, 1.0, np.log(1.0 / deltas) / (sizes**2 * eps**2)
    )


def _budget_array(name: str, values: object) -> np.ndarray:
    if values is None:
        raise ValueError(f"{name} is required for this mechanism and calibration")
    arr = np.atleast_1d(np.asarray(values, dtype=float))
    if not np.all(np.isfinite(arr) & (arr > 0)):
        raise ValueError(f"{name} must be finite and > 0")
    return arr


def _delta_array(values: object) -> np.ndarray:
    if values is None:
        raise ValueError("delta is required for the Gaussian mechanism")
    arr = np.atleast_1d(np.asarray(values, dtype=float))
    if not np.all((arr > 0) & (arr < 1)):
        raise ValueError("delta must be in (0, 1)")
    return arr


def expected_noise_sq_norm(
    noise_lambda: float, z: float, phi: float, lr: float, participations: float
) -> float:
    """E‖Z_n^t‖² = Λ·η_t²·T_n^z·Φ_n, the unified noise energy of Lemmas 1–2 (§4.2)."""
    return (
        _positive("noise_lambda", noise_lambda)
        * _positive("lr", lr) ** 2
        * _positive("participations", participations) ** _positive("z", z)
        * _positive("phi", phi)
    )
