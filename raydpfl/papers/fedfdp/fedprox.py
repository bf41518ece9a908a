"""FedProx (Li et al., MLSys 2020) and DP-FedProx, FedFDP's baselines
(shared/specs/fedfdp.md §8.3, §11 A16): local gradient + μ(w − w_t) (proximal term), the
correction hook of `raydpfl.papers.fedfdp.pfl_base.local_sgd`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from raydpfl.algorithms.base import ClientContext, ClientData, ClientResult, ClientTask, Params
from raydpfl.algorithms.local_dp_sgd import Correction
from raydpfl.algorithms.server_optimizers import ServerOptimizerMixin
from raydpfl.papers.fedfdp.pfl_base import PflBase, run_local_sgd


def prox_correction(mu: float) -> Correction:
    """∇ of (μ/2)‖w − w_t‖²: μ(w − w_t) (FedProx, Li et al. 2020, Eq. 2)."""

    def term(params: Params, start: Params, payload: Mapping[str, torch.Tensor]) -> Params:
        return {n: mu * (params[n] - start[n]) for n in params}

    return term


class FedProx(ServerOptimizerMixin, PflBase):
    """FedProx: FedAvg with the proximal term μ/2‖w − w_t‖² in every local objective.

    ``server_optimizer``, ``server_lr``, ``server_momentum``, ``server_beta2``,
    ``server_adam_eps``: the server's step on the weighted mean update
    (`raydpfl.algorithms.server_optimizers`: FedAvgM, FedAdagrad, FedAdam, FedYogi); for
    DP-FedProx it is post-processing of the noised updates, no extra privacy cost. The
    default ``sgd`` at 1.0 is plain w ← w + Δ̄. ``aggregator``, ``trim_fraction``: a robust
    combination instead of the mean (`raydpfl.algorithms.aggregators`).
    """

    name = "fedprox"
    linear_aggregation = True

    def __init__(
        self,
        *,
        mu: float = 0.01,
        server_optimizer: str = "sgd",
        server_lr: float = 1.0,
        server_momentum: float = 0.9,
        server_beta2: float = 0.99,
        server_adam_eps: float = 1e-3,
        aggregator: str = "mean",
        trim_fraction: float = 0.1,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.mu = mu
        self._set_server_optimizer(
            server_optimizer,
            server_lr,
            server_momentum,
            server_beta2,
            server_adam_eps,
            aggregator=aggregator,
            trim_fraction=trim_fraction,
        )

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        return run_local_sgd(self, ctx, params, data, task, prox_correction(self.mu))


class DPFedProx(FedProx):
    """FedProx with DP-SGD local steps (Table 3's "FedProx")."""

    name = "dp_fedprox"
    is_private = True
