"""Argument checks shared by RC-DPFL's pure functions: a ValueError naming the argument."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np


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
