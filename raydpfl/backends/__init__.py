"""Backends: where workers run (in-process here; Ray in `backends.ray`)."""

from raydpfl.backends.local import LocalBackend
from raydpfl.simulation.backend import Backend

__all__ = ["Backend", "LocalBackend"]
