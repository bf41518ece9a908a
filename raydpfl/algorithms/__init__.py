"""Federated algorithms: plain objects with a server half and a client half (no Ray)."""

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

ALGORITHMS: dict[str, type[Algorithm]] = {FedAvg.name: FedAvg, DPFedAvg.name: DPFedAvg}

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ClientContext",
    "ClientData",
    "ClientResult",
    "ClientTask",
    "DPFedAvg",
    "FedAvg",
    "WeightedUpdateSum",
]
