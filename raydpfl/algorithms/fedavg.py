"""FedAvg (McMahan et al., AISTATS 2017), non-private, and its weighted aggregation.

Each round, `clients_per_round` clients drawn uniformly run `local_steps` minibatch
SGD steps from the global model; the server replaces the global model by the
data-size-weighted mean of the local models (Eq. 4 of ALI-DPFL, p_i = |D_i|/Σ|D|).

Server optimizer (``server_optimizer``; `raydpfl.algorithms.server_optimizers`): the
server may instead step on the weighted mean update Δ̄ with FedAvgM (``momentum``),
FedAdagrad, FedAdam or FedYogi (Reddi et al., ICLR 2021); the default, ``sgd`` with
``server_lr`` 1, is exactly θ ← θ + Δ̄. (FedAvg is non-private; for the private
algorithms that share this step it is post-processing of the noised aggregate.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    UniformCohortAlgorithm,
    trained_result,
)
from raydpfl.algorithms.server_optimizers import ServerOptimizerMixin


class CohortAveraging(ServerOptimizerMixin, UniformCohortAlgorithm):
    """The server half FedAvg and DP-FedAvg share: a uniform cohort of
    `clients_per_round` clients, each running `local_steps` local steps at `lr` from the
    global model, and the weighted mean update applied by the server optimizer.

    ``server_optimizer``, ``server_lr``, ``server_momentum``, ``server_beta2``,
    ``server_adam_eps``: the server's step on the weighted mean update
    (`raydpfl.algorithms.server_optimizers.server_step`); ``sgd`` at 1.0 is plain θ + Δ̄.
    ``aggregator`` ``median`` or ``trimmed_mean`` (with ``trim_fraction``) takes the step
    on that robust combination of the updates instead (`raydpfl.algorithms.aggregators`).
    Subclasses add their task's own fields (`task_fields`).
    """

    linear_aggregation = True

    def __init__(
        self,
        *,
        clients_per_round: int,
        local_steps: int,
        lr: float,
        server_optimizer: str = "sgd",
        server_lr: float = 1.0,
        server_momentum: float = 0.9,
        server_beta2: float = 0.99,
        server_adam_eps: float = 1e-3,
        aggregator: str = "mean",
        trim_fraction: float = 0.1,
    ) -> None:
        self.clients_per_round = clients_per_round
        self.local_steps = local_steps
        self.lr = lr
        self._set_server_optimizer(
            server_optimizer,
            server_lr,
            server_momentum,
            server_beta2,
            server_adam_eps,
            aggregator=aggregator,
            trim_fraction=trim_fraction,
        )

    def task_fields(self) -> dict[str, Any]:
        """This round's `ClientTask` fields beyond client, round, steps and lr (the same
        for every client of the round)."""
        return {}

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        fields = {"local_steps": self.local_steps, "lr": self.lr, **self.task_fields()}
        return [ClientTask(client_id=c, round_idx=round_idx, **fields) for c in cohort]


class FedAvg(CohortAveraging):
    """Non-private FedAvg with fixed local steps of minibatch SGD (`batch_size`); the
    server options are `CohortAveraging`'s (``sgd`` at 1.0 is plain FedAvg)."""

    name = "fedavg"
    is_private = False

    def __init__(self, *, batch_size: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.batch_size = batch_size

    def task_fields(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size}

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        start = {n: p.clone() for n, p in params.items()}
        n = data.num_examples
        batch = min(task.batch_size or n, n)
        order = torch.randperm(n, generator=ctx.generator, device=ctx.generator.device)
        cursor, loss_sum = 0, 0.0
        for _ in range(task.local_steps):
            # Batches walk through a per-round permutation, reshuffling at each epoch end.
            if cursor + batch > n:
                order = torch.randperm(n, generator=ctx.generator, device=ctx.generator.device)
                cursor = 0
            x, y = data.batch(order[cursor : cursor + batch])
            cursor += batch
            leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
            loss = F.cross_entropy(functional_call(ctx.model, leaves, (x,)), y)
            grads = torch.autograd.grad(loss, list(leaves.values()))
            with torch.no_grad():
                for p, g in zip(params.values(), grads, strict=True):
                    p.sub_(g, alpha=task.lr)
            loss_sum += float(loss.detach())
        metrics = {"train_loss": loss_sum / max(task.local_steps, 1)}
        return trained_result(task, data, params, start, metrics)
