"""Callbacks: watch a run as it goes (experiment trackers, or your own code).

A callback receives the run's start, each finished round's row (the same row that
`rounds.parquet` gets: ``round``, ``test_accuracy``, ``epsilon_max``, ...) and the
summary. They run in the driver process (the rows of a Ray run come back to it), after
the round is written and checkpointed, so a failing tracker never loses results.

Built in, named in ``runtime.callbacks`` (comma-separated) or passed as objects to
`raydpfl.run_simulation(callbacks=[...])`:

==============  ==========================================================  ============
name            writes                                                      needs
==============  ==========================================================  ============
``tensorboard``  event files in ``<run dir>/tensorboard`` (scalars per round)  tensorboardX
                                                                            (or tensorboard)
``mlflow``       an MLflow run: params (the flat config) and metrics per round  ``mlflow``
``wandb``        a Weights & Biases run: config and metrics per round          ``wandb``
==============  ==========================================================  ============

Your own: subclass `Callback` and override what you need. Changing callbacks never
changes results (``runtime.callbacks`` is a resume-safe key).
"""

from __future__ import annotations

from raydpfl.callbacks.base import Callback, RunInfo, numeric_metrics
from raydpfl.callbacks.trackers import (
    CALLBACKS,
    MLflowCallback,
    TensorBoardCallback,
    WandbCallback,
    callbacks_from_names,
    check_callback_names,
    parse_callback_names,
)

__all__ = [
    "CALLBACKS",
    "Callback",
    "MLflowCallback",
    "RunInfo",
    "TensorBoardCallback",
    "WandbCallback",
    "callbacks_from_names",
    "check_callback_names",
    "numeric_metrics",
    "parse_callback_names",
]
