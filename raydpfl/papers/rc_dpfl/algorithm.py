"""RC-DPFL (Algorithm 1) and the clustered-DPFL machinery its baselines share.

Paper: "Mitigating Disparate Impact of Differential Privacy in Federated Learning through
Robust Clustering" (Malekmohammadi, Taik, Farnadi; seed 004; spec
shared/specs/robust-clustering.md, cited as §). Every client trains every round with
record-level DP-SGD on its own data (Eq. 1: per-sample clipping at c, Gaussian noise
c·z on the clipped sum, Poisson sampling at q = b/N_i, K·⌈N_i/b⌉ steps per round). The
server keeps M cluster models in one parameter dict, model m under ``"m{m}/{name}"``
(`raydpfl.algorithms.multi_model`), and aggregates each cluster's updates with
weights N_i / Σ_{j∈S_m} N_j (Algorithm 1 lines 14–16; an empty cluster keeps its model).

RC-DPFL (`RcDpfl`), §3.4:

1. round 1: every client runs K epochs of *full-batch* DP-SGD (q = 1, K steps) from
   θ^init; the server fits a spherical GMM to features of the n updates (§6.5) and keeps
   the posteriors π_i; the cluster models stay θ^init (or get the π-weighted mean update,
   ``round1_init="pi_weighted"``, §6.2);
2. rounds 2..E_c+1: R^e(i) ~ Categorical(π_i), a fresh draw each round (lines 9/18);
3. from the end of round E_c+1 on: R(i) = argmin_m f_i(θ_m) on the client's train split
   (line 20), computed by the client on every cluster model (a follow-up task with
   ``model_key="*"``); with ``selection_privacy="gumbel"`` the client reports instead the
   Gumbel-noisy argmax of its train accuracies (exponential mechanism, §5.4), charged to
   its ledger, for a fixed number of rounds after which the assignment is frozen.

Privacy (unit: one training record of one client, add/remove): the round-1 task declares
`PrivacyCost(z_i, 1.0, K)`, later rounds `PrivacyCost(z_i, b/N_i, K·⌈N_i/b⌉)`, and a
private selection `PrivacyCost(2/ε_sel, 1.0, 1)` (the Gaussian mechanism with the same
RDP curve α·ε_sel²/8 as the exponential mechanism; valid for RDP accounting only). z_i is
calibrated on exactly that history (`accounting.two_stage_noise_multiplier`). The GMM,
the sampling of R and the aggregation are post-processing of DP outputs. The raw
loss-based choice reads training data without noise: it is listed in
`unaccounted_releases` unless the private selection is on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from raydpfl.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    privacy_session,
    server_stream,
)
from raydpfl.algorithms.local_dp_sgd import DPSGD_METRICS_RELEASE, dp_sgd_local_update
from raydpfl.algorithms.multi_model import (
    ALL_MODELS,
    GLOBAL_MODEL,
    cluster_key,
    is_multi_model,
    join_models,
    model_params,
)
from raydpfl.papers.rc_dpfl.accounting import steps_per_round
from raydpfl.papers.rc_dpfl.assignment import (
    loss_assignments,
    sample_assignments,
)
from raydpfl.papers.rc_dpfl.clustering import (
    fit_update_gmm,
    gmm_stage_rounds,
    select_num_clusters,
    update_features,
)
from raydpfl.papers.rc_dpfl.metrics import exact_partition_rate, hungarian_clustering_accuracy
from raydpfl.privacy.mechanisms.kernel import ExponentialSelection, SubsampledGaussian, uses

#: `ClientTask.kind` of the follow-up that picks a client's next cluster.
ASSIGN = "assign"
_EVAL_BATCH = 1024


def flat_update(update: Mapping[str, torch.Tensor]) -> np.ndarray:
    """Δθ̃ flattened in parameter order, float64 (one row of the GMM's input)."""
    return torch.cat(
        [t.detach().reshape(-1).to("cpu", torch.float64) for t in update.values()]
    ).numpy()


def cluster_sums(
    models: Sequence[Params],
    assignment: np.ndarray,
    results: Sequence[ClientResult],
) -> list[Params]:
    """Algorithm 1 lines 14–16: θ_m + Σ_{i: R(i)=m} (N_i / Σ_{j: R(j)=m} N_j) Δθ̃_i.

    Results are added in plan order (bit-identical on any backend); an empty cluster
    keeps its model.
    """
    out = []
    for m, model in enumerate(models):
        members = [r for r in results if int(assignment[r.client_id]) == m]
        total = float(sum(r.weight for r in members))
        if not members or total <= 0:
            out.append({n: t.clone() for n, t in model.items()})
            continue
        acc = {n: torch.zeros_like(t) for n, t in model.items()}
        for r in members:
            for n in acc:
                acc[n].add_(r.update[n], alpha=r.weight)
        out.append({n: model[n] + acc[n] / total for n in model})
    return out


@torch.no_grad()
def train_loss_and_accuracy(
    model: torch.nn.Module, params: Params, data: ClientData
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy (in %) of `params` on the client's train split
    (eval mode, no noise; §6.13)."""
    n = data.num_examples
    loss_sum, correct = 0.0, 0
    for start in range(0, n, _EVAL_BATCH):
        x, y = data.batch(torch.arange(start, min(n, start + _EVAL_BATCH), device=data.device))
        logits = functional_call(model, params, (x,))
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
    return loss_sum / max(n, 1), 100.0 * correct / max(n, 1)


class ClusteredDPFL(Algorithm):
    """Shared machinery: all clients every round, per-cluster DP-SGD and aggregation.

    Subclasses decide the assignment R (which cluster model each client trains next) and
    may override `_round_task` / `aggregate`. With `num_models == 1` and `single_model`
    the one model keeps the unprefixed layout (DP-FedAvg).

    Args:
        num_models: M, the number of models the server keeps.
        num_clients: n.
        lr: η_l.
        clip_norm: c.
        noise_multipliers: z_i per client (σ_i,DP = c·z_i).
        batch_size: b (expected Poisson batch).
        local_epochs: K.
        seed: Seeds the server-side streams (assignment sampling, GMM, k-means).
        true_clusters: s(i), for the clustering-accuracy diagnostics only (never used to
            decide anything, except by the oracle).
    """

    is_private = True
    linear_aggregation = False
    single_model = False

    def __init__(
        self,
        *,
        num_models: int,
        num_clients: int,
        lr: float,
        clip_norm: float,
        noise_multipliers: Sequence[float],
        batch_size: int,
        local_epochs: int,
        seed: int,
        true_clusters: Sequence[int] | None = None,
    ) -> None:
        if len(noise_multipliers) != num_clients:
            raise ValueError(f"need {num_clients} noise multipliers, got {len(noise_multipliers)}")
        self.num_models = int(num_models)
        self.num_clients = int(num_clients)
        self.lr = float(lr)
        self.clip_norm = float(clip_norm)
        self.noise_multipliers = [float(z) for z in noise_multipliers]
        self.batch_size = int(batch_size)
        self.local_epochs = int(local_epochs)
        self.seed = int(seed)
        self.true_clusters = None if true_clusters is None else np.asarray(true_clusters, np.int64)
        self.assignment = np.zeros(self.num_clients, dtype=np.int64)

    # ---- layout --------------------------------------------------------------------
    def model_key(self, m: int) -> str:
        return GLOBAL_MODEL if self.single_model else cluster_key(m)

    def split(self, params: Params) -> list[Params]:
        """The M models of the server's dict (M copies of an unprefixed initial dict)."""
        if self.single_model:
            return [dict(params)]
        if not is_multi_model(params):
            return [dict(params) for _ in range(self.num_models)]
        return [model_params(params, cluster_key(m)) for m in range(self.num_models)]

    def join(self, models: Sequence[Params]) -> Params:
        if self.single_model:
            return dict(models[0])
        return join_models(models, [cluster_key(m) for m in range(len(models))])

    # ---- server half ---------------------------------------------------------------
    def select(self, round_idx: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        return list(range(num_clients))  # full participation (§7)

    def dp_sgd_task(
        self, client: int, round_idx: int, size: int, model_key: str, full_batch: bool = False
    ) -> ClientTask:
        """K·⌈N/b⌉ Poisson steps at q = b/N, or K full-batch steps (q = 1)."""
        z = self.noise_multipliers[client]
        if full_batch:
            q, steps = 1.0, self.local_epochs
        else:
            b = min(self.batch_size, size)
            q, steps = b / size, steps_per_round(size, b, self.local_epochs)
        return ClientTask(
            client_id=client,
            round_idx=round_idx,
            local_steps=steps,
            lr=self.lr,
            mechanisms=(uses(SubsampledGaussian(z, self.clip_norm, q), steps),),
            model_key=model_key,
        )

    def start_key(self, round_idx: int, client: int) -> str:
        """The model client `client` trains this round (after round 1: its cluster's)."""
        if round_idx == 0 and not self.single_model:
            return GLOBAL_MODEL  # every model is still θ^init (unprefixed)
        return self.model_key(int(self.assignment[client]))

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        self.prepare_round(round_idx)
        return [
            self.dp_sgd_task(c, round_idx, int(train_sizes[c]), self.start_key(round_idx, c))
            for c in cohort
        ]

    def prepare_round(self, round_idx: int) -> None:
        """Hook: update `assignment` before planning round `round_idx`."""

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        models = cluster_sums(self.split(global_params), self.assignment, results)
        return self.join(models)

    def evaluation_model_keys(self, num_clients: int) -> list[str] | None:
        if self.single_model:
            return None
        return [cluster_key(int(m)) for m in self.evaluation_assignment()]

    def evaluation_assignment(self) -> np.ndarray:
        """The cluster whose model scores each client."""
        return self.assignment

    def clustering_metrics(
        self, assignment: np.ndarray, prefix: str = "cluster"
    ) -> dict[str, float]:
        """Hungarian-matched accuracy and exact-partition indicator vs the true clusters."""
        if self.true_clusters is None:
            return {}
        return {
            f"{prefix}_accuracy": hungarian_clustering_accuracy(self.true_clusters, assignment),
            f"{prefix}_exact": exact_partition_rate([(self.true_clusters, assignment)]),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"assignment": self.assignment.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.assignment = np.asarray(state["assignment"], dtype=np.int64)

    def unaccounted_releases(self) -> list[str]:
        return [
            "client_dataset_sizes (aggregation weights N_i and DP-SGD rates b/N_i)",
            DPSGD_METRICS_RELEASE,
        ]

    # ---- client half ---------------------------------------------------------------
    def followup_tasks(
        self,
        round_idx: int,
        tasks: Sequence[ClientTask],
        results: Sequence[ClientResult],
        new_params: Params,
    ) -> list[ClientTask]:
        """Every client's pick of its next cluster (an `ASSIGN` task) in the rounds where
        `reassignment` asks for one; no follow-up otherwise."""
        due, epsilon_select = self.reassignment(round_idx)
        if not due:
            return []
        return [assign_task(r.client_id, round_idx, epsilon_select) for r in results]

    def reassignment(self, round_idx: int) -> tuple[bool, float | None]:
        """(whether the clients pick their next cluster after this round's aggregation, the
        ε_select of the private pick or None for the raw argmin of losses). Default: never,
        the assignment is fixed or set by the server."""
        return False, None

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        if task.kind == ASSIGN:
            return self.choose_cluster(ctx, params, data, task)
        return dp_sgd_local_update(ctx, params, data, task)

    def choose_cluster(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        """Reports one cluster index (line 20): the argmin of the train losses (no
        mechanism declared: listed, the records are read raw), or the declared
        `ExponentialSelection`, which the platform runs on the cluster models' train
        accuracies in % (Gumbel noise, §5.4): only the chosen index comes back."""
        models = [model_params(params, cluster_key(m)) for m in range(self.num_models)]
        if not task.mechanisms:
            losses = [train_loss_and_accuracy(ctx.model, m, data)[0] for m in models]
            choice = int(loss_assignments(np.asarray([losses]))[0])
        else:
            selection = privacy_session(ctx, task, data).get(ExponentialSelection)
            choice = selection.most_accurate(models)
        return ClientResult(
            client_id=task.client_id,
            update={},
            weight=0.0,
            num_examples=data.num_examples,
            metrics={"cluster": float(choice)},
        )


def assign_task(client: int, round_idx: int, epsilon_select: float | None) -> ClientTask:
    """The follow-up that asks a client for its next cluster (reads every model)."""
    mechanisms = () if epsilon_select is None else (uses(ExponentialSelection(epsilon_select), 1),)
    return ClientTask(
        client_id=client,
        round_idx=round_idx,
        local_steps=0,
        lr=0.0,
        mechanisms=mechanisms,
        model_key=ALL_MODELS,
        kind=ASSIGN,
    )


def followup_choices(followups: Sequence[ClientResult], current: np.ndarray) -> np.ndarray:
    """The new assignment: each reporting client's choice; others keep theirs."""
    out = current.copy()
    for r in followups:
        out[r.client_id] = int(r.metrics["cluster"])
    return out


class RcDpfl(ClusteredDPFL):
    """RC-DPFL, Algorithm 1 (module docstring).

    Args (besides `ClusteredDPFL`'s):
        rounds: E, the total number of rounds (round 1 included).
        gmm_stage_rounds: E_c; None = the authors' rule int((1 − O)·E/2) (§6.7).
        select_num_clusters: "given" (M = num_models) or "mss" (§6.4; the server then
            keeps the selected number of models).
        feature_space, d_pca, scaler: the GMM's input pipeline (§6.5).
        round1_init: "init" or "pi_weighted" (§6.2).
        selection_epsilon: ε_select of the private loss-stage selection; None = raw argmin.
        selection_rounds: number of private selections before the assignment is frozen.
    """

    name = "rc_dpfl"

    def __init__(
        self,
        *,
        rounds: int,
        gmm_stage_rounds: int | None = None,
        select_num_clusters: Literal["given", "mss"] = "given",
        feature_space: Literal["pca", "raw"] = "pca",
        d_pca: int = 2,
        scaler: Literal["minmax", "standard", "none"] = "minmax",
        round1_init: Literal["init", "pi_weighted"] = "init",
        selection_epsilon: float | None = None,
        selection_rounds: int = 0,
        **common: Any,
    ) -> None:
        super().__init__(**common)
        self.rounds = int(rounds)
        self.fixed_gmm_stage = gmm_stage_rounds
        self.select_mode = select_num_clusters
        self.feature_space = feature_space
        self.d_pca = int(d_pca)
        self.scaler = scaler
        self.round1_init = round1_init
        self.selection_epsilon = selection_epsilon
        self.selection_rounds = int(selection_rounds)
        self.posteriors: np.ndarray | None = None
        self.gmm_stage: int | None = None
        self.selections_done = 0
        self.loss_assigned = False  # whether a loss-based choice has been made yet
        self._round_metrics: dict[str, float] = {}

    # Round r (0-based): 0 = full batch; 1..E_c = R ~ π; > E_c = last loss-based choice.
    def prepare_round(self, round_idx: int) -> None:
        if round_idx >= 1 and self.posteriors is not None and round_idx <= self.gmm_stage_rounds():
            self.assignment = sample_assignments(
                self.posteriors, server_stream(self.seed, round_idx, "rc_dpfl_assign")
            )

    def gmm_stage_rounds(self) -> int:
        return 0 if self.gmm_stage is None else self.gmm_stage

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        if round_idx == 0:
            return [
                self.dp_sgd_task(c, 0, int(train_sizes[c]), GLOBAL_MODEL, full_batch=True)
                for c in cohort
            ]
        return super().plan(round_idx, cohort, train_sizes)

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        if round_of(tasks) != 0:
            return super().aggregate(global_params, tasks, results)
        # Line 7: the GMM on the round-1 updates; no aggregation (θ_m^2 = θ^init).
        updates = np.stack([flat_update(r.update) for r in results])
        features = update_features(
            updates, feature_space=self.feature_space, d_pca=self.d_pca, scaler=self.scaler
        )
        gmm_seed = int(server_stream(self.seed, 0, "rc_dpfl_gmm").integers(2**31 - 1))
        scores: dict[int, float] = {}
        if self.select_mode == "mss":
            self.num_models, scores = select_num_clusters(features, random_state=gmm_seed)
        gmm = fit_update_gmm(features, self.num_models, random_state=gmm_seed)
        # A client without a round-1 update (refused) gets the uninformative uniform π.
        pi = np.full((self.num_clients, self.num_models), 1.0 / self.num_models)
        for row, r in enumerate(results):
            pi[r.client_id] = gmm.posteriors[row]
        self.posteriors = pi
        e_c = (
            gmm_stage_rounds(gmm.max_overlap, self.rounds)
            if self.fixed_gmm_stage is None
            else int(self.fixed_gmm_stage)
        )
        self.gmm_stage = e_c
        self.assignment = pi.argmax(axis=1).astype(np.int64)
        self._round_metrics = {
            "gmm_min_separation": gmm.min_separation,
            "gmm_max_overlap": gmm.max_overlap,
            "gmm_stage_rounds": float(e_c),
            "num_clusters": float(self.num_models),
            **{f"mss_M{m}": s for m, s in scores.items()},
            **self.clustering_metrics(self.assignment, "gmm_cluster"),
        }
        base = dict(global_params)
        models = [{n: t.clone() for n, t in base.items()} for _ in range(self.num_models)]
        if self.round1_init == "pi_weighted":
            for m in range(self.num_models):
                w = np.array([pi[r.client_id, m] * r.weight for r in results])
                if w.sum() > 0:
                    for n in models[m]:
                        step = sum(
                            (float(wk) * r.update[n] for wk, r in zip(w, results, strict=True)),
                            torch.zeros_like(models[m][n]),
                        )
                        models[m][n] += step / float(w.sum())
        return self.join(models)

    def reassignment(self, round_idx: int) -> tuple[bool, float | None]:
        if round_idx < 1 or round_idx < self.gmm_stage_rounds():
            return False, None  # the next round still samples from π
        if self.selection_epsilon is not None:
            if self.selections_done >= self.selection_rounds:
                return False, None  # budgeted selections spent: the assignment is frozen (§5.4)
            self.selections_done += 1
        return True, self.selection_epsilon

    def after_round(
        self,
        round_idx: int,
        metrics: Mapping[str, float],
        followups: Sequence[ClientResult] = (),
    ) -> dict[str, float]:
        out, self._round_metrics = self._round_metrics, {}
        if followups:
            self.assignment = followup_choices(followups, self.assignment)
            self.loss_assigned = True
        stage = 1.0 if round_idx == 0 else (2.0 if round_idx <= self.gmm_stage_rounds() else 3.0)
        out["rc_stage"] = stage
        out.update(self.clustering_metrics(self.evaluation_assignment()))
        return out

    def evaluation_assignment(self) -> np.ndarray:
        # In the GMM stage each client is scored with its most probable cluster's model
        # (the sampled R changes every round); afterwards with its loss-based cluster.
        if self.posteriors is not None and not self.loss_assigned:
            return self.posteriors.argmax(axis=1).astype(np.int64)
        return self.assignment

    def state_dict(self) -> dict[str, Any]:
        return {
            "assignment": self.assignment.tolist(),
            "posteriors": None if self.posteriors is None else self.posteriors.tolist(),
            "gmm_stage": self.gmm_stage,
            "num_models": self.num_models,
            "selections_done": self.selections_done,
            "loss_assigned": self.loss_assigned,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.assignment = np.asarray(state["assignment"], dtype=np.int64)
        pi = state["posteriors"]
        self.posteriors = None if pi is None else np.asarray(pi, dtype=np.float64)
        self.gmm_stage = state["gmm_stage"]
        self.num_models = int(state["num_models"])
        self.selections_done = int(state["selections_done"])
        self.loss_assigned = bool(state["loss_assigned"])

    def unaccounted_releases(self) -> list[str]:
        out = super().unaccounted_releases()
        if self.selection_epsilon is None:
            out.append(
                "loss_based_cluster_choice (each client's argmin_m of its train loss under "
                "the M cluster models, on raw training data, every round after E_c)"
            )
        return out


def round_of(tasks: Sequence[ClientTask]) -> int:
    """The round of a plan (-1 when empty)."""
    return tasks[0].round_idx if tasks else -1
