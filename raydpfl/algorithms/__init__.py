"""Federated algorithms: plain objects with a server half and a client half (no Ray)."""

from raydpfl.algorithms.adap_dp_fl import AdapDpFl
from raydpfl.algorithms.ali_dpfl import AliDpfl, DPFedAvgFixedTau
from raydpfl.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    WeightedUpdateSum,
)
from raydpfl.algorithms.dp_fedavg import DPFedAvg
from raydpfl.algorithms.dpfl_bcs import BcsFedSgd, DpflBcs
from raydpfl.algorithms.fedavg import FedAvg
from raydpfl.algorithms.fedfair import FedFair
from raydpfl.algorithms.fedfdp import FedFDP
from raydpfl.algorithms.fedfdp_baselines import (
    DPQFFL,
    QFFL,
    DPFedDyn,
    DPFedProx,
    DPScaffold,
    FedDyn,
    FedProx,
    Scaffold,
)
from raydpfl.algorithms.pe_dpfl import PeDpfl
from raydpfl.algorithms.rc_dpfl import ClusteredDPFL, RcDpfl
from raydpfl.algorithms.rc_dpfl_baselines import (
    ClusteredDPFedAvg,
    IfcaCDPFL,
    KMeansCDPFL,
    LocalDPSGD,
    MrMtl,
    OracleCDPFL,
)

__all__ = [
    "DPQFFL",
    "QFFL",
    "AdapDpFl",
    "Algorithm",
    "AliDpfl",
    "BcsFedSgd",
    "ClientContext",
    "ClientData",
    "ClientResult",
    "ClientTask",
    "ClusteredDPFL",
    "ClusteredDPFedAvg",
    "DPFedAvg",
    "DPFedAvgFixedTau",
    "DPFedDyn",
    "DPFedProx",
    "DPScaffold",
    "DpflBcs",
    "FedAvg",
    "FedDyn",
    "FedFDP",
    "FedFair",
    "FedProx",
    "IfcaCDPFL",
    "KMeansCDPFL",
    "LocalDPSGD",
    "MrMtl",
    "OracleCDPFL",
    "PeDpfl",
    "RcDpfl",
    "Scaffold",
    "WeightedUpdateSum",
]
