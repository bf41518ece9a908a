"""Config of FedFDP / FedFair and their baselines (issue 5; shared/specs/fedfdp.md).

`NAMES` are the algorithm names this section serves (`experiment.algorithm.name`);
the options live under `experiment.algorithm.fedfdp`.
"""

from __future__ import annotations

from dataclasses import dataclass

from raydpfl.config._base import _check  # noqa: F401  (used by the section's checks)

#: Algorithm names of the FedFDP paper (the algorithms and their baselines).
NAMES: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class FedFdpConfig:
    """FedFDP/FedFair options (`experiment.algorithm.fedfdp`)."""

    def __post_init__(self) -> None:
        pass
