"""RC-DPFL's evaluation metrics (§7.1, §6.20).

Paper: "Mitigating Disparate Impact of Differential Privacy in Federated Learning through
Robust Clustering" (seed 004; implementation spec shared/specs/robust-clustering.md, cited
as §). `group_accuracies`, `worst_client_accuracy`, `max_accuracy_disparity`,
`privacy_costs_accuracy`, `privacy_costs_loss`, `fairness_accuracy` (F_acc),
`fairness_loss` (F_loss), `hungarian_clustering_accuracy`, `is_exact_partition`,
`exact_partition_rate`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from raydpfl.papers.rc_dpfl._checks import _labels, _matrix, _vector

__all__ = [
    "exact_partition_rate",
    "fairness_accuracy",
    "fairness_loss",
    "group_accuracies",
    "hungarian_clustering_accuracy",
    "is_exact_partition",
    "max_accuracy_disparity",
    "privacy_costs_accuracy",
    "privacy_costs_loss",
    "worst_client_accuracy",
]


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
