"""Config of RC-DPFL and its baselines (issue 7; shared/specs/robust-clustering.md).

`NAMES` are the algorithm names this section serves; `MODEL_NAMES` the models it adds
to `experiment.model.name`. The options live under `experiment.algorithm.rc_dpfl`;
the cluster-structured data under `experiment.data.cluster_shift`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raydpfl.config._base import _check  # noqa: F401  (used by the section's checks)

NAMES: tuple[str, ...] = ()
MODEL_NAMES: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ClusterShiftConfig:
    """Clients in clusters with shifted data (`experiment.data.cluster_shift`).

    ``none`` leaves the data as partitioned by `experiment.data.partition`.
    """

    kind: Literal["none"] = "none"

    def __post_init__(self) -> None:
        pass


@dataclass(frozen=True, kw_only=True)
class RcDpflConfig:
    """RC-DPFL options (`experiment.algorithm.rc_dpfl`)."""

    def __post_init__(self) -> None:
        pass
