"""RC-DPFL's clustering stage, two-stage privacy accounting, theory and metrics.

Paper: "Mitigating Disparate Impact of Differential Privacy in Federated Learning through
Robust Clustering" (seed 004; implementation spec shared/specs/robust-clustering.md, cited
as §). Pure functions on numpy arrays (scikit-learn for the GMM, scipy for the Hungarian
matching, the project's accountants for ε); no Ray, no torch.

- Clustering stage (Algorithm 1, §3): `update_features` (flattened round-1 updates →
  centred PCA scores → min-max scaling, §6.5), `fit_update_gmm` / `gmm_posteriors`
  (spherical GMM, uniform weights at predict time), `sample_assignments` (R^e(i) ~ π_i,
  lines 9/18), `loss_assignments` (argmin_m f_i(θ_m), line 20), `private_select_clusters`
  and `selection_rdp` (the Gumbel/exponential-mechanism variant of §5.4),
  `pi_weighted_cluster_updates` (the optional round-1 initialisation of §6.2).
- Confidence and schedule: `separation_scores`, `overlap_from_separation` (Lemma 4.2),
  `select_num_clusters` (max-MSS rule, §6.4), `gmm_stage_rounds` (E_c rule, §6.7).
- Two-stage accounting (§5.2): `two_stage_history`, `two_stage_epsilon`,
  `two_stage_noise_multiplier`.
- Theory (§4): `update_noise_variance` (Eq. 2/13/14), `pairwise_overlap` (Eq. 18),
  `overlap_after_batch_scaling` (Eq. 26) and its inverse `batch_scale_for_overlap`.
- Metrics (§7.1, §6.20): `group_accuracies`, `worst_client_accuracy`,
  `max_accuracy_disparity`, `privacy_costs_accuracy`, `privacy_costs_loss`,
  `fairness_accuracy` (F_acc), `fairness_loss` (F_loss), `hungarian_clustering_accuracy`,
  `is_exact_partition`, `exact_partition_rate`.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import erfc, erfcinv

from raydpfl.privacy.accountants import (
    HistoryEntry,
    compute_epsilon,
    normalize_history,
    validate_accountant,
    validate_delta,
)

__all__ = [
    "PAPER_RDP_ORDERS",
    "UpdateGMM",
    "batch_scale_for_overlap",
    "exact_partition_rate",
    "fairness_accuracy",
    "fairness_loss",
    "fit_update_gmm",
    "gmm_posteriors",
    "gmm_stage_rounds",
    "group_accuracies",
    "hungarian_clustering_accuracy",
    "is_exact_partition",
    "loss_assignments",
    "max_accuracy_disparity",
    "overlap_after_batch_scaling",
    "overlap_from_separation",
    "pairwise_overlap",
    "pi_weighted_cluster_updates",
    "privacy_costs_accuracy",
    "privacy_costs_loss",
    "private_select_clusters",
    "sample_assignments",
    "select_num_clusters",
    "selection_noise_scale",
    "selection_rdp",
    "separation_scores",
    "steps_per_round",
    "two_stage_epsilon",
    "two_stage_history",
    "two_stage_noise_multiplier",
    "update_features",
    "update_noise_variance",
    "worst_client_accuracy",
]

#: RDP orders of the authors' moments accountant (§5.2 [CODE]): 1.1, 1.2, ..., 10.9 and
#: 12, ..., 64. Used only by the "paper_compat" accounting mode.
PAPER_RDP_ORDERS: tuple[float, ...] = (
    *(1 + x / 10.0 for x in range(1, 100)),
    *(float(a) for a in range(12, 65)),
)

#: Columns of the n×p update matrix processed at once when forming the Gram matrix: bounds
#: the float64 working copy to n · 2^20 · 8 bytes (170 MB for n = 21) for ResNet-18 updates.
_GRAM_CHUNK = 1 << 20

_FEATURE_SPACES = ("pca", "raw")
_SCALERS = ("minmax", "standard", "none")
_MODES = ("exact", "paper_compat")


# --------------------------------------------------------------------------- #
# Validation helpers
# --------------------------------------------------------------------------- #
def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_int(name: str, value: object, minimum: int) -> int:
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)  # type: ignore[arg-type]


def _check_positive(name: str, value: object, *, allow_zero: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    bound = ">= 0" if allow_zero else "> 0"
    if (
        not ok
        or not math.isfinite(float(value))  # type: ignore[arg-type]
        or float(value) < 0  # type: ignore[arg-type]
        or (float(value) == 0 and not allow_zero)  # type: ignore[arg-type]
    ):
        raise ValueError(f"{name} must be a finite real {bound}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def _check_probability(name: str, value: object) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok or not 0.0 <= float(value) <= 1.0:  # type: ignore[arg-type]
        raise ValueError(f"{name} must be a real in [0, 1], got {value!r}")
    return float(value)  # type: ignore[arg-type]


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def _vector(name: str, values: object) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite")
    return array


def _matrix(name: str, values: object) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 2 or 0 in array.shape:
        raise ValueError(f"{name} must be a non-empty 2-D array, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite")
    return array


def _labels(name: str, values: object) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integer labels, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _seed_of(random_state: int | np.random.Generator) -> int:
    # scikit-learn wants an int (or a legacy RandomState); a Generator is turned into one
    # reproducible int draw so callers can keep one Generator per stream (§6.6).
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**31 - 1))
    if not _is_int(random_state) or not 0 <= random_state < 2**32:  # type: ignore[operator]
        raise ValueError(
            f"random_state must be an int in [0, 2**32) or a numpy Generator, got {random_state!r}"
        )
    return int(random_state)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- #
# Clustering stage: features and GMM (Algorithm 1 line 7, §6.5)
# --------------------------------------------------------------------------- #
def _update_matrix(updates: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    if isinstance(updates, np.ndarray) and updates.ndim == 2:
        matrix = updates
    else:
        rows = [np.ravel(np.asarray(u)) for u in updates]
        if not rows:
            raise ValueError("updates must hold at least one client update")
        sizes = {r.size for r in rows}
        if len(sizes) != 1:
            raise ValueError(f"all client updates must have the same size, got {sorted(sizes)}")
        matrix = np.stack(rows)
    if matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise ValueError(f"updates must be a non-empty n×p matrix, got shape {matrix.shape}")
    if not np.issubdtype(matrix.dtype, np.floating):
        matrix = matrix.astype(np.float64)
    if not np.all(np.isfinite(matrix)):
        raise ValueError("updates must be finite")
    return matrix


def _centred_gram(matrix: np.ndarray) -> np.ndarray:
    # G = X Xᵀ accumulated in float64 over column blocks, then double-centred: H G H with
    # H = I − 11ᵀ/n is the Gram matrix of the centred rows, without forming X − mean (which
    # would copy an n × 11.2M ResNet-18 update matrix).
    n, p = matrix.shape
    gram = np.zeros((n, n), dtype=np.float64)
    for start in range(0, p, _GRAM_CHUNK):
        block = matrix[:, start : start + _GRAM_CHUNK].astype(np.float64, copy=False)
        gram += block @ block.T
    row_mean = gram.mean(axis=1, keepdims=True)
    return gram - row_mean - row_mean.T + gram.mean()


def _scale(features: np.ndarray, scaler: str) -> np.ndarray:
    if scaler == "none":
        return features
    if scaler == "minmax":
        low, span = features.min(axis=0), np.ptp(features, axis=0)
        # A constant column carries no information; map it to 0 instead of dividing by 0.
        return np.where(span > 0, (features - low) / np.where(span > 0, span, 1.0), 0.0)
    std = features.std(axis=0)
    centred = features - features.mean(axis=0)
    return np.where(std > 0, centred / np.where(std > 0, std, 1.0), 0.0)


def update_features(
    updates: np.ndarray | Sequence[np.ndarray],
    *,
    feature_space: Literal["pca", "raw"] = "pca",
    d_pca: int = 2,
    scaler: Literal["minmax", "standard", "none"] = "minmax",
) -> np.ndarray:
    """The GMM's input features from the round-1 client updates Δθ̃_i^1 (§6.5 [REC]).

    "pca" (default): centre the n×p update matrix (no per-coordinate standardisation),
    take the top-`d_pca` principal-component scores, computed through the n×n Gram matrix
    (exact PCA, cheap when p ≫ n), then scale each score column ("minmax" to [0, 1] as in
    the authors' code, "standard", or "none"). Fig. 1 of the paper shows these 2-D scores.
    Each component's sign is fixed so that its largest-magnitude score is positive, which
    makes the features deterministic. "raw": the flattened updates themselves (feasible for
    the CNN, p = 28,938); only `scaler="none"` is allowed there, since per-coordinate
    scaling would inflate pure-noise coordinates.

    Args:
        updates: An n×p array, or n arrays of equal size (flattened row-wise).
        feature_space: "pca" or "raw".
        d_pca: Number of principal components, 1 <= d_pca <= min(n − 1, p) (the centred
            matrix has rank <= n − 1). The spec's alternative choice is M − 1.
        scaler: "minmax", "standard" or "none".

    Returns:
        float64 features of shape (n, d_pca) ("pca") or (n, p) ("raw").

    Raises:
        ValueError: On malformed updates or out-of-range options.
    """
    if feature_space not in _FEATURE_SPACES:
        raise ValueError(f"feature_space must be one of {_FEATURE_SPACES}, got {feature_space!r}")
    if scaler not in _SCALERS:
        raise ValueError(f"scaler must be one of {_SCALERS}, got {scaler!r}")
    matrix = _update_matrix(updates)
    n, p = matrix.shape
    if feature_space == "raw":
        if scaler != "none":
            raise ValueError("feature_space='raw' needs scaler='none'")
        return matrix.astype(np.float64)
    if n < 2:
        raise ValueError(f"PCA features need at least 2 clients, got {n}")
    d_pca = _check_int("d_pca", d_pca, 1)
    if d_pca > min(n - 1, p):
        raise ValueError(f"d_pca must be <= min(n - 1, p) = {min(n - 1, p)}, got {d_pca}")
    eigenvalues, eigenvectors = np.linalg.eigh(_centred_gram(matrix))
    order = np.argsort(eigenvalues)[::-1][:d_pca]
    # Centred X = U S Vᵀ ⇒ the PCA scores X V = U S, and S² are the eigenvalues of X Xᵀ.
    scores = eigenvectors[:, order] * np.sqrt(np.clip(eigenvalues[order], 0.0, None))
    signs = np.sign(scores[np.argmax(np.abs(scores), axis=0), np.arange(d_pca)])
    scores = scores * np.where(signs == 0, 1.0, signs)
    return _scale(scores, scaler)


@dataclass(frozen=True, eq=False)
class UpdateGMM:
    """A GMM fitted to round-1 update features, with its clustering-confidence diagnostics.

    Attributes:
        posteriors: (n, M) soft assignments π_i, computed with uniform mixing weights.
        features: (n, d) features the GMM was fitted on.
        means: (M, d) component means.
        variances: (M,) per-coordinate variance r_m² of each component (the spherical
            variance; for other covariance types the mean of the diagonal).
        weights: (M,) mixing weights found by EM (the posteriors do not use them).
        separation: (M, M) pairwise separation scores (`separation_scores`).
        converged: Whether EM converged.
    """

    posteriors: np.ndarray
    features: np.ndarray
    means: np.ndarray
    variances: np.ndarray
    weights: np.ndarray
    separation: np.ndarray
    converged: bool

    @property
    def num_clusters(self) -> int:
        """Number of components M."""
        return int(self.posteriors.shape[1])

    @property
    def hard_labels(self) -> np.ndarray:
        """argmax_m π_i, the GMM's hard clustering (ties to the lowest index)."""
        return np.argmax(self.posteriors, axis=1)

    @property
    def min_separation(self) -> float:
        """MSS: the smallest pairwise separation score (inf when M = 1)."""
        return _min_offdiag(self.separation)

    @property
    def max_overlap(self) -> float:
        """O(ψ): the largest pairwise overlap 2Q(s_mm'), Lemma 4.2 (0 when M = 1)."""
        return float(overlap_from_separation(self.min_separation))


def _min_offdiag(matrix: np.ndarray) -> float:
    m = matrix.shape[0]
    if m < 2:
        return math.inf
    return float(np.min(matrix[~np.eye(m, dtype=bool)]))


def _component_variances(covariances: np.ndarray, covariance_type: str, m: int) -> np.ndarray:
    cov = np.asarray(covariances, dtype=np.float64)
    if covariance_type == "spherical":
        return cov
    if covariance_type == "diag":
        return cov.mean(axis=1)
    if covariance_type == "tied":
        return np.full(m, np.trace(cov) / cov.shape[0])
    return np.trace(cov, axis1=1, axis2=2) / cov.shape[1]


def fit_update_gmm(
    features: np.ndarray,
    num_clusters: int,
    *,
    random_state: int | np.random.Generator = 0,
    covariance_type: Literal["spherical", "diag", "tied", "full"] = "spherical",
    init_params: str = "k-means++",
    tol: float = 1e-6,
    n_init: int = 1,
    max_iter: int = 100,
    uniform_posterior_weights: bool = True,
) -> UpdateGMM:
    """Soft-clusters the round-1 update features with a GMM (Algorithm 1 line 7, §6.5).

    `sklearn.mixture.GaussianMixture(M, covariance_type="spherical", init_params=
    "k-means++", tol=1e-6, weights_init=1/M)` as in the authors' code. The spherical
    covariance is the model of Eq. 4 (per-coordinate DP noise is iid, Σ_m* = σ²/p · I).
    After fitting, the posteriors are computed with uniform mixing weights 1/M, so the
    3-client minority cluster gets no prior penalty (§6.5).

    Args:
        features: (n, d) features, e.g. from `update_features`; n >= num_clusters.
        num_clusters: M >= 1.
        random_state: An int seed for scikit-learn, or a Generator to draw one from.
        covariance_type: scikit-learn covariance type.
        init_params: scikit-learn initialisation ("k-means++", "kmeans", ...).
        tol: EM convergence tolerance.
        n_init: Number of EM restarts (the best likelihood is kept).
        max_iter: EM iterations per restart.
        uniform_posterior_weights: Use weights 1/M for the posteriors (default, §6.5);
            False keeps the fitted weights.

    Returns:
        The `UpdateGMM`.

    Raises:
        ValueError: On malformed features or out-of-range options.
    """
    from sklearn.mixture import GaussianMixture

    x = _matrix("features", features)
    m = _check_int("num_clusters", num_clusters, 1)
    if x.shape[0] < m:
        raise ValueError(f"need at least num_clusters={m} clients, got {x.shape[0]}")
    seed = _seed_of(random_state)
    gmm = GaussianMixture(
        n_components=m,
        covariance_type=covariance_type,
        tol=_check_positive("tol", tol),
        init_params=init_params,
        n_init=_check_int("n_init", n_init, 1),
        max_iter=_check_int("max_iter", max_iter, 1),
        weights_init=np.full(m, 1.0 / m),
        random_state=seed,
    )
    gmm.fit(x)
    fitted_weights = np.array(gmm.weights_, dtype=np.float64)
    if uniform_posterior_weights:
        gmm.weights_ = np.full(m, 1.0 / m)
    posteriors = gmm.predict_proba(x)
    means = np.array(gmm.means_, dtype=np.float64)
    variances = _component_variances(gmm.covariances_, covariance_type, m)
    return UpdateGMM(
        posteriors=posteriors,
        features=x,
        means=means,
        variances=variances,
        weights=fitted_weights,
        separation=separation_scores(means, variances),
        converged=bool(gmm.converged_),
    )


def gmm_posteriors(
    updates: np.ndarray | Sequence[np.ndarray],
    num_clusters: int,
    *,
    random_state: int | np.random.Generator = 0,
    feature_space: Literal["pca", "raw"] = "pca",
    d_pca: int = 2,
    scaler: Literal["minmax", "standard", "none"] = "minmax",
) -> np.ndarray:
    """π: the (n, M) GMM posteriors of the round-1 updates (Algorithm 1 line 7, §6.5).

    `update_features` followed by `fit_update_gmm` with the spec's defaults; use those two
    directly for the diagnostics (MSS, overlap) or other GMM options.
    """
    features = update_features(updates, feature_space=feature_space, d_pca=d_pca, scaler=scaler)
    return fit_update_gmm(features, num_clusters, random_state=random_state).posteriors


# --------------------------------------------------------------------------- #
# Separation, overlap, M and E_c (Lemma 4.2, §6.4, §6.7)
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


def select_num_clusters(
    features: np.ndarray,
    candidates: Iterable[int] | None = None,
    *,
    random_state: int | np.random.Generator = 0,
) -> tuple[int, dict[int, float]]:
    """Chooses M by the largest minimum pairwise separation score (MSS, §6.4).

    Not in the seed, which assumes M known (its stated limitation); the authors' later code
    has this rule disabled. For each candidate M a GMM is fitted (`fit_update_gmm` with the
    default options and the same integer seed) and the M with the largest MSS wins; ties go
    to the smallest M.

    Args:
        features: (n, d) update features.
        candidates: Candidate values of M, each in [2, n − 1]; default 2..min(10, n − 1).
        random_state: An int seed, or a Generator to draw one from (once, shared by all M).

    Returns:
        (best M, {M: MSS}).

    Raises:
        ValueError: If no candidate is valid or n < 3.
    """
    x = _matrix("features", features)
    n = x.shape[0]
    if n < 3:
        raise ValueError(f"choosing M needs at least 3 clients, got {n}")
    values = list(range(2, min(10, n - 1) + 1)) if candidates is None else list(candidates)
    if not values:
        raise ValueError("candidates must not be empty")
    for m in values:
        if not _is_int(m) or not 2 <= m <= n - 1:
            raise ValueError(f"every candidate M must be an integer in [2, {n - 1}], got {m!r}")
    seed = _seed_of(random_state)
    scores = {int(m): fit_update_gmm(x, int(m), random_state=seed).min_separation for m in values}
    best = max(sorted(scores), key=lambda m: scores[m])  # max keeps the first (smallest) tie
    return best, scores


def gmm_stage_rounds(max_overlap: float, total_rounds: int) -> int:
    """E_c, the number of rounds trained with GMM-sampled assignments (§6.7 [CODE] rule).

    E_c = int((1 − O)·E/2) with O the GMM's maximum pairwise overlap: about E/2 when the
    clusters are well separated, fewer rounds when the round-1 clustering is uncertain. The
    seed gives no rule. Clamped to at least 1 (Algorithm 1 always has its GMM stage); the
    formula never exceeds E/2, so loss-based rounds always follow when E >= 2. Per
    Algorithm 1 as printed, rounds 2..E_c+1 then train with R ~ π and the first loss-based
    assignment is made at the end of round E_c + 1 (§3.2; the paper's prose says E_c − 1
    GMM rounds, an off-by-one against its own pseudo-code).

    Args:
        max_overlap: O(ψ) in [0, 1].
        total_rounds: E >= 1.

    Returns:
        E_c in [1, max(1, E // 2)].

    Raises:
        ValueError: On out-of-range arguments.
    """
    overlap = _check_probability("max_overlap", max_overlap)
    rounds = _check_int("total_rounds", total_rounds, 1)
    return max(1, int((1.0 - overlap) * rounds / 2))


# --------------------------------------------------------------------------- #
# Assignments (Algorithm 1 lines 9, 18, 20; §5.4; §6.2)
# --------------------------------------------------------------------------- #
def sample_assignments(posteriors: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """R^e(i) ~ Categorical(π_i) independently per client (Algorithm 1 lines 9 and 18).

    A fresh draw every round from the fixed π (§6.6), so client i trains cluster m's model
    in a fraction π_im of the GMM-stage rounds in expectation.

    Args:
        posteriors: (n, M) rows of probabilities (non-negative, summing to 1 within 1e-6).
        rng: Source of randomness.

    Returns:
        int64 cluster indices of shape (n,).

    Raises:
        ValueError: If a row is not a probability vector or `rng` is not a Generator.
    """
    pi = _matrix("posteriors", posteriors)
    _check_rng(rng)
    if np.any(pi < 0) or not np.allclose(pi.sum(axis=1), 1.0, atol=1e-6):
        raise ValueError("every row of posteriors must be non-negative and sum to 1")
    cumulative = np.cumsum(pi, axis=1)
    cumulative[:, -1] = 1.0  # guard against rows summing to 1 − 1e-16
    draws = rng.random(pi.shape[0])
    # Inverse-CDF: the first m with u < F_m; components of probability 0 are never chosen.
    return np.argmax(draws[:, None] < cumulative, axis=1).astype(np.int64)


def loss_assignments(losses: np.ndarray) -> np.ndarray:
    """R(i) = argmin_m f_i(θ_m), ties to the lowest index (Algorithm 1 line 20, §6.13).

    Args:
        losses: (n, M) train losses of every client under every cluster model.

    Returns:
        int64 cluster indices of shape (n,).

    Raises:
        ValueError: If `losses` is not a finite 2-D array.
    """
    return np.argmin(_matrix("losses", losses), axis=1).astype(np.int64)


def selection_noise_scale(num_samples: int | np.ndarray, epsilon_select: float) -> np.ndarray:
    """Gumbel scale 2Δ/ε of the private selection on accuracies in % (§5.4 [CODE]).

    Δ = 100/(N_i − 1) bounds the change of a train accuracy in % when one record is added
    or removed (add/remove adjacency: |c/N − c'/(N ± 1)| <= 1/(N − 1) for the smaller
    dataset of the pair), so this is the exponential mechanism with ε_select.

    Raises:
        ValueError: If a size is < 2 or ε_select <= 0.
    """
    eps = _check_positive("epsilon_select", epsilon_select)
    sizes = np.atleast_1d(np.asarray(num_samples))
    if not np.issubdtype(sizes.dtype, np.integer) or sizes.ndim != 1 or np.any(sizes < 2):
        raise ValueError(f"num_samples must be integers >= 2, got {num_samples!r}")
    return 2.0 * (100.0 / (sizes - 1.0)) / eps


def private_select_clusters(
    accuracies: np.ndarray,
    num_samples: int | np.ndarray,
    epsilon_select: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Private loss-stage assignment: noisy argmax of train accuracies (§5.4 [CODE]).

    Each client adds Gumbel(0, 2Δ/ε_select) noise, Δ = 100/(N_i − 1), to its train
    accuracies (in %) under the M cluster models and reports the argmax: the exponential
    mechanism, ε_select-DP per selection, with RDP α·ε_select²/8 (`selection_rdp`). The
    seed's own argmin of losses (`loss_assignments`) is not privatised (§5.4 gap).

    Args:
        accuracies: (n, M) train accuracies in % (in [0, 100]).
        num_samples: N_i, an int for all clients or an (n,) int array; each >= 2.
        epsilon_select: ε of one selection, > 0.
        rng: Source of randomness.

    Returns:
        int64 cluster indices of shape (n,).

    Raises:
        ValueError: On malformed inputs.
    """
    acc = _matrix("accuracies", accuracies)
    _check_rng(rng)
    if np.any(acc < 0) or np.any(acc > 100):
        raise ValueError("accuracies must be percentages in [0, 100]")
    scale = selection_noise_scale(num_samples, epsilon_select)
    if scale.size not in (1, acc.shape[0]):
        raise ValueError(f"num_samples must be one int or {acc.shape[0]} ints, got {scale.size}")
    noisy = acc + rng.gumbel(size=acc.shape) * scale.reshape(-1, 1)
    return np.argmax(noisy, axis=1).astype(np.int64)


def selection_rdp(epsilon_select: float, orders: Sequence[float]) -> np.ndarray:
    """RDP of one ε-exponential-mechanism selection: α·ε²/8 at every order α (§5.4).

    The exponential mechanism is ε-bounded-range, hence (ε²/8)-zCDP (Cesar & Rogers 2021);
    this equals the RDP of a Gaussian mechanism with noise multiplier 2/ε, which is how
    `two_stage_epsilon` composes it.

    Raises:
        ValueError: If ε <= 0 or an order is <= 1.
    """
    eps = _check_positive("epsilon_select", epsilon_select)
    alphas = _vector("orders", orders)
    if np.any(alphas <= 1):
        raise ValueError("RDP orders must be > 1")
    return alphas * eps**2 / 8.0


def pi_weighted_cluster_updates(
    updates: np.ndarray | Sequence[np.ndarray],
    posteriors: np.ndarray,
    num_samples: np.ndarray | Sequence[int],
) -> np.ndarray:
    """Optional round-1 initialisation Σ_i π_im N_i Δθ̃_i / Σ_i π_im N_i per cluster (§6.2).

    The literal Algorithm 1 discards the round-1 updates (θ_m^2 = θ^init); the spec's
    option `round1_init="pi_weighted"` adds these (post-processing, privacy-free) deltas.

    Args:
        updates: (n, p) round-1 updates (or n arrays of equal size).
        posteriors: (n, M) GMM posteriors π.
        num_samples: (n,) dataset sizes N_i > 0.

    Returns:
        (M, p) float64 per-cluster deltas; a cluster with zero total weight gets zeros.

    Raises:
        ValueError: On shape mismatches or invalid weights.
    """
    x = _update_matrix(updates)
    pi = _matrix("posteriors", posteriors)
    sizes = _vector("num_samples", num_samples)
    if pi.shape[0] != x.shape[0] or sizes.shape[0] != x.shape[0]:
        raise ValueError(
            f"updates ({x.shape[0]}), posteriors ({pi.shape[0]}) and num_samples "
            f"({sizes.shape[0]}) must have one row per client"
        )
    if np.any(pi < 0) or np.any(sizes <= 0):
        raise ValueError("posteriors must be >= 0 and num_samples > 0")
    weights = pi * sizes[:, None]  # (n, M)
    totals = weights.sum(axis=0)
    safe = np.where(totals > 0, totals, 1.0)
    return (weights / safe).T @ x.astype(np.float64, copy=False)


# --------------------------------------------------------------------------- #
# Two-stage accounting (§5.2)
# --------------------------------------------------------------------------- #
def steps_per_round(num_samples: int, batch_size: int, local_epochs: int = 1) -> int:
    """E_i(b) = K·⌈N_i/b⌉ local DP-SGD steps of one round (§2 notation, §6.11).

    Raises:
        ValueError: If an argument is not a positive integer or b > N_i.
    """
    n = _check_int("num_samples", num_samples, 1)
    b = _check_int("batch_size", batch_size, 1)
    k = _check_int("local_epochs", local_epochs, 1)
    if b > n:
        raise ValueError(f"batch_size ({b}) must be <= num_samples ({n})")
    return k * math.ceil(n / b)


def two_stage_history(
    noise_multiplier: float,
    num_samples: int,
    batch_size: int,
    *,
    local_epochs: int = 1,
    total_rounds: int = 200,
    first_stage_rounds: int = 1,
    first_batch_size: int | None = None,
) -> tuple[HistoryEntry, ...]:
    """The DP-SGD history of one RC-DPFL client: (z, q₁, T₁) then (z, q₂, T₂) (§5.2).

    Stage 1: `first_stage_rounds` rounds at batch b¹ (default N_i, full batch, q₁ = 1);
    stage 2: the remaining E − rounds₁ rounds at batch b (q₂ = b/N_i, Poisson). Each round
    has K·⌈N_i/b⌉ steps (`steps_per_round`), the count the simulator should also run.
    The same z is used in both stages (Eq. 1: σ_i,DP = c·z(ε, δ, b¹, b^{>1}, N_i, K, E)).

    Returns:
        A tuple of `(noise_multiplier, sampling_rate, steps)` entries for
        `raydpfl.privacy.accountants.compute_epsilon`.

    Raises:
        ValueError: On out-of-range arguments.
    """
    n = _check_int("num_samples", num_samples, 1)
    rounds = _check_int("total_rounds", total_rounds, 1)
    first = _check_int("first_stage_rounds", first_stage_rounds, 0)
    if first > rounds:
        raise ValueError(f"first_stage_rounds ({first}) must be <= total_rounds ({rounds})")
    b1 = n if first_batch_size is None else _check_int("first_batch_size", first_batch_size, 1)
    steps1 = first * steps_per_round(n, b1, local_epochs)
    steps2 = (rounds - first) * steps_per_round(n, batch_size, local_epochs)
    z = _check_positive("noise_multiplier", noise_multiplier, allow_zero=True)
    return normalize_history([(z, b1 / n, steps1), (z, batch_size / n, steps2)])


def _paper_compat_epsilon(
    z: float,
    delta: float,
    n: int,
    b: int,
    b1: int,
    k: int,
    rounds: int,
    first: int,
    selection_rounds: int,
    selection_eps: float | None,
) -> float:
    # The authors' moments accountant (§5.2 [CODE]): fractional step counts K·rounds·N/b,
    # orders PAPER_RDP_ORDERS and the classic conversion min_α RDP(α) + log(1/δ)/(α − 1).
    from opacus.accountants.analysis.rdp import compute_rdp

    if z == 0.0:
        return math.inf
    orders = list(PAPER_RDP_ORDERS)
    rdp = np.zeros(len(orders))
    for q, steps in ((b1 / n, k * first * n / b1), (b / n, k * (rounds - first) * n / b)):
        if steps > 0:
            rdp += np.asarray(compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=orders))
    if selection_rounds and selection_eps is not None:
        rdp += selection_rounds * selection_rdp(selection_eps, orders)
    alphas = np.asarray(orders)
    return float(np.min(rdp + math.log(1.0 / delta) / (alphas - 1.0)))


def two_stage_epsilon(
    noise_multiplier: float,
    delta: float,
    num_samples: int,
    batch_size: int,
    *,
    local_epochs: int = 1,
    total_rounds: int = 200,
    first_stage_rounds: int = 1,
    first_batch_size: int | None = None,
    accountant: str = "rdp",
    mode: Literal["exact", "paper_compat"] = "exact",
    selection_rounds: int = 0,
    selection_epsilon: float | None = None,
) -> float:
    """ε of one client's full RC-DPFL run: full-batch round(s) + Poisson rounds (§5.2).

    "exact" (default): `compute_epsilon(two_stage_history(...), δ, accountant)` with the
    project's accountants, integer steps K·⌈N/b⌉ per round. "paper_compat": the authors'
    moments accountant (fractional steps K·N/b, orders 1.1..10.9 and 12..64, classic
    RDP→DP conversion); it reproduces the spec's §9 table (z = 1.1898 for N = 2285, ε = 10).

    Optional private selection (§5.4): `selection_rounds` ε_select-exponential mechanisms
    are composed in RDP (α·ε²/8 each). In "exact" mode they enter the history as the
    RDP-equivalent Gaussian entries (2/ε_select, q = 1); that equivalence holds for RDP
    only, so the "prv"/"pld" accountants are refused with a selection cost. Composing in
    RDP is tighter than the authors' budget split (ε_select subtracted from ε).

    Args:
        noise_multiplier: z >= 0 (0 gives inf).
        delta: δ in (0, 1).
        num_samples: N_i.
        batch_size: b of the Poisson stage (≤ N_i).
        local_epochs: K.
        total_rounds: E.
        first_stage_rounds: Rounds at batch b¹ (1 in Algorithm 1).
        first_batch_size: b¹ (default N_i).
        accountant: A project accountant ("exact" mode only).
        mode: "exact" or "paper_compat".
        selection_rounds: Number of private selections (0: none).
        selection_epsilon: ε_select of each selection (required when selection_rounds > 0).

    Returns:
        ε >= 0 (possibly inf).

    Raises:
        ValueError: On invalid arguments.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    delta = validate_delta(delta)
    validate_accountant(accountant)
    history = two_stage_history(
        noise_multiplier,
        num_samples,
        batch_size,
        local_epochs=local_epochs,
        total_rounds=total_rounds,
        first_stage_rounds=first_stage_rounds,
        first_batch_size=first_batch_size,
    )
    selections = _check_int("selection_rounds", selection_rounds, 0)
    eps_select = None
    if selections:
        if selection_epsilon is None:
            raise ValueError("selection_rounds > 0 needs selection_epsilon")
        eps_select = _check_positive("selection_epsilon", selection_epsilon)
    if mode == "paper_compat":
        n = int(num_samples)
        return _paper_compat_epsilon(
            float(noise_multiplier),
            delta,
            n,
            int(batch_size),
            n if first_batch_size is None else int(first_batch_size),
            int(local_epochs),
            int(total_rounds),
            int(first_stage_rounds),
            selections,
            eps_select,
        )
    if eps_select is not None:
        if accountant not in ("rdp", "dp_rdp"):
            raise ValueError(
                f"a selection cost composes in RDP only; use accountant 'rdp' or 'dp_rdp', "
                f"got {accountant!r}"
            )
        history = (*history, (2.0 / eps_select, 1.0, selections))
    return compute_epsilon(history, delta, accountant)


def two_stage_noise_multiplier(
    target_epsilon: float,
    delta: float,
    num_samples: int,
    batch_size: int,
    *,
    local_epochs: int = 1,
    total_rounds: int = 200,
    first_stage_rounds: int = 1,
    first_batch_size: int | None = None,
    accountant: str = "rdp",
    mode: Literal["exact", "paper_compat"] = "exact",
    selection_rounds: int = 0,
    selection_epsilon: float | None = None,
    sigma_bounds: tuple[float, float] = (1e-3, 1e3),
    precision: float = 1e-6,
) -> float:
    """z_i: the smallest noise multiplier meeting (ε, δ) over both stages (§5.2, Eq. 1).

    Bisection on z in `sigma_bounds` (the authors' [0.001, 1000]) until the bracket is
    narrower than `precision`; the upper, safe end is returned, so
    `two_stage_epsilon(z) <= target_epsilon` always holds (the authors stop at
    |ε(z) − ε| < 1e-6 instead, which may overshoot by that much). Arguments as in
    `two_stage_epsilon`.

    Returns:
        z.

    Raises:
        ValueError: On invalid arguments, if the upper bound misses the target, or if the
            selection cost alone already exceeds it.
    """
    target = _check_positive("target_epsilon", target_epsilon)
    precision = _check_positive("precision", precision)
    lo, hi = (float(v) for v in sigma_bounds)
    if not 0 < lo < hi or not math.isfinite(hi):
        raise ValueError(f"sigma_bounds must satisfy 0 < low < high < inf, got {sigma_bounds}")

    def eps(z: float) -> float:
        # The bracket ends are extreme noise levels where opacus warns that the optimal
        # RDP order sits at the edge of its grid; that is expected there, not a problem.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Optimal order is the")
            return _eps(z)

    def _eps(z: float) -> float:
        return two_stage_epsilon(
            z,
            delta,
            num_samples,
            batch_size,
            local_epochs=local_epochs,
            total_rounds=total_rounds,
            first_stage_rounds=first_stage_rounds,
            first_batch_size=first_batch_size,
            accountant=accountant,
            mode=mode,
            selection_rounds=selection_rounds,
            selection_epsilon=selection_epsilon,
        )

    if eps(hi) > target:
        raise ValueError(
            f"target_epsilon={target} is unreachable with noise multiplier <= {hi} "
            "(or the selection cost alone exceeds it)"
        )
    if eps(lo) <= target:
        return lo
    while hi - lo > precision:  # invariant: eps(lo) > target >= eps(hi)
        mid = 0.5 * (lo + hi)
        if eps(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


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


# --------------------------------------------------------------------------- #
# Metrics (§7.1, §6.20)
# --------------------------------------------------------------------------- #
def group_accuracies(
    accuracies: np.ndarray,
    clusters: np.ndarray,
    minority_clusters: Sequence[int] = (0,),
) -> dict[str, float]:
    """Mean test accuracy of all, majority and minority clients (Tables 3/5/7/9).

    "Min" in those tables is the *average* over the minority clients (cluster 0, three
    clients); the majority is every other client.

    Args:
        accuracies: (n,) per-client test accuracies (any unit, e.g. %).
        clusters: (n,) true cluster s(i) of each client.
        minority_clusters: The minority cluster indices.

    Returns:
        {"all": ..., "majority": ..., "minority": ...}.

    Raises:
        ValueError: On shape mismatch, or if either group is empty.
    """
    acc = _vector("accuracies", accuracies)
    labels = _labels("clusters", clusters)
    if len(labels) != len(acc):
        raise ValueError(f"clusters has {len(labels)} entries, accuracies {len(acc)}")
    minority = np.isin(labels, np.asarray(list(minority_clusters), dtype=np.int64))
    if minority.all() or not minority.any():
        raise ValueError("both the minority and the majority group must be non-empty")
    return {
        "all": float(acc.mean()),
        "majority": float(acc[~minority].mean()),
        "minority": float(acc[minority].mean()),
    }


def worst_client_accuracy(accuracies: np.ndarray) -> float:
    """min_i acc_i(θ_i): the worst client's test accuracy ("Min Acc" of Tables 4/6/8/10).

    Raises:
        ValueError: If `accuracies` is not a non-empty finite vector.
    """
    return float(_vector("accuracies", accuracies).min())


def max_accuracy_disparity(accuracies: np.ndarray) -> float:
    """max_{i,j} |acc_i(θ_i) − acc_j(θ_j)| = max − min ("Accuracy Disparity", §5).

    Raises:
        ValueError: If `accuracies` is not a non-empty finite vector.
    """
    acc = _vector("accuracies", accuracies)
    return float(acc.max() - acc.min())


def _reference(name: str, reference: np.ndarray, n: int, best: str) -> np.ndarray:
    ref = np.asarray(reference, dtype=np.float64)
    if ref.ndim == 2:
        # One column per candidate θ*: the literal max_{θ*} (min for losses) of §5.
        ref = _matrix(name, ref)
        ref = ref.max(axis=1) if best == "max" else ref.min(axis=1)
    ref = _vector(name, ref)
    if len(ref) != n:
        raise ValueError(f"{name} must have one row per client ({n}), got {len(ref)}")
    return ref


def privacy_costs_accuracy(accuracies: np.ndarray, reference_accuracies: np.ndarray) -> np.ndarray:
    """Δacc_i(θ_i) = max_{θ*} acc_i(θ*) − acc_i(θ_i) for every client (§5, §7.1).

    Args:
        accuracies: (n,) test accuracies of the DP models θ_i.
        reference_accuracies: (n,) acc_i(θ*) of the non-private model of client i's true
            cluster (§6.19), or (n, R) accuracies under R candidate models θ* (the row max
            is taken).

    Raises:
        ValueError: On malformed inputs.
    """
    acc = _vector("accuracies", accuracies)
    return _reference("reference_accuracies", reference_accuracies, len(acc), "max") - acc


def privacy_costs_loss(losses: np.ndarray, reference_losses: np.ndarray) -> np.ndarray:
    """ξ_i(θ_i) = f_i(θ_i) − min_{θ*} f_i(θ*), f_i the train loss (§5, §7.1).

    Args:
        losses: (n,) train losses of the DP models θ_i.
        reference_losses: (n,) f_i(θ*), or (n, R) losses under R candidates (row min).

    Raises:
        ValueError: On malformed inputs.
    """
    loss = _vector("losses", losses)
    return loss - _reference("reference_losses", reference_losses, len(loss), "min")


def fairness_accuracy(accuracies: np.ndarray, reference_accuracies: np.ndarray) -> float:
    """F_acc = max_{i,j} |Δacc_i − Δacc_j| (§5): spread of the accuracy privacy cost.

    Raises:
        ValueError: On malformed inputs.
    """
    cost = privacy_costs_accuracy(accuracies, reference_accuracies)
    return float(cost.max() - cost.min())


def fairness_loss(losses: np.ndarray, reference_losses: np.ndarray) -> float:
    """F_loss = max_{i,j} |ξ_i − ξ_j| (§5): spread of the train-loss privacy cost.

    Raises:
        ValueError: On malformed inputs.
    """
    cost = privacy_costs_loss(losses, reference_losses)
    return float(cost.max() - cost.min())


def _confusion(true_labels: np.ndarray, pred_labels: np.ndarray) -> np.ndarray:
    truth = _labels("true_labels", true_labels)
    pred = _labels("pred_labels", pred_labels)
    if len(truth) != len(pred):
        raise ValueError(f"true_labels has {len(truth)} entries, pred_labels {len(pred)}")
    _, t = np.unique(truth, return_inverse=True)
    _, p = np.unique(pred, return_inverse=True)
    confusion = np.zeros((t.max() + 1, p.max() + 1), dtype=np.int64)
    np.add.at(confusion, (t, p), 1)
    return confusion


def hungarian_clustering_accuracy(true_labels: np.ndarray, pred_labels: np.ndarray) -> float:
    """Per-client clustering accuracy after the best one-to-one label matching (§6.20 (b)).

    The predicted cluster ids are arbitrary (a GMM's components are unordered), so the
    matching between predicted and true clusters that maximises the number of agreeing
    clients is found with the Hungarian algorithm (`linear_sum_assignment`); clients of an
    unmatched cluster (different numbers of clusters) count as errors.

    Returns:
        Fraction of clients in the matched clusters, in [0, 1].

    Raises:
        ValueError: On malformed or mismatched label arrays.
    """
    confusion = _confusion(true_labels, pred_labels)
    rows, cols = linear_sum_assignment(confusion, maximize=True)
    return float(confusion[rows, cols].sum() / confusion.sum())


def is_exact_partition(true_labels: np.ndarray, pred_labels: np.ndarray) -> bool:
    """Whether the predicted partition equals the true one up to relabelling (§6.20 (a)).

    Raises:
        ValueError: On malformed or mismatched label arrays.
    """
    confusion = _confusion(true_labels, pred_labels)
    # Equal partitions ⇔ the confusion matrix is a permutation pattern: one non-zero
    # entry in every row and every column.
    nonzero = confusion > 0
    return bool(np.all(nonzero.sum(axis=0) == 1) and np.all(nonzero.sum(axis=1) == 1))


def exact_partition_rate(pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> float:
    """Fraction of runs (seeds) whose partition is exactly right (§6.20 (a)).

    Args:
        pairs: (true_labels, pred_labels) of each run.

    Raises:
        ValueError: If `pairs` is empty or a pair is malformed.
    """
    outcomes = [is_exact_partition(t, p) for t, p in pairs]
    if not outcomes:
        raise ValueError("pairs must hold at least one (true, predicted) labelling")
    return float(np.mean(outcomes))
