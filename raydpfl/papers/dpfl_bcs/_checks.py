"""Input checks of DPFL-BCS's pure functions: a ValueError naming the argument.

The scalar checks are the privacy kit's (`raydpfl.privacy.accounting.single_release`); the
plan and array checks are the paper's.
"""

from __future__ import annotations

import math

import numpy as np

from raydpfl.privacy.accounting.single_release import check_delta as _delta
from raydpfl.privacy.accounting.single_release import check_nonnegative as _nonnegative
from raydpfl.privacy.accounting.single_release import check_positive as _positive

__all__ = ["_array", "_count", "_delta", "_nonnegative", "_positive", "_upper"]


def _count(name: str, value: float) -> int:
    # Plans are integers (§8.5): a fractional T_n would leave a residue a later participation
    # overdraws, and T_n < 1 would spend more than the whole budget in one participation.
    as_float = float(value)
    if not (math.isfinite(as_float) and as_float.is_integer() and as_float >= 1):
        raise ValueError(f"{name} must be an integer >= 1, got {value}")
    return int(as_float)


def _upper(value: float) -> float:
    value = float(value)
    if value == math.inf:
        return value
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"upper must be > 0 or inf, got {value}")
    return value


def _array(name: str, values: object, *, positive: bool = False) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    if positive and not np.all(arr > 0):
        raise ValueError(f"{name} must be > 0 everywhere")
    return arr
