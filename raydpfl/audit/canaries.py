"""Canaries and the audited algorithms: what the audit inserts into a real run.

Nothing here re-implements a mechanism. The audited algorithms are the real
`DPFedAvg` and `DPFedAvgClientLevel` (subclasses that keep their plan, their privacy
costs, their clipping and their noise), and at the record level any algorithm of the
shared DP-SGD loop (`audited_loop_algorithm`: a subclass of the run's own algorithm class,
made at run time, with the same state), with two additions: canaries enter through a
documented door, and the algorithm records what the threat model's adversary sees.

- **The probe** (`ProbedModel`): the experiment's model plus one tensor of m parameters
  (``audit_probe.weight``, shape (1, m)) that the output does not depend on (it enters
  as ``0 · Σ probe``). Real records' gradients on it are exactly 0 and the model's
  predictions are the model's own; the DP noise is added to it like to every parameter.
  Canary j's gradient (record level) or update (client level) is G·e_j on the probe, a
  "Dirac canary" on a coordinate that no real record touches, so the released probe
  coordinate j is canary j's contribution plus the mechanism's noise and nothing else.
- **Gradient canary records** (record level): rows of a client's training data labelled
  −1 − j. The real Poisson sampler draws them like any record; `GradientCanaryEngine`
  passes the batch's ordinary rows to the worker's real clipping engine and gives each
  sampled canary the per-sample gradient G·e_j, weighted by the same weight rule (the
  real clipping, min(1, C/‖g‖)), into the same noisy sum the real step draws.
- **Null-record gradient canaries** (record level, the algorithms that run the shared
  DP-SGD loop, `raydpfl.algorithms.local_dp_sgd.dp_sgd_local_loop`, other than
  dp_fedavg): every canary row is in its owner's training records whether it is in or
  out, as an ordinary record (a zero input with a valid label) that every loss query,
  batch count and |D_i| sees alike. `StepCanaryEngine`, around the worker's real
  clipping engine, gives a canary that is in the per-sample gradient G·e_j and one that
  is out the gradient 0 (norm 0: it adds nothing to any sum), both through the step's
  real weight rule (FedFDP's fair clipping included, with the row's real loss), into the
  noisy sum the real step drew. A record whose gradient is 0 changes no noisy sum, so in
  vs out is exactly add/remove for every DP-SGD release, while |D_i|, q, σ, the Poisson
  batch sizes and every non-probe coordinate are the same whichever canaries are in.
  The engine records each step's noisy sum on the owner's probe coordinates (the
  `LoopAudit` mixin keeps them, with the step's q, σ and C, and the privacy cost of
  every task whose steps it saw).
- **Canary clients** (client level): clients appended to the population whose raw update
  is G·e_j when included and 0 when not (under the fixed-denominator estimator a client
  whose update is 0 contributes exactly what a removed client contributes). The update
  goes through the real `clip_update`; the platform adds the real noise and the server
  half records the released step (`DPFedAvgClientLevel.aggregate_release`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np
import scipy.stats
import torch
from scipy.special import logsumexp
from torch import nn

from raydpfl.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
)
from raydpfl.algorithms.dp_fedavg import DPFedAvg
from raydpfl.algorithms.dp_fedavg_client import DPFedAvgClientLevel
from raydpfl.algorithms.local_dp_sgd import per_sample_losses
from raydpfl.data.federated import FederatedDataset
from raydpfl.privacy.mechanisms.client_level_mechanisms import ReleasedSum
from raydpfl.privacy.per_sample.dpsgd import ClippedSumEngine, StepStats, WeightRule, needs_losses
from raydpfl.simulation.worker import ModelSpec

#: The probe tensor's name in the audited model's parameters.
PROBE = "audit_probe.weight"

#: A canary's raw gradient (record level) or update (client level) is this many times the
#: clip bound: the adversary may make it as large as it likes, so the real clipping
#: always acts on it (and a clip that does not act shows at once).
CANARY_NORM_FACTOR = 100.0


# ---- the probe ----------------------------------------------------------------------------------
class ProbedModel(nn.Module):
    """`inner` plus an m-parameter probe its output does not depend on (module docstring)."""

    def __init__(self, inner: nn.Module, num_canaries: int) -> None:
        super().__init__()
        self.inner = inner
        self.audit_probe = nn.Linear(num_canaries, 1, bias=False)
        nn.init.zeros_(self.audit_probe.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # 0·Σ probe keeps the probe in the graph (its gradient is an exact 0, not None).
        return self.inner(x) + 0.0 * self.audit_probe.weight.sum()


def _build_probed(spec: ModelSpec, num_canaries: int) -> nn.Module:
    return ProbedModel(spec.build(), num_canaries)


def probed_spec(spec: ModelSpec, num_canaries: int) -> ModelSpec:
    """The experiment's model spec with the probe added (built in any process)."""
    return ModelSpec(
        f"{spec.name}+audit_probe",
        spec.input_shape,
        spec.num_classes,
        {},
        factory=functools.partial(_build_probed, spec, num_canaries),
    )


def probed_params(init_params: Mapping[str, torch.Tensor], num_canaries: int) -> Params:
    """The run's initial parameters under the probed model's names, probe at 0."""
    out = {f"inner.{n}": t.detach().clone() for n, t in init_params.items()}
    dtype = next(iter(init_params.values())).dtype
    out[PROBE] = torch.zeros(1, num_canaries, dtype=dtype)
    return out


# ---- record level: gradient canaries ------------------------------------------------------------
class GradientCanaryEngine:
    """A `ClippedSumEngine` around the worker's real one (module docstring).

    Rows labelled −1 − j are canary j: per-sample gradient G·e_j on the probe, weighted
    by `weight_rule` (the step's real rule) and added into the step's sum (the real
    noise, when the step passes `into`). Every other row goes to the real engine.
    """

    def __init__(self, inner: ClippedSumEngine, gradient_norm: float) -> None:
        self.inner = inner
        self.gradient_norm = float(gradient_norm)

    def clipped_sum(
        self,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        weight_rule: WeightRule,
        *,
        into: Params | None = None,
    ) -> tuple[Params, StepStats]:
        canary = y < 0
        if not bool(canary.any()):
            return self.inner.clipped_sum(params, x, y, weight_rule, into=into)
        if needs_losses(weight_rule):
            raise ValueError("gradient canaries support norm-only weight rules")
        real = ~canary
        total, stats = self.inner.clipped_sum(params, x[real], y[real], weight_rule, into=into)
        ids = -1 - y[canary]
        probe = total[PROBE]
        norms = torch.full(
            (int(ids.numel()),), self.gradient_norm, dtype=probe.dtype, device=probe.device
        )
        weights = weight_rule(norms)  # type: ignore[call-arg]
        probe[0].index_add_(0, ids, weights * self.gradient_norm)
        n_real, n_canary = stats.batch_size, int(ids.numel())
        clipped = round(stats.clipped_fraction * n_real) + int((weights < 1.0).sum())
        norm_sum = stats.mean_norm * n_real + self.gradient_norm * n_canary
        return total, StepStats.of(n_real + n_canary, clipped, norm_sum)


class AuditedDPFedAvg(DPFedAvg):
    """`DPFedAvg` with gradient canary records, recording each client's released update
    on the probe (the server's view: each participating client's DP-SGD output).

    Per-client results reach the server half (`linear_aggregation = False`; the server
    then sums them in plan order, the same weighted mean). Each client trains one at a
    time through `dp_sgd_local_update` (the real Poisson sampling, clipping engine and
    noise), with the worker's engine wrapped by `GradientCanaryEngine`.
    """

    linear_aggregation = False

    def __init__(self, base: DPFedAvg, owners: np.ndarray, gradient_norm: float) -> None:
        self.__dict__.update(base.__dict__)
        self.audit_gradient_norm = float(gradient_norm)
        self.audit_of_client = {int(c): np.flatnonzero(owners == c) for c in np.unique(owners)}
        #: (round, client, −Δ_client[probe_j] for each of the client's canaries j).
        self.audit_releases: list[tuple[int, int, np.ndarray]] = []

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        session = data._session
        inner = session._engine if session is not None else ctx.clipping
        wrapped = GradientCanaryEngine(inner, self.audit_gradient_norm)
        if session is not None:  # the platform's private step runs the audit's engine
            session._engine = wrapped
        return super().local_update(dataclasses.replace(ctx, clipping=wrapped), params, data, task)

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        for r in results:
            js = self.audit_of_client.get(r.client_id)
            if js is not None and len(js):
                seen = (-r.update[PROBE][0, torch.as_tensor(js)]).double().cpu().numpy()
                self.audit_releases.append((tasks[0].round_idx, r.client_id, seen))
        return super().aggregate(global_params, tasks, results)


def add_canary_records(
    dataset: FederatedDataset,
    x_rows: np.ndarray,
    y_rows: np.ndarray,
    owners: np.ndarray,
    included: np.ndarray,
) -> FederatedDataset:
    """`dataset` with canary j's row (x_rows[j], y_rows[j]) in client owners[j]'s training
    records when included[j]; excluded canaries are in no client's data."""
    base = len(dataset.x)
    x = np.concatenate([dataset.x, x_rows.astype(dataset.x.dtype)])
    y = np.concatenate([dataset.y, y_rows.astype(dataset.y.dtype)])
    train = []
    for k, idx in enumerate(dataset.client_train):
        mine = np.flatnonzero((owners == k) & included) + base
        train.append(np.concatenate([idx, mine]).astype(np.int64))
    return dataclasses.replace(dataset, x=x, y=y, client_train=tuple(train))


# ---- record level, the shared DP-SGD loop: null-record gradient canaries ------------------------
class NullCanaryData(ClientData):
    """A client's `ClientData` that remembers its last batch's pool rows, so that
    `StepCanaryEngine` can tell which rows of the batch it is handed are canaries (rows at
    or after `first_canary_row`). Every other reader sees ordinary records."""

    first_canary_row: int
    last_batch: tuple[torch.Tensor, torch.Tensor] | None

    @classmethod
    def of(cls, data: ClientData, first_canary_row: int) -> NullCanaryData:
        out = cls(data.client_id, data._x, data._y, data._indices)
        out.first_canary_row = int(first_canary_row)
        out.last_batch = None
        out._session = data._session
        return out

    def _gather(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self._indices[positions]
        x, y = self._x[rows], self._y[rows]
        self.last_batch = (x, rows)
        return x, y

    def canary_ids(self, x: torch.Tensor) -> torch.Tensor | None:
        """Canary index per row of `x` (−1 for a real record), if `x` is the last batch."""
        if self.last_batch is None or x is not self.last_batch[0]:
            return None
        rows = self.last_batch[1]
        return torch.where(rows >= self.first_canary_row, rows - self.first_canary_row, -1)


class StepCanaryEngine:
    """A `ClippedSumEngine` around the worker's real one for one task of a `LoopAudit`
    algorithm (module docstring, null-record gradient canaries).

    Real rows go to the real engine; canary rows get the per-sample gradient G·e_j (in)
    or 0 (out) through `weight_rule`, added into the step's noisy sum. Each call then
    records the noisy sum on the owner's canaries' probe coordinates, in units of C.
    """

    def __init__(
        self,
        inner: ClippedSumEngine,
        model: nn.Module,
        data: NullCanaryData,
        audit: LoopAudit,
        task: ClientTask,
    ) -> None:
        self.inner, self.model, self.data, self.audit, self.task = inner, model, data, audit, task
        self.calls = 0

    def clipped_sum(
        self,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        weight_rule: WeightRule,
        *,
        into: Params | None = None,
    ) -> tuple[Params, StepStats]:
        task, audit = self.task, self.audit
        if into is None and task.noise_multiplier * (task.clip_norm or 0.0) > 0:
            raise RuntimeError(
                "the white-box audit reads each DP-SGD step's noisy sum, which this "
                "algorithm's step does not hand to the clipping engine (a fused update)"
            )
        self.calls += 1
        ids = self.data.canary_ids(x)
        canary = ids >= 0 if ids is not None else None
        if canary is None or not bool(canary.any()):
            total, stats = self.inner.clipped_sum(params, x, y, weight_rule, into=into)
        else:
            real = ~canary
            total, stats = self.inner.clipped_sum(params, x[real], y[real], weight_rule, into=into)
            js = ids[canary]
            probe = total[PROBE]
            inside = torch.as_tensor(audit.audit_included, device=js.device)[js]
            assert task.clip_norm is not None
            norms = inside.to(probe.dtype) * (audit.audit_norm_factor * task.clip_norm)
            if needs_losses(weight_rule):
                # the rows' real losses at the step's parameters (the same in or out)
                losses = per_sample_losses(self.model, params, x[canary], y[canary])
                weights = weight_rule(norms, losses.to(probe.dtype))  # type: ignore[call-arg]
            else:
                weights = weight_rule(norms)  # type: ignore[call-arg]
            probe[0].index_add_(0, js.to(probe.device), weights * norms)
            n_real, n_canary = stats.batch_size, int(js.numel())
            clipped = round(stats.clipped_fraction * n_real) + int(
                ((weights < 1.0) & inside).sum()
            )
            norm_sum = stats.mean_norm * n_real + float(norms.sum())
            stats = StepStats.of(n_real + n_canary, clipped, norm_sum)
        audit.record_step(task, total[PROBE])
        return total, stats


class LoopAudit:
    """Mixin of `audited_loop_algorithm`: the client half trains through
    `StepCanaryEngine` and `NullCanaryData`, one client at a time; the steps' noisy sums
    on the probe and the costs of the tasks that ran them are kept here (the local
    backend runs the client half on this very object)."""

    #: A canary's raw gradient norm over the task's clip bound C (`CANARY_NORM_FACTOR`).
    audit_norm_factor: float
    audit_included: np.ndarray
    audit_of_client: dict[int, np.ndarray]
    audit_first_row: int
    #: Per client: the costs of the tasks whose DP-SGD steps the engine saw.
    audit_costs: dict[int, list]
    #: Per canary: Σ log-likelihood ratios, Σ z, and the steps of its owner.
    audit_llr: np.ndarray
    audit_sum: np.ndarray
    audit_steps: np.ndarray

    def supports_group(self, tasks: Sequence[ClientTask]) -> bool:
        return False  # one client at a time, through the wrapped engine

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        session = data._session
        wrapped = NullCanaryData.of(data, self.audit_first_row)
        inner = session._engine if session is not None else ctx.clipping
        engine = StepCanaryEngine(inner, ctx.model, wrapped, self, task)
        if session is not None:  # the platform's private step reads through the audit's view
            session._records, session._engine = wrapped, engine
        ctx = dataclasses.replace(ctx, clipping=engine)
        result = super().local_update(ctx, params, wrapped, task)  # type: ignore[misc]
        # Every training task's cost counts (one whose steps all skipped an empty batch
        # included); follow-ups that never reach the loop (loss uploads, cluster
        # choices, μ statistics) are other mechanisms, outside the view.
        if task.privacy_cost is not None and (engine.calls or task.kind == "train"):
            self.audit_costs.setdefault(task.client_id, []).append(task.privacy_cost)
        return result

    def record_step(self, task: ClientTask, probe: torch.Tensor) -> None:
        """One step's noisy sum on the probe: scores for the task client's canaries."""
        js = self.audit_of_client.get(task.client_id)
        if js is None or not len(js):
            return
        assert task.clip_norm is not None and task.sampling_rate is not None
        z = probe[0, torch.as_tensor(js, device=probe.device)].double().cpu().numpy()
        z = z / task.clip_norm
        self.audit_sum[js] += z
        self.audit_llr[js] += step_llr(z, task.sampling_rate, task.noise_multiplier)
        self.audit_steps[js] += 1


def step_llr(z: np.ndarray, rate: float, sigma: float) -> np.ndarray:
    """Log-likelihood ratio of "in" vs "out" for one step's release z = B + N(0, σ²) (units
    of C), B ~ Bernoulli(rate) if in, 0 if out."""
    shift = (np.asarray(z, dtype=np.float64) - 0.5) / sigma**2
    if rate >= 1.0:
        return shift
    return np.logaddexp(math.log1p(-rate), math.log(rate) + shift)


def audited_loop_algorithm(
    algo: Algorithm,
    owners: np.ndarray,
    included: np.ndarray,
    first_row: int,
    norm_factor: float = CANARY_NORM_FACTOR,
) -> Algorithm:
    """`algo` as an instance of a subclass of its own class with `LoopAudit` mixed in
    (the same state: its plan, costs, hooks and noise are its own)."""
    cls = type(algo)
    audited = type(f"Audited{cls.__name__}", (LoopAudit, cls), {"__module__": __name__})
    out = audited.__new__(audited)
    out.__dict__.update(algo.__dict__)
    m = len(owners)
    out.audit_norm_factor = float(norm_factor)
    out.audit_included = np.asarray(included, dtype=bool)
    out.audit_of_client = {int(c): np.flatnonzero(owners == c) for c in np.unique(owners)}
    out.audit_first_row = int(first_row)
    out.audit_costs = {}
    out.audit_llr = np.zeros(m)
    out.audit_sum = np.zeros(m)
    out.audit_steps = np.zeros(m, dtype=np.int64)
    return out


# ---- client level: canary clients ---------------------------------------------------------------
class AuditedDPFedAvgClient(DPFedAvgClientLevel):
    """`DPFedAvgClientLevel` whose last m clients are canary clients (module docstring),
    recording each round's noisy sum on the probe (Σ clip(Δ_k) + z, what the released
    model change times the public denominator E reveals)."""

    def __init__(
        self,
        base: DPFedAvgClientLevel,
        first_canary: int,
        included: np.ndarray,
        update_norm: float,
        tensor_count: int,
    ) -> None:
        self.__dict__.update(base.__dict__)
        self.audit_tensor_count = int(tensor_count)
        self.audit_first = int(first_canary)
        self.audit_included = np.asarray(included, dtype=bool)
        self.audit_update_norm = float(update_norm)
        #: One entry per round: the noisy sum's probe coordinates (length m).
        self.audit_rounds: list[np.ndarray] = []

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        j = task.client_id - self.audit_first
        if j < 0:
            return super().local_update(ctx, params, data, task)
        raw = {n: torch.zeros_like(p) for n, p in params.items()}
        if self.audit_included[j]:
            raw[PROBE][0, j] = self.audit_update_norm
        # The real client half after training: clip to the round's S, and (distributed)
        # this client's declared noise share from its own stream.
        update, norm, clip = self.upload(ctx, task, raw)
        return ClientResult(
            client_id=task.client_id,
            update=update,
            weight=1.0,
            num_examples=data.num_examples,
            metrics={"update_norm": norm, "update_clipped": float(norm > clip)},
        )

    def aggregate_release(
        self, global_params: Params, tasks: Sequence[ClientTask], released: ReleasedSum
    ) -> Params:
        new = super().aggregate_release(global_params, tasks, released)
        step = (new[PROBE] - global_params[PROBE])[0].double().cpu().numpy()
        self.audit_rounds.append(step * self.expected_cohort)
        return new


def add_canary_clients(dataset: FederatedDataset, count: int) -> FederatedDataset:
    """`dataset` with `count` clients appended, each holding one (never trained on) record
    index and no test records; their updates come from `AuditedDPFedAvgClient`."""
    one = dataset.client_train[0][:1].astype(np.int64)
    none = np.zeros(0, dtype=np.int64)
    return dataclasses.replace(
        dataset,
        client_train=tuple(dataset.client_train) + tuple(one.copy() for _ in range(count)),
        client_test=tuple(dataset.client_test) + tuple(none.copy() for _ in range(count)),
    )


# ---- scores -------------------------------------------------------------------------------------
def subsampled_sum_llr(z: np.ndarray, steps: int, rate: float, sigma: float) -> np.ndarray:
    """Log-likelihood ratio of "in" vs "out" for z = B + N(0, steps·σ²), B ~ Bin(steps, rate)
    if in, B = 0 if out (z in units of the clipped contribution): the most powerful test
    of one canary from one round's sum of `steps` subsampled Gaussian steps."""
    b = np.arange(steps + 1, dtype=np.float64)
    log_pmf = scipy.stats.binom.logpmf(b, steps, rate)
    z = np.asarray(z, dtype=np.float64)[:, None]
    return logsumexp(log_pmf[None, :] + (z * b - b * b / 2.0) / (steps * sigma**2), axis=1)


def record_white_box_scores(
    algo: AuditedDPFedAvg, owners: np.ndarray, normalisers: np.ndarray, score: str
) -> np.ndarray:
    """Per canary, over the rounds its client took part in: the release on its probe
    coordinate in units of C (z = −Δ_j · q·n̄_k / (η·C), n̄_k the client's size with half
    its canaries: fixed, so it says nothing about which canaries are in), scored by the
    likelihood ratio (``lr``) or summed (``sum``)."""
    m = len(owners)
    out = np.zeros(m)
    q, c, sigma, tau = algo.sampling_rate, algo.clip_norm, algo.noise_multiplier, algo.local_steps
    for _, client, seen in algo.audit_releases:
        js = algo.audit_of_client[client]
        z = seen * q * normalisers[client] / (algo.lr * c)
        out[js] += z if score == "sum" else subsampled_sum_llr(z, tau, q, sigma)
    return out


def client_white_box_scores(algo: AuditedDPFedAvgClient, score: str) -> np.ndarray:
    """Per canary client, over every round's noisy sum on its probe coordinate (its
    participation is secret under Poisson sampling): z in units of its clipped update,
    scored by the likelihood ratio of Bernoulli(p)·1 + N(0, σ²) vs N(0, σ²) (``lr``,
    p = q, or K/N for fixed cohorts) or summed (``sum``)."""
    contribution = _clipped_canary_size(algo)
    sigma = algo.noise_multiplier
    p = algo.expected_cohort / algo.num_clients
    total = np.zeros(len(algo.audit_included))
    for step in algo.audit_rounds:
        z = step / contribution
        if score == "sum":
            total += z
        elif p >= 1.0:
            total += (z - 0.5) / sigma**2
        else:
            total += np.logaddexp(math.log1p(-p), math.log(p) + (z - 0.5) / sigma**2)
    return total


def _clipped_canary_size(algo: AuditedDPFedAvgClient) -> float:
    """How large a clipped canary update is, as documented (not as implemented): S for
    flat clipping, S/√L per tensor for per-layer clipping (L tensors, probe included)."""
    if algo.clipping == "per_layer":
        return algo.clip_norm / math.sqrt(algo.audit_tensor_count)
    return algo.clip_norm
