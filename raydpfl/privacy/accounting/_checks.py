"""Argument checks shared by the privacy kernel and the algorithms' pure functions: one
line naming the argument."""

from __future__ import annotations

import math
import numbers


def _real(value: object, name: str, *, finite: bool = True) -> float:
    """`value` as a float; a bool, a non-number or NaN (and ±inf unless `finite` is False)
    is refused naming `name`."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    x = float(value)
    if math.isnan(x) or (finite and not math.isfinite(x)):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return x


def _positive(value: object, name: str) -> float:
    """A finite real > 0."""
    x = _real(value, name)
    if x <= 0.0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return x


def _non_negative(value: object, name: str) -> float:
    """A finite real >= 0."""
    x = _real(value, name)
    if x < 0.0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return x


def _rate(value: object, name: str) -> float:
    """A finite real in [0, 1] (a sampling rate, a probability)."""
    x = _real(value, name)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return x


def _count(value: object, name: str, *, minimum: int = 0) -> int:
    """An int >= `minimum` (not a bool)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)
