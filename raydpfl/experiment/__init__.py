"""The composition root: config → data, model, algorithm, ledger → a run on a backend.

It sits above the backends (it picks one) and below the entry points (CLI, Tune, the
Python API), and is the only layer that reads a `Config` to build objects.
"""

from raydpfl.experiment.build import (
    build_experiment,
    check_resume,
    load_federated,
    make_local_backend,
    run_experiment,
)
from raydpfl.simulation.experiment import Experiment, make_server

__all__ = [
    "Experiment",
    "build_experiment",
    "check_resume",
    "load_federated",
    "make_local_backend",
    "make_server",
    "run_experiment",
]
