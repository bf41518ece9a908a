"""DP-FedAvg with record-level DP-SGD on every client.

Each round, `clients_per_round` clients drawn uniformly run τ = `local_steps` DP-SGD
steps (Poisson rate q, flat per-sample clipping at C, Gaussian noise σ·C on the sum,
division by the expected batch q·|D_i|; see `raydpfl.privacy.per_sample.dpsgd`) from the global
model. The server takes the |D_i|-weighted mean of the updates (FedAvg).

Privacy (unit: one training record of one client; add/remove adjacency): a
participating client runs τ Poisson-subsampled Gaussian steps on its own records, so
its task declares τ uses of `SubsampledGaussian(σ, C, q)` (charged `PrivacyCost(σ, q, τ)`),
and the server charges that client's ledger
before dispatch. Client selection is treated as public: no amplification from it is
claimed, and clients are charged only for the rounds they take part in. Everything
the server sees from a client is post-processing of its DP-SGD outputs, except the
client's dataset size |D_i| (aggregation weight and DP-SGD denominator), which is
treated as public, and two training diagnostics (realised batch sizes and clipped
fraction), which are not privatised; both are listed in `unaccounted_releases`.

Server optimizer (``server_optimizer``; `raydpfl.algorithms.server_optimizers`): the
server may step on the round's weighted mean Δ̄ of the (noised) client updates with
FedAvgM (``momentum``), FedAdagrad, FedAdam or FedYogi (Reddi et al., ICLR 2021) instead
of θ ← θ + Δ̄. The step reads only the released updates and its own state: it is
post-processing, with no extra privacy cost and nothing more charged to any ledger. The
default, ``sgd`` with ``server_lr`` 1, is exactly θ + Δ̄.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    WeightedUpdateSum,
    privacy_session,
)
from raydpfl.algorithms.fedavg import CohortAveraging

# The client half is the shared DP-SGD loop; `DPFedAvg.local_update` looks the name up in
# this module at call time (benchmarks/repro/accumulator_ablation.py replaces it here).
from raydpfl.algorithms.local_dp_sgd import DPSGD_METRICS_RELEASE, Normalizer, dp_sgd_local_update
from raydpfl.privacy.mechanisms.kernel import SubsampledGaussian, uses
from raydpfl.privacy.per_sample import multi_client

__all__ = ["DPFedAvg", "Normalizer", "dp_sgd_local_update"]


class DPFedAvg(CohortAveraging):
    """DP-FedAvg: uniform cohorts, τ DP-SGD steps per client, weighted FedAvg.

    ``server_optimizer``, ``server_lr``, ``server_momentum``, ``server_beta2``,
    ``server_adam_eps`` (`CohortAveraging`): the server's step on the noisy weighted mean
    update (`raydpfl.algorithms.server_optimizers.server_step`; post-processing of the
    released updates, no extra privacy cost). The default ``sgd`` at 1.0 is plain θ + Δ̄.
    """

    name = "dp_fedavg"
    is_private = True

    def __init__(
        self, *, clip_norm: float, noise_multiplier: float, sampling_rate: float, **kw: Any
    ) -> None:
        super().__init__(**kw)
        self.clip_norm = clip_norm
        self.noise_multiplier = noise_multiplier
        self.sampling_rate = sampling_rate

    def task_fields(self) -> dict[str, Any]:
        return {"mechanisms": (uses(self.dp_sgd_mechanism(), self.local_steps),)}

    def dp_sgd_mechanism(self) -> SubsampledGaussian:
        """One DP-SGD step's mechanism: Poisson(q), clip C, noise σ·C."""
        return SubsampledGaussian(self.noise_multiplier, self.clip_norm, self.sampling_rate)

    def unaccounted_releases(self) -> list[str]:
        return [
            "client_dataset_sizes (aggregation weights and DP-SGD denominators q*|D_i|)",
            # Diagnostics for the researcher; computed on training records, not privatised.
            DPSGD_METRICS_RELEASE,
        ]

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        return dp_sgd_local_update(ctx, params, data, task)

    # ---- several clients at once (vectorised over clients) ------------------------
    def supports_group(self, tasks: Sequence[ClientTask]) -> bool:
        """Whether `local_update_group` can train `tasks` together, vectorised.

        True when this class still uses DP-FedAvg's own client half (a subclass that
        overrides `local_update` keeps the one-at-a-time path), and every task is a
        training task from the single global model, with no payload, the same τ, η, q,
        C and σ, and a non-empty client (the sequential path rejects q·|D_i| = 0 too).
        """
        if type(self).local_update is not DPFedAvg.local_update or not tasks:
            return False
        first = tasks[0]
        if first.sampling_rate is None or first.clip_norm is None:
            return False
        key = _group_key(first)
        return all(
            t.kind == "train"
            and t.model_key == "global"
            and t.payload is None
            and _group_key(t) == key
            for t in tasks
        )

    def local_update_group(
        self,
        ctxs: Sequence[ClientContext],
        params: Params,
        datas: Sequence[ClientData],
        tasks: Sequence[ClientTask],
    ) -> list[ClientResult]:
        """`local_update` for every task, all clients trained at once from `params`.

        `ctxs[k]` carries client k's own generator (advanced exactly as `local_update`
        would advance it); `params` is the shared broadcast start and is not modified.
        Results equal one-at-a-time `local_update` calls up to float error (see
        `raydpfl.privacy.per_sample.multi_client`). Groups that `supports_group` rejects run one
        at a time, each from a fresh copy of `params`.
        """
        if not (len(ctxs) == len(datas) == len(tasks)):
            raise ValueError(f"{len(ctxs)} contexts, {len(datas)} datasets, {len(tasks)} tasks")
        if not self.supports_group(tasks):
            return [
                self.local_update(ctx, {n: p.clone() for n, p in params.items()}, data, task)
                for ctx, data, task in zip(ctxs, datas, tasks, strict=True)
            ]
        out = self._train_group(ctxs, params, datas, tasks)
        return [
            ClientResult(
                client_id=task.client_id,
                update=out.update(k),
                weight=float(data.num_examples),
                num_examples=data.num_examples,
                metrics=out.metrics(k),
            )
            for k, (data, task) in enumerate(zip(datas, tasks, strict=True))
        ]

    def local_update_group_sum(
        self,
        ctxs: Sequence[ClientContext],
        params: Params,
        datas: Sequence[ClientData],
        tasks: Sequence[ClientTask],
    ) -> WeightedUpdateSum:
        """The group's Σ |D_k| Δ_k, what `ClientWorker.run_groups` builds one client at
        a time: here one weighted contraction over the stacked updates per tensor
        (`WeightedUpdateSum.of_stacked`), equal to the sequential partial sum up to float
        rounding, with the same weight, count and metric sums."""
        if not self.supports_group(tasks):
            acc = WeightedUpdateSum()
            for r in self.local_update_group(ctxs, params, datas, tasks):
                acc.add_result(r)
            return acc
        out = self._train_group(ctxs, params, datas, tasks)
        weights = [float(d.num_examples) for d in datas]
        return WeightedUpdateSum.of_stacked(
            out.updates, weights, [out.metrics(k) for k in range(len(tasks))]
        )

    def _train_group(
        self,
        ctxs: Sequence[ClientContext],
        params: Params,
        datas: Sequence[ClientData],
        tasks: Sequence[ClientTask],
    ) -> multi_client.MultiClientResult:
        first = tasks[0]
        # The platform trains the group from the clients' worker-bound sessions and counts
        # each one's τ invocations; the algorithm chooses τ and η only.
        sessions = [privacy_session(c, t, d) for c, t, d in zip(ctxs, tasks, datas, strict=True)]
        return multi_client.run_sessions(
            sessions, params, local_steps=first.local_steps, lr=first.lr
        )


def _group_key(task: ClientTask) -> tuple:
    """The hyperparameters every client of a vectorised group must share."""
    return (task.local_steps, task.lr, task.sampling_rate, task.clip_norm, task.noise_multiplier)
