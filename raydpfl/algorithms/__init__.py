"""The algorithm kit: the contract every algorithm follows (`base`), the DP-SGD local
loop, FedAvg, DP-FedAvg, client-level DP (DP-FedAvg, adaptive clipping, DP-FTRL) and the
server optimizers. Plain objects with a server half and a client half (no Ray).

The seed papers' algorithms are plug-ins built on this kit (`raydpfl.papers`); nothing
here names a paper.
"""

from raydpfl.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    WeightedUpdateSum,
)
from raydpfl.algorithms.dp_fedavg import DPFedAvg
from raydpfl.algorithms.fedavg import FedAvg

__all__ = [
    "Algorithm",
    "ClientContext",
    "ClientData",
    "ClientResult",
    "ClientTask",
    "DPFedAvg",
    "FedAvg",
    "WeightedUpdateSum",
]
