"""The callback interface and what a callback is told about the run."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunInfo:
    """What a callback learns when the run starts.

    Attributes:
        name: ``experiment.name``.
        run_dir: The run directory, or None when outputs stay in memory.
        config: The resolved config, flat (``{"experiment.privacy.epsilon": 8.0, ...}``).
        resumed: True when the run continues from a checkpoint (rows start after it).
        epsilon_unit: What every ε in the rows is about: ``record`` or ``client``.
    """

    name: str
    run_dir: Path | None
    config: Mapping[str, Any] = field(default_factory=dict)
    resumed: bool = False
    epsilon_unit: str = "record"


class Callback:
    """Base class: override the hooks you need (each does nothing by default).

    Order: `on_run_start`, then `on_round_end` once per finished round (in round order),
    then `on_run_end` when the run completes; `close` always, also after an error or an
    interruption. Hooks run in the driver process and must not change the row.
    """

    def on_run_start(self, info: RunInfo) -> None:
        """The run is about to train (after its config was checked and written)."""

    def on_round_end(self, row: Mapping[str, Any]) -> None:
        """A round finished; `row` is its line of rounds.parquet."""

    def on_run_end(self, summary: Mapping[str, Any]) -> None:
        """The run finished; `summary` is what summary.json holds."""

    def close(self) -> None:
        """Releases files or connections (called once, whatever happened)."""


def numeric_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's finite numeric columns except ``round`` (the step): what a tracker logs.

    A round that is not evaluated has ``test_accuracy`` NaN; it is left out rather than
    logged as NaN, which trackers draw as a gap or refuse.
    """
    out = {}
    for key, value in row.items():
        if key == "round" or isinstance(value, bool):
            continue
        if isinstance(value, numbers.Real) and math.isfinite(float(value)):
            out[key] = float(value)
    return out
