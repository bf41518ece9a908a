"""Argument checks shared by the data modules; each raises a one-line ValueError/TypeError."""

from __future__ import annotations

import numbers

import numpy as np


def check_rng(rng: object) -> np.random.Generator:
    """Rejects anything but a `numpy.random.Generator` (no legacy or global RNG)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def check_int(name: str, value: object, minimum: int) -> int:
    """Returns `value` as int if it is an integer (not bool) >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_nonnegative(name: str, value: object) -> float:
    """Returns `value` as float if it is a finite real number >= 0."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok or not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite real number >= 0, got {value!r}")
    return float(value)


def check_labels(labels: object) -> np.ndarray:
    """Returns `labels` as a 1-D int64 array of non-negative class ids."""
    array = np.asarray(labels)
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise ValueError(
            f"labels must be a 1-D integer array, got shape {array.shape} dtype {array.dtype}"
        )
    if array.size and array.min() < 0:
        raise ValueError(f"labels must be >= 0, got minimum {int(array.min())}")
    return array.astype(np.int64, copy=False)
