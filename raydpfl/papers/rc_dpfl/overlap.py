"""RC-DPFL's separation, overlap and batch-size theory (§4, Lemma 4.1/4.2, §6.4).

Paper: "Mitigating Disparate Impact of Differential Privacy in Federated Learning through
Robust Clustering" (seed 004; implementation spec shared/specs/robust-clustering.md, cited
as §). Pure functions on numpy arrays and floats.

- Separation and overlap of the GMM's components: `separation_scores` (§6.4 [CODE]) and
  `overlap_from_separation` (Lemma 4.2).
- Theory (§4): `update_noise_variance` (Eq. 2/13/14), `pairwise_overlap` (Eq. 18),
  `overlap_after_batch_scaling` (Eq. 26) and its inverse `batch_scale_for_overlap`.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erfc, erfcinv

from raydpfl.papers.rc_dpfl._checks import (
    _check_int,
    _check_positive,
    _check_probability,
    _matrix,
    _vector,
)
from raydpfl.papers.rc_dpfl.accounting import steps_per_round

__all__ = [
    "batch_scale_for_overlap",
    "overlap_after_batch_scaling",
    "overlap_from_separation",
    "pairwise_overlap",
    "separation_scores",
    "update_noise_variance",
]


# --------------------------------------------------------------------------- #
# Separation and overlap of two components (Lemma 4.2, §6.4)
# --------------------------------------------------------------------------- #
def separation_scores(means: np.ndarray, variances: np.ndarray) -> np.ndarray:
    """Pairwise separation s_mm' = ‖μ_m − μ_m'‖ / (2·max(r_m, r_m')) (§6.4 [CODE]).

    r_m = √(per-coordinate variance of component m). For equal radii, s is the argument of
    Lemma 4.2's overlap O_mm' = 2Q(s) (Eq. 18 with per-coordinate std σ/√p = r).

    Args:
        means: (M, d) component means.
        variances: (M,) per-coordinate variances r_m² >= 0.

    Returns:
        (M, M) symmetric matrix with +inf on the diagonal (a component is not compared
        with itself); +inf off the diagonal where both radii are 0 and the means differ.

    Raises:
        ValueError: On malformed inputs.
    """
    mu = _matrix("means", means)
    var = _vector("variances", variances)
    if len(var) != len(mu) or np.any(var < 0):
        raise ValueError(f"variances must be {len(mu)} non-negative values, got {var}")
    distance = np.linalg.norm(mu[:, None, :] - mu[None, :, :], axis=-1)
    radius = np.sqrt(var)
    denominator = 2.0 * np.maximum(radius[:, None], radius[None, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = np.where(denominator > 0, distance / denominator, np.inf)
    scores = np.where((denominator == 0) & (distance == 0), 0.0, scores)
    np.fill_diagonal(scores, np.inf)
    return scores


def overlap_from_separation(separation: float | np.ndarray) -> float | np.ndarray:
    """O = 2Q(s) = erfc(s/√2): overlap of two equal-variance Gaussians (Lemma 4.2, Eq. 15-17).

    Args:
        separation: Separation score(s) s >= 0 (inf gives 0).

    Returns:
        The overlap in [0, 1], a float for scalar input.

    Raises:
        ValueError: If a score is negative or NaN.
    """
    s = np.asarray(separation, dtype=np.float64)
    if np.any(np.isnan(s)) or np.any(s < 0):
        raise ValueError(f"separation must be >= 0, got {separation!r}")
    overlap = erfc(s / math.sqrt(2.0))
    return float(overlap) if overlap.ndim == 0 else overlap


# --------------------------------------------------------------------------- #
# Theory: update noise, overlap and the batch-size rule (§4, Lemma 4.1/4.2)
# --------------------------------------------------------------------------- #
def update_noise_variance(
    num_samples: int,
    batch_size: int,
    learning_rate: float,
    clip_norm: float,
    noise_multiplier: float,
    num_params: int,
    *,
    local_epochs: int = 1,
    exact_steps: bool = False,
) -> float:
    """σ_i^{e2}(b): total DP-noise variance of one round's model update (Lemma 4.1).

    Eq. 2/14: σ² ≈ K·N·η²·p·c²·z²/b³; with `exact_steps`, Eq. 13:
    K·⌈N/b⌉·η²·p·c²·z²/b². Valid when clipping is effective for every sample and p ≫ 1
    (the stochastic-gradient variance is dropped, Eq. 9).

    Raises:
        ValueError: On out-of-range arguments.
    """
    n = _check_int("num_samples", num_samples, 1)
    b = _check_int("batch_size", batch_size, 1)
    k = _check_int("local_epochs", local_epochs, 1)
    p = _check_int("num_params", num_params, 1)
    eta = _check_positive("learning_rate", learning_rate)
    c = _check_positive("clip_norm", clip_norm)
    z = _check_positive("noise_multiplier", noise_multiplier, allow_zero=True)
    per_step = eta**2 * p * c**2 * z**2 / b**2
    steps = steps_per_round(n, b, k) if exact_steps else k * n / b
    return float(steps * per_step)


def pairwise_overlap(mean_distance: float, update_variance: float, num_params: int) -> float:
    """O_mm'(b¹) = 2Q(√p·Δ_mm'/(2σ¹)) (Lemma 4.2, Eq. 18).

    Args:
        mean_distance: Δ_mm' = ‖μ_m* − μ_m'*‖ >= 0.
        update_variance: σ^{12}, the total variance of an update (`update_noise_variance`).
        num_params: p.

    Raises:
        ValueError: On out-of-range arguments.
    """
    delta = _check_positive("mean_distance", mean_distance, allow_zero=True)
    variance = _check_positive("update_variance", update_variance)
    p = _check_int("num_params", num_params, 1)
    return float(overlap_from_separation(math.sqrt(p) * delta / (2.0 * math.sqrt(variance))))


def overlap_after_batch_scaling(overlap: float, scale: float, noise_ratio: float = 1.0) -> float:
    """O_mm'(k·b¹) from O_mm'(b¹): 2Q(√k·x), x = Q⁻¹(O/2) (Eq. 26).

    Eq. 22-25: multiplying the batch by k divides the mean distance by k and the update
    variance by k³, so the separation argument grows by √k. Eq. 26 assumes z unchanged;
    the spec (§9) finds z does change with q, so `noise_ratio` = z(b¹)/z(k·b¹) multiplies
    the argument (1 reproduces Eq. 26).

    Raises:
        ValueError: If overlap ∉ (0, 1] or scale/noise_ratio <= 0.
    """
    o = _check_probability("overlap", overlap)
    if o == 0.0:
        raise ValueError("overlap must be > 0 (an overlap of 0 stays 0)")
    k = _check_positive("scale", scale)
    r = _check_positive("noise_ratio", noise_ratio)
    x = math.sqrt(2.0) * float(erfcinv(o))  # 2Q(x) = erfc(x/√2) = O
    return float(overlap_from_separation(math.sqrt(k) * r * x))


def batch_scale_for_overlap(
    overlap: float, target_overlap: float, noise_ratio: float = 1.0
) -> float:
    """The batch factor k with O(k·b¹) = target, inverting Eq. 26: k = (x_t/(r·x))².

    The paper's own rule is simply b¹ = N_i (full batch, §4.1, with augmentation if N_i is
    too small, §4.3); this gives the factor the theory asks for, e.g. to check that N_i/b¹
    suffices. k < 1 means the current batch is already enough.

    Args:
        overlap: Current O(b¹) in (0, 1).
        target_overlap: Desired O in (0, 1).
        noise_ratio: z(b¹)/z(k·b¹), see `overlap_after_batch_scaling`.

    Raises:
        ValueError: If an overlap is outside (0, 1) or noise_ratio <= 0.
    """
    o = _check_probability("overlap", overlap)
    t = _check_probability("target_overlap", target_overlap)
    if not (0 < o < 1 and 0 < t < 1):
        raise ValueError(f"overlaps must lie in (0, 1), got {overlap!r} and {target_overlap!r}")
    r = _check_positive("noise_ratio", noise_ratio)
    x = math.sqrt(2.0) * float(erfcinv(o))
    x_target = math.sqrt(2.0) * float(erfcinv(t))
    return (x_target / (r * x)) ** 2
