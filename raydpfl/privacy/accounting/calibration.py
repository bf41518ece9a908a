"""Calibration of the Poisson-subsampled Gaussian mechanism to a privacy budget.

All functions account for ``T`` steps of the DP-SGD step mechanism
``D -> sum_{x in S} clip_C(g(x)) + N(0, sigma^2 C^2 I)`` with ``S`` a Poisson(q)
subsample (L2 sensitivity ``C``, add/remove-one-record adjacency), using
:func:`raydpfl.privacy.accounting.accountants.compute_epsilon`.

Epsilon is non-increasing in ``sigma`` and non-decreasing in ``T``; both
searches below keep a bracket whose "safe" end always satisfies the target and
return that end, so the result never overshoots the budget (cf. opacus
#346/#348, where the returned sigma could give epsilon > target).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Sequence

from raydpfl.privacy.accounting.accountants import (
    compute_epsilon,
    normalize_history,
    validate_accountant,
    validate_delta,
)

__all__ = ["MAX_STEPS_CAP", "epsilon_for", "max_steps_for", "noise_multiplier_for"]

#: Upper limit of the search in :func:`max_steps_for`.
MAX_STEPS_CAP: int = 10**7


def _check_target(target_epsilon: float) -> float:
    return _check_positive_real("target_epsilon", target_epsilon)


def _check_positive_real(name: str, value: float) -> float:
    if (
        not isinstance(value, numbers.Real)
        or isinstance(value, bool)
        or not math.isfinite(float(value))
        or float(value) <= 0.0
    ):
        raise ValueError(f"{name} must be a finite real > 0, got {value!r}")
    return float(value)


def _check_entry(noise_multiplier: float, sampling_rate: float, steps: int) -> None:
    # Re-use the history validator so that messages are identical everywhere.
    try:
        normalize_history([(noise_multiplier, sampling_rate, steps)])
    except ValueError as exc:
        raise ValueError(str(exc).removeprefix("history[0]: ")) from None


def epsilon_for(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    accountant: str = "rdp",
) -> float:
    """Epsilon of ``steps`` Poisson-subsampled Gaussian steps.

    Args:
        noise_multiplier: ``sigma >= 0`` (noise std divided by the clip norm).
        sampling_rate: Poisson sampling probability ``q in [0, 1]``.
        steps: Number of composed steps ``T >= 0``.
        delta: Target delta in (0, 1).
        accountant: One of :data:`raydpfl.privacy.accounting.accountants.ACCOUNTANTS`.

    Returns:
        ``compute_epsilon([(sigma, q, T)], delta, accountant)``.

    Raises:
        ValueError: On invalid arguments.
    """
    _check_entry(noise_multiplier, sampling_rate, steps)
    return compute_epsilon([(noise_multiplier, sampling_rate, steps)], delta, accountant)


def noise_multiplier_for(
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    accountant: str = "rdp",
    *,
    sigma_max: float = 1e3,
    precision: float = 1e-3,
) -> float:
    """Smallest noise multiplier meeting an (epsilon, delta) target, conservatively.

    Finds ``sigma`` with ``eps(sigma) <= target_epsilon`` and
    ``eps(sigma - precision) > target_epsilon`` (or ``sigma <= precision``),
    where ``eps(s) = compute_epsilon([(s, q, T)], delta, accountant)``: the
    bracket ``[lo, hi]`` is grown by doubling from 1 and then bisected until
    ``hi - lo <= precision``; ``hi`` always satisfies the target and is
    returned (the upper, conservative end). ``eps(hi) <= target`` is
    re-verified before returning. If ``q == 0`` or ``T == 0`` the mechanism
    is the identity and ``0.0`` is returned.

    Args:
        target_epsilon: Target epsilon, finite and > 0.
        delta: Target delta in (0, 1).
        sampling_rate: Poisson sampling probability ``q in [0, 1]``.
        steps: Number of steps ``T >= 0``.
        accountant: One of :data:`raydpfl.privacy.accounting.accountants.ACCOUNTANTS`.
        sigma_max: Largest sigma considered (finite, > 0).
        precision: Absolute width of the final bracket (finite, > 0).

    Returns:
        The noise multiplier ``sigma``.

    Raises:
        ValueError: On invalid arguments, or if even ``sigma_max`` exceeds the target.
        RuntimeError: If the final verification fails (should not happen).
    """
    target = _check_target(target_epsilon)
    delta = validate_delta(delta)
    validate_accountant(accountant)
    _check_entry(0.0, sampling_rate, steps)
    sigma_max = _check_positive_real("sigma_max", sigma_max)
    precision = _check_positive_real("precision", precision)
    q = float(sampling_rate)
    if q == 0.0 or steps == 0:
        return 0.0

    def eps(sigma: float) -> float:
        return compute_epsilon([(sigma, q, steps)], delta, accountant)

    return smallest_sigma(
        eps,
        target,
        sigma_max,
        precision,
        unreachable=f"target_epsilon={target} is unreachable with sigma <= sigma_max={sigma_max}",
        target_label=f"target_epsilon={target}",
    )


def smallest_sigma(
    eps: Callable[[float], float],
    target: float,
    sigma_max: float,
    precision: float,
    *,
    unreachable: str,
    target_label: str,
) -> float:
    """The smallest σ in (0, `sigma_max`] with ``eps(σ) <= target``, to `precision`.

    The bracket starts at [0, min(1, σ_max)] (eps(0) = ∞ > target) and doubles its upper
    end until it meets the target (ValueError `unreachable` once σ_max misses it); then
    `bisect_safe_end` narrows it and the safe end is re-verified and returned.
    """
    lo, hi = 0.0, min(1.0, sigma_max)
    while eps(hi) > target:
        if hi >= sigma_max:
            raise ValueError(unreachable)
        lo, hi = hi, min(2.0 * hi, sigma_max)
    hi = bisect_safe_end(eps, target, lo, hi, precision)
    if not eps(hi) <= target:  # pragma: no cover - invariant of the bisection
        raise RuntimeError(f"calibration failed: eps({hi}) exceeds {target_label}")
    return hi


def bisect_safe_end(
    eps: Callable[[float], float], target: float, lo: float, hi: float, precision: float
) -> float:
    """Bisects [lo, hi] with eps(lo) > target >= eps(hi) (eps non-increasing) until it is
    at most `precision` wide; returns its upper, safe end (eps(hi) <= target)."""
    while hi - lo > precision:
        mid = 0.5 * (lo + hi)
        if eps(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def max_steps_for(
    target_epsilon: float,
    delta: float,
    noise_multiplier: float,
    sampling_rate: float,
    accountant: str = "rdp",
    *,
    history: Iterable[Sequence[float]] = (),
) -> int:
    """Largest number of further steps that keeps epsilon within the target.

    Returns the largest integer ``T >= 0`` with
    ``eps(history + [(sigma, q, T)]) <= target_epsilon`` where ``eps`` is
    :func:`~raydpfl.privacy.accounting.accountants.compute_epsilon`; so
    ``eps(T) <= target < eps(T + 1)`` unless the cap is hit. The search doubles
    ``T`` from 1 and then bisects over integers, keeping a feasible lower end.
    It is capped at :data:`MAX_STEPS_CAP` (10**7): if the cap itself is
    feasible (e.g. ``q == 0``) the cap is returned with a ``RuntimeWarning``.
    Returns 0 if even one more step exceeds the target (or the prior history
    already does).

    Args:
        target_epsilon: Target epsilon, finite and > 0.
        delta: Target delta in (0, 1).
        noise_multiplier: ``sigma >= 0`` of the future steps.
        sampling_rate: ``q in [0, 1]`` of the future steps.
        accountant: One of :data:`raydpfl.privacy.accounting.accountants.ACCOUNTANTS`.
        history: Already spent ``(sigma, q, steps)`` triples.

    Returns:
        The number of steps ``T``.

    Raises:
        ValueError: On invalid arguments.
    """
    target = _check_target(target_epsilon)
    delta = validate_delta(delta)
    validate_accountant(accountant)
    _check_entry(noise_multiplier, sampling_rate, 0)
    prior = normalize_history(history)
    entry = (float(noise_multiplier), float(sampling_rate))

    def feasible(t: int) -> bool:
        return compute_epsilon((*prior, (*entry, t)), delta, accountant) <= target

    return largest_feasible_steps(feasible)


def bisect_steps_within(
    eps: Callable[[float], float], target: float, hi: float = 1e5, tolerance: float = 0.01
) -> int:
    """The step count the authors' code of ALI-DPFL and FedFDP derives from a budget:
    bisection over real T on [0, `hi`] until ε(hi) − `target` ≤ `tolerance`, returning
    int(hi). ε(result) may exceed `target` by up to `tolerance` (the papers' published
    R_c and T come from it); `largest_feasible_steps` is the version that never overshoots.

    Raises:
        ValueError: `hi` steps still fit in the budget.
    """
    # ALI-DPFL spec §4.7 [CODE]: the intended Algorithm 3 (the seed's version returns 0 at once).
    if eps(hi) < target:
        raise ValueError(f"epsilon {target} allows more than {hi:g} iterations")
    lo = 0.0
    while eps(hi) - target > tolerance:
        mid = (lo + hi) / 2
        if eps(mid) > target:
            hi = mid
        else:
            lo = mid
    return int(hi)


def largest_feasible_steps(feasible: Callable[[int], bool]) -> int:
    """The largest integer T >= 0 with ``feasible(T)``, for a monotone predicate.

    Doubles T from 1, then bisects over integers keeping a feasible lower end. Returns 0
    when ``feasible(1)`` is false, and :data:`MAX_STEPS_CAP` (with a ``RuntimeWarning``)
    when the cap itself is feasible.
    """
    if not feasible(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_STEPS_CAP and feasible(hi):
        lo, hi = hi, 2 * hi
    if hi > MAX_STEPS_CAP:
        if feasible(MAX_STEPS_CAP):
            warnings.warn(
                f"the step search reached its cap MAX_STEPS_CAP={MAX_STEPS_CAP}",
                RuntimeWarning,
                stacklevel=3,
            )
            return MAX_STEPS_CAP
        hi = MAX_STEPS_CAP
    while hi - lo > 1:  # invariant: feasible(lo) and not feasible(hi)
        mid = (lo + hi) // 2
        if feasible(mid):
            lo = mid
        else:
            hi = mid
    return lo
