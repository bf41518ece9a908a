"""RC-DPFL's clustering stage: update features, the GMM, M and E_c (Algorithm 1, §3).

Paper: "Mitigating Disparate Impact of Differential Privacy in Federated Learning through
Robust Clustering" (seed 004; implementation spec shared/specs/robust-clustering.md, cited
as §). Pure functions on numpy arrays (scikit-learn for the GMM); no Ray, no torch.

- `update_features` (flattened round-1 updates → centred PCA scores → min-max scaling,
  §6.5), `fit_update_gmm` / `gmm_posteriors` (spherical GMM, uniform weights at predict
  time) and the fitted `UpdateGMM` with its confidence diagnostics (MSS, overlap).
- Schedule: `select_num_clusters` (max-MSS rule, §6.4), `gmm_stage_rounds` (E_c rule, §6.7).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from raydpfl.papers.rc_dpfl._checks import (
    _check_int,
    _check_positive,
    _check_probability,
    _is_int,
    _matrix,
    _seed_of,
    _update_matrix,
)
from raydpfl.papers.rc_dpfl.overlap import overlap_from_separation, separation_scores

__all__ = [
    "UpdateGMM",
    "fit_update_gmm",
    "gmm_posteriors",
    "gmm_stage_rounds",
    "select_num_clusters",
    "update_features",
]

#: Columns of the n×p update matrix processed at once when forming the Gram matrix: bounds
#: the float64 working copy to n · 2^20 · 8 bytes (170 MB for n = 21) for ResNet-18 updates.
_GRAM_CHUNK = 1 << 20

_FEATURE_SPACES = ("pca", "raw")
_SCALERS = ("minmax", "standard", "none")


# --------------------------------------------------------------------------- #
# Clustering stage: features and GMM (Algorithm 1 line 7, §6.5)
# --------------------------------------------------------------------------- #
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
# M and E_c (§6.4, §6.7)
# --------------------------------------------------------------------------- #
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
