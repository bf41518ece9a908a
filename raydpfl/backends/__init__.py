"""Backends: where workers run (in-process here; Ray in `backends.ray`)."""

from raydpfl.backends.base import Backend
from raydpfl.backends.local import LocalBackend

__all__ = ["Backend", "LocalBackend"]
