"""Hyperparameter sweeps with Ray Tune (`raydpfl tune`): see `spec` and `sweep`."""

from raydpfl.tune.spec import Dimension, SchedulerSpec, Sweep, TuneSpec, parse_sweep

__all__ = ["Dimension", "SchedulerSpec", "Sweep", "TuneSpec", "parse_sweep"]
