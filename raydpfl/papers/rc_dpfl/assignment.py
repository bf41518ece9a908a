"""RC-DPFL's cluster assignments: GMM-sampled, loss-based and private (Algorithm 1, §5.4).

Paper: "Mitigating Disparate Impact of Differential Privacy in Federated Learning through
Robust Clustering" (seed 004; implementation spec shared/specs/robust-clustering.md, cited
as §). Pure functions on numpy arrays.

- `sample_assignments` (R^e(i) ~ π_i, lines 9/18), `loss_assignments` (argmin_m f_i(θ_m),
  line 20), `private_select_clusters`, `selection_noise_scale` and `selection_rdp` (the
  Gumbel/exponential-mechanism variant of §5.4), `pi_weighted_cluster_updates` (the
  optional round-1 initialisation of §6.2).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raydpfl.papers.rc_dpfl._checks import (
    _check_positive,
    _check_rng,
    _matrix,
    _update_matrix,
    _vector,
)

__all__ = [
    "loss_assignments",
    "pi_weighted_cluster_updates",
    "private_select_clusters",
    "sample_assignments",
    "selection_noise_scale",
    "selection_rdp",
]


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
