"""Fairness metrics over clients, from per-client arrays (pure numpy).

Ψ is FedFDP's fairness metric: the p-weighted variance of per-client losses (Eq. 2 of
"FedFDP: Fairness-Aware Federated Learning with Differential Privacy", seed 001; Eq. 7 in
seed 000; shared/specs/fedfdp.md §3.2). Which losses go in (global model on each client's
test split, or the paper code's post-update local models on a training batch) is the
caller's choice (§11 A11). The accuracy statistics are the q-FFL-style extras of §11 A11:
variance and standard deviation of per-client accuracy, unweighted and p-weighted, the
worst client and the mean of the worst 10% of clients.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

__all__ = [
    "fairness_metrics",
    "psi",
    "weighted_mean_and_variance",
    "worst_fraction_mean",
    "worst_fraction_size",
]

ArrayLike = Sequence[float] | np.ndarray


def _vector(values: ArrayLike, name: str, *, allow_nonfinite: bool = False) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a 1-D array of real numbers") from None
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    if not allow_nonfinite and not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite, got {arr[~np.isfinite(arr)][:3]}")
    return arr


def _probabilities(weights: ArrayLike | None, n: int) -> np.ndarray:
    if weights is None:
        return np.full(n, 1.0 / n)
    w = _vector(weights, "weights")
    if w.size != n:
        raise ValueError(f"weights has {w.size} entries for {n} clients")
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be >= 0 with a positive sum")
    return w / w.sum()


def weighted_mean_and_variance(
    values: ArrayLike, weights: ArrayLike | None = None
) -> tuple[float, float]:
    """(m, v) with m = Σ p_i x_i and v = Σ p_i (x_i − m)², p = weights / Σ weights.

    The population (not Bessel-corrected) variance, as in Eq. 2. `weights` None means
    p_i = 1/N. Two-pass, so v ≥ 0 and exact for equal values.

    Raises:
        ValueError: On empty or non-finite values, or weights of another length, with a
            negative entry, or summing to 0.
    """
    x = _vector(values, "values")
    p = _probabilities(weights, x.size)
    mean = float(p @ x)
    return mean, float(p @ (x - mean) ** 2)


def psi(losses: ArrayLike, weights: ArrayLike | None = None) -> float:
    """Ψ = Σ_i p_i (F_i − F)², F = Σ_i p_i F_i (Eq. 2 of 001; Eq. 7 of 000).

    Args:
        losses: Per-client losses F_i.
        weights: Per-client weights (the paper's p_i ∝ |D_i|, training-split sizes,
            §11 A9); normalised here. None gives p_i = 1/N.

    Returns:
        Ψ ≥ 0; +inf if any loss is +inf or NaN (a diverged client model), so that logging a
        diverged run reports it instead of raising.

    Raises:
        ValueError: As `weighted_mean_and_variance` (except for non-finite losses).
    """
    x = _vector(losses, "losses", allow_nonfinite=True)
    if not np.isfinite(x).all():
        if (x == -np.inf).any():
            raise ValueError("losses must not be -inf")
        _probabilities(weights, x.size)  # still reject malformed weights
        return math.inf
    return weighted_mean_and_variance(x, weights)[1]


def worst_fraction_size(num_clients: int, fraction: float = 0.1) -> int:
    """k = ⌈fraction·N⌉, at least 1: how many clients "the worst fraction" holds.

    Computed as ⌈fraction·N − 1e-9⌉ so that rounding in the product does not add a client
    (0.07·100 is 7.000000000000001 in floating point, whose ceiling is 8). For the default
    10%: N = 1..10 → 1, 11 → 2, 20 → 2, 25 → 3, 50 → 5.
    """
    if (
        isinstance(num_clients, bool)
        or not isinstance(num_clients, numbers.Integral)
        or num_clients < 1
    ):
        raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, numbers.Real)
        or not 0.0 < fraction <= 1.0
    ):
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    return max(1, math.ceil(float(fraction) * int(num_clients) - 1e-9))


def worst_fraction_mean(values: ArrayLike, fraction: float = 0.1) -> float:
    """Unweighted mean of the k lowest values, k = `worst_fraction_size`(N, fraction).

    Ties do not matter: the k lowest values are the same multiset whichever tied client
    is taken.
    """
    x = _vector(values, "values")
    k = worst_fraction_size(x.size, fraction)
    return float(np.sort(x)[:k].mean())


def fairness_metrics(
    *,
    losses: ArrayLike | None = None,
    accuracies: ArrayLike | None = None,
    weights: ArrayLike | None = None,
) -> dict[str, float]:
    """Fairness metrics of one evaluation, from per-client arrays in the same client order.

    Keys (each present only when its input is given):

    - from `losses`: ``psi`` (Ψ, Eq. 2 of 001, p-weighted, see `psi`) and ``loss_mean``
      (F = Σ p_i F_i; +inf for a diverged client, as ``psi``);
    - from `accuracies`: ``acc_mean`` / ``acc_var`` / ``acc_std`` (unweighted, population
      variance over clients), ``acc_mean_weighted`` / ``acc_var_weighted`` /
      ``acc_std_weighted`` (p-weighted), ``acc_worst`` (lowest client accuracy) and
      ``acc_worst10`` (unweighted mean accuracy of the ⌈N/10⌉ lowest-accuracy clients, at
      least one client; N = 10 → the worst client, N = 20 → the worst 2, N = 25 → 3).

    Args:
        losses: Per-client mean losses F_i.
        accuracies: Per-client accuracies (any scale: fractions or percent).
        weights: Per-client weights p_i (e.g. |D_i|); normalised. None: uniform.

    Raises:
        ValueError: If neither array is given, the arrays differ in length, or any input
            is malformed (see `weighted_mean_and_variance`, `psi`).
    """
    if losses is None and accuracies is None:
        raise ValueError("give losses, accuracies or both")
    x = None if losses is None else _vector(losses, "losses", allow_nonfinite=True)
    a = None if accuracies is None else _vector(accuracies, "accuracies")
    if x is not None and a is not None and x.size != a.size:
        raise ValueError(f"losses and accuracies differ in length: {x.size} and {a.size}")
    out: dict[str, float] = {}
    if x is not None:
        out["psi"] = psi(x, weights)
        out["loss_mean"] = (
            weighted_mean_and_variance(x, weights)[0] if math.isfinite(out["psi"]) else math.inf
        )
    if a is not None:
        mean, var = weighted_mean_and_variance(a)
        wmean, wvar = weighted_mean_and_variance(a, weights)
        out.update(
            acc_mean=mean,
            acc_var=var,
            acc_std=math.sqrt(var),
            acc_mean_weighted=wmean,
            acc_var_weighted=wvar,
            acc_std_weighted=math.sqrt(wvar),
            acc_worst=float(a.min()),
            acc_worst10=worst_fraction_mean(a, 0.1),
        )
    return out
