"""Config of DPFL-BCS and its baselines (issue 6; shared/specs/dpfl-bcs.md).

`NAMES` are the algorithm names this section serves; `MODEL_NAMES` and
`DATASET_NAMES` the models and datasets it adds to `experiment.model.name` and
`experiment.data.dataset`. The options live under `experiment.algorithm.dpfl_bcs`.
"""

from __future__ import annotations

from dataclasses import dataclass

from raydpfl.config._base import _check  # noqa: F401  (used by the section's checks)

NAMES: tuple[str, ...] = ()
MODEL_NAMES: tuple[str, ...] = ()
DATASET_NAMES: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DpflBcsConfig:
    """DPFL-BCS options (`experiment.algorithm.dpfl_bcs`)."""

    def __post_init__(self) -> None:
        pass
