"""RC-DPFL's baselines on the clustered-DPFL machinery (§6.14–6.17, §7).

All share `ClusteredDPFL`: every client trains every round with DP-SGD (Poisson rate
b/N_i, K·⌈N_i/b⌉ steps, single-stage accounting: z_i calibrated on E such rounds), the
server aggregates per model with weights N_i / Σ N_j.

- `ClusteredDPFedAvg` (``rc_dp_fedavg``, §6.17): one global model, unprefixed layout.
- `OracleCDPFL` (``o_cdpfl``, §6.16): DP-FedAvg inside each *true* cluster, all cluster
  models from θ^init; also ``rc_local`` with one "cluster" per client (local DP-SGD only).
- `KMeansCDPFL` (``km_cdpfl``, §6.15): each client trains the model of the cluster it was
  in last round (θ^init in round 1); the server runs k-means++ (k = M, n_init = 10) on the
  round's updates; cluster c's new model is the N-weighted mean of its members' post-training
  models; the clustering is recomputed from scratch every round (no memory, "myopic").
- `IfcaCDPFL` (``f_cdpfl``, §6.14): M models from M random initialisations; every round each
  client picks argmin_m f_i(θ_m) on its raw train data, trains that model, and the server
  averages per cluster. The choice reads raw data (unaccounted release).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    server_stream,
)
from raydpfl.algorithms.local_dp_sgd import (
    DPSGD_METRICS_RELEASE,
    dp_sgd_local_loop,
    dp_sgd_local_update,
)
from raydpfl.algorithms.multi_model import GLOBAL_MODEL
from raydpfl.papers.rc_dpfl.algorithm import (
    ClusteredDPFL,
    flat_update,
    followup_choices,
    round_of,
    train_loss_and_accuracy,
)
from raydpfl.papers.rc_dpfl.assignment import loss_assignments
from raydpfl.papers.rc_dpfl.clustering import update_features


class ClusteredDPFedAvg(ClusteredDPFL):
    """DP-FedAvg with RC-DPFL's DP-SGD schedule: one model, all clients (§6.17)."""

    name = "rc_dp_fedavg"
    single_model = True

    def __init__(self, **common: Any) -> None:
        super().__init__(num_models=1, **common)


class OracleCDPFL(ClusteredDPFL):
    """O-CDPFL: the true clusters are known from round 1 (§6.16).

    Args:
        clusters: s(i) for every client (cluster ids 0..M−1).
    """

    name = "o_cdpfl"

    def __init__(self, *, clusters: Sequence[int], **common: Any) -> None:
        labels = np.asarray(clusters, dtype=np.int64)
        super().__init__(num_models=int(labels.max()) + 1, **common)
        if len(labels) != self.num_clients:
            raise ValueError(f"need {self.num_clients} cluster labels, got {len(labels)}")
        self.assignment = labels.copy()

    def after_round(self, round_idx: int, metrics: Mapping[str, float], followups=()) -> dict:
        return self.clustering_metrics(self.assignment)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        return None  # the assignment is fixed


class LocalDPSGD(OracleCDPFL):
    """Local training (``rc_local``): each client its own model, DP-SGD only, no averaging."""

    name = "rc_local"

    def __init__(self, **common: Any) -> None:
        super().__init__(clusters=np.arange(int(common["num_clients"])), **common)

    def after_round(self, round_idx: int, metrics: Mapping[str, float], followups=()) -> dict:
        return {}

    def unaccounted_releases(self) -> list[str]:
        return [
            DPSGD_METRICS_RELEASE,
        ]


class KMeansCDPFL(ClusteredDPFL):
    """KM-CDPFL: k-means++ on every round's updates (§6.15).

    Args:
        features: "raw" (flattened updates) or "pca" (RC-DPFL's feature pipeline).
    """

    name = "km_cdpfl"

    def __init__(self, *, features: Literal["raw", "pca"] = "raw", **common: Any) -> None:
        super().__init__(**common)
        self.features = features
        self._metrics: dict[str, float] = {}

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        from sklearn.cluster import KMeans

        r_idx = round_of(tasks)
        models = self.split(global_params)
        if len(results) < self.num_models:  # too few updates to cluster: keep everything
            return self.join(models)
        x = np.stack([flat_update(r.update) for r in results])
        if self.features == "pca":
            x = update_features(x, d_pca=min(2, len(results) - 1))
        seed = int(server_stream(self.seed, r_idx, "km_cdpfl").integers(2**31 - 1))
        labels = KMeans(
            n_clusters=self.num_models, init="k-means++", n_init=10, random_state=seed
        ).fit_predict(x)
        new_models = []
        for c in range(self.num_models):
            members = [(r, m) for r, m in zip(results, labels, strict=True) if m == c]
            total = float(sum(r.weight for r, _ in members))
            if not members or total <= 0:
                new_models.append({n: t.clone() for n, t in models[0].items()})
                continue
            acc = {n: torch.zeros_like(t) for n, t in models[0].items()}
            for r, _ in members:
                start = models[int(self.assignment[r.client_id])]
                for n in acc:  # post-training model = start + Δ
                    acc[n].add_(start[n] + r.update[n], alpha=r.weight)
            new_models.append({n: acc[n] / total for n in acc})
        for r, c in zip(results, labels, strict=True):
            self.assignment[r.client_id] = int(c)
        self._metrics = self.clustering_metrics(self.assignment)
        return self.join(new_models)

    def after_round(self, round_idx: int, metrics: Mapping[str, float], followups=()) -> dict:
        out, self._metrics = self._metrics, {}
        return out


class IfcaCDPFL(ClusteredDPFL):
    """f-CDPFL (IFCA / HYPCLUSTER): loss-based clustering from M random inits (§6.14).

    Args:
        init_models: The M initial models (different random seeds). They are construction
            -time constants of the client half too: in round 1 each client scores them to
            pick the model it trains.
    """

    name = "f_cdpfl"

    def __init__(self, *, init_models: Sequence[Params], **common: Any) -> None:
        super().__init__(num_models=len(init_models), **common)
        self.init_models = [{n: t.detach().clone() for n, t in m.items()} for m in init_models]
        self._metrics: dict[str, float] = {}

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        tasks = super().plan(round_idx, cohort, train_sizes)
        if round_idx != 0:
            return tasks
        # Round 1: the client picks argmin_m f_i(θ_m^init) itself, then trains it.
        return [
            ClientTask(**{**_fields(t), "extras": {"pick_init": 1.0}, "model_key": GLOBAL_MODEL})
            for t in tasks
        ]

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        if round_of(tasks) == 0:
            for r in results:
                self.assignment[r.client_id] = int(r.metrics["cluster"])
            models = [dict(m) for m in self.init_models]
        else:
            models = self.split(global_params)
        from raydpfl.papers.rc_dpfl.algorithm import cluster_sums

        return self.join(cluster_sums(models, self.assignment, results))

    def reassignment(self, round_idx: int) -> tuple[bool, float | None]:
        return True, None  # every round: the raw argmin of the train losses

    def after_round(self, round_idx: int, metrics: Mapping[str, float], followups=()) -> dict:
        if followups:
            self.assignment = followup_choices(followups, self.assignment)
        return self.clustering_metrics(self.assignment)

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        if task.extras.get("pick_init"):
            # The initial models are construction-time (CPU) constants: score them on the
            # worker's device.
            candidates = [{n: t.to(ctx.device) for n, t in m.items()} for m in self.init_models]
            losses = [train_loss_and_accuracy(ctx.model, m, data)[0] for m in candidates]
            choice = int(loss_assignments(np.asarray([losses]))[0])
            with torch.no_grad():
                for n, t in params.items():
                    t.copy_(candidates[choice][n])
            result = dp_sgd_local_update(ctx, params, data, task)
            result.metrics["cluster"] = float(choice)
            return result
        return super().local_update(ctx, params, data, task)

    def unaccounted_releases(self) -> list[str]:
        return [
            *super().unaccounted_releases(),
            "loss_based_cluster_choice (each client's argmin_m of its train loss under the "
            "M cluster models, on raw training data, every round)",
        ]


def _fields(task: ClientTask) -> dict[str, Any]:
    return {f: getattr(task, f) for f in task.__dataclass_fields__}


class MrMtl(ClusteredDPFL):
    """MR-MTL (mean-regularised multi-task learning; the authors' later code, spec §7).

    Each client keeps a personal model θ_i (model key ``c{i}``) and the server the mean θ̄
    of the personal models (key ``mean``). A round: client i runs K·⌈N_i/b⌉ DP-SGD steps on
    its objective f_i(θ_i) + (λ/2)‖θ_i − θ̄‖²; the regulariser's gradient λ(θ_i − θ̄) does
    not touch the data and is added to the privatised gradient (no privacy cost): the
    shared DP-SGD loop's correction hook, fused into one update θ_i ← θ_i − η·(g + λ(θ_i − θ̄)). The
    server sets θ_i ← θ_i + Δ_i and θ̄ ← the N-weighted mean of the θ_i. λ = 0 is local
    training.

    Args:
        reg_weight: λ (the authors' 1.0).
    """

    name = "mr_mtl"

    def __init__(self, *, reg_weight: float = 1.0, **common: Any) -> None:
        super().__init__(num_models=int(common["num_clients"]), **common)
        self.reg_weight = float(reg_weight)
        self.assignment = np.arange(self.num_clients, dtype=np.int64)

    def keys(self) -> list[str]:
        return [f"c{i}" for i in range(self.num_clients)]

    def start_key(self, round_idx: int, client: int) -> str:
        return "*"  # the client reads its own model and the mean

    def split(self, params: Params) -> list[Params]:
        from raydpfl.algorithms.multi_model import is_multi_model, model_params

        if not is_multi_model(params):
            return [dict(params) for _ in range(self.num_clients + 1)]
        return [model_params(params, k) for k in [*self.keys(), "mean"]]

    def join(self, models: Sequence[Params]) -> Params:
        from raydpfl.algorithms.multi_model import join_models

        return join_models(models, [*self.keys(), "mean"])

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        models = self.split(global_params)
        personal = [{n: t.clone() for n, t in m.items()} for m in models[:-1]]
        for r in results:
            for n in personal[r.client_id]:
                personal[r.client_id][n].add_(r.update[n])
        weights = np.asarray([float(r.weight) for r in results]) if results else None
        if weights is not None and weights.sum() > 0:
            by_client = {r.client_id: float(r.weight) for r in results}
            total = sum(by_client.values())
            mean = {
                n: sum(
                    (personal[c][n] * (w / total) for c, w in sorted(by_client.items())),
                    torch.zeros_like(personal[0][n]),
                )
                for n in personal[0]
            }
        else:
            mean = models[-1]
        return self.join([*personal, mean])

    def evaluation_model_keys(self, num_clients: int) -> list[str] | None:
        return self.keys()

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        from raydpfl.algorithms.multi_model import is_multi_model, model_params

        if is_multi_model(params):
            own = model_params(params, f"c{task.client_id}")
            mean = model_params(params, "mean")
        else:  # round 1: every model is θ^init
            own = mean = params
        theta = {n: t.detach().clone() for n, t in own.items()}
        reg = self.reg_weight

        def pull_to_mean(current: Params, start: Params, payload: Any) -> Params:
            """λ(θ_i − θ̄) at the step's start point: reads θ̄ only (no data, no cost)."""
            return {name: reg * (p - mean[name]) for name, p in current.items()}

        # The shared DP-SGD loop; fused: θ ← θ − η·(g + λ(θ − θ̄)), the order MR-MTL was
        # published with. Its diagnostics are not part of MR-MTL's results.
        start, _ = dp_sgd_local_loop(
            ctx, theta, data, task, correction=pull_to_mean, fused_correction=True
        )
        n = data.num_examples
        return ClientResult(
            client_id=task.client_id,
            update={k: theta[k] - start[k] for k in theta},
            weight=float(n),
            num_examples=n,
        )
