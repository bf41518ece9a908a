"""FedFDP's baselines (shared/specs/fedfdp.md §8.3, §11 A16), non-private and with DP-SGD.

- FedProx (Li et al., MLSys 2020): local gradient + μ(w − w_t) (proximal term).
- SCAFFOLD (Karimireddy et al., ICML 2020): local gradient + c − c_i; option-II control
  variates c_i⁺ = c_i − c + (w_t − y_i)/(Kη); server lr η_g.
- FedDyn (Acar et al., ICLR 2021): local gradient − h_i + α(w − w_t); h_i ← h_i − α(y_i − w_t);
  server h ← h − (α/N)Σ_{i∈S}(y_i − w_t), w ← mean y_i − h/α.
- q-FFL (Li et al., ICLR 2020), q-FedSGD/q-FedAvg server step with Lipschitz estimate
  L = 1/η: Δ_k = L(w_t − y_k), h_k = q F_k^{q−1}‖Δ_k‖² + L F_k^q,
  w ← w_t − Σ F_k^q Δ_k / Σ h_k (`qffl_step`).

Every client half is the one local loop `local_sgd`: non-private minibatch SGD, or (the
``dp_`` variants) the DP-SGD loop the DP algorithms share
(`raydpfl.algorithms.local_dp_sgd.dp_sgd_local_loop`: Poisson sampling, per-sample
clipping at C, Gaussian noise σC), one step per round in the paper's DP setting.
Algorithm-specific terms (proximal, control variate, dynamic regulariser) are the loop's
correction hook, applied after the privatised gradient; they depend on the client's data
only through its earlier DP releases, so they are post-processing and each DP task costs
exactly `PrivacyCost(σ, q, τ)`. Per-client state (c_i, h_i) lives in the server half and
travels in `ClientTask.payload`; workers are stateless. Checkpoints save it, with the
server's c or h, as the algorithm's tensor state (`Algorithm.tensor_state`).

DP q-FFL needs each client's loss F_k(w_t): it is released by a ``loss`` follow-up task
after aggregation (the loss of the new global model, clipped to [0, C_l], summed over an
independent Poisson(q_l) batch, noise σ_l·C_l: SGM(q_l, σ_l), charged as its own task),
exactly FedFDP's loss mechanism (`LossUpload`; the shared
`local_dp_sgd.noisy_loss_query`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
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
    parameter_delta,
    uniform_cohort,
)
from raydpfl.algorithms.local_dp_sgd import (
    Correction,
    dp_sgd_local_loop,
    noisy_loss_query,
    per_sample_losses,
)
from raydpfl.algorithms.server_optimizers import ServerOptimizerMixin
from raydpfl.algorithms.tensor_state import pack_client_tensors, pack_tensors, unpack_tensor_state
from raydpfl.papers.fedfdp.theory import next_loss_clip_bound
from raydpfl.privacy.dpsgd import WeightRule
from raydpfl.privacy.kernel import SubsampledGaussian, uses

LocalMode = Literal["epoch", "steps"]
Normalizer = Literal["expected", "fixed"]


# --------------------------------------------------------------------------------------- #
# Shared pieces
# --------------------------------------------------------------------------------------- #
def batch_loss_and_grad(
    model: torch.nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor
) -> tuple[float, Params]:
    """Mean cross-entropy of the batch and its gradient (non-private)."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    with torch.enable_grad():
        loss = F.cross_entropy(functional_call(model, leaves, (x,)), y)
        grads = torch.autograd.grad(loss, list(leaves.values()))
    return float(loss.detach()), dict(zip(leaves, grads, strict=True))


def mean_loss(
    model: torch.nn.Module, params: Params, data: ClientData, chunk: int = 2048
) -> float:
    """Mean cross-entropy over all of the client's training records."""
    n, total = data.num_examples, 0.0
    for start in range(0, n, chunk):
        x, y = data.batch(torch.arange(start, min(n, start + chunk), device=data.indices.device))
        total += float(per_sample_losses(model, params, x, y).double().sum())
    return total / max(n, 1)


def epoch_batch_size(num_examples: int, sampling_rate: float) -> int:
    """⌈q·|D_i|⌉ (at least 1): the batch of the non-private ``epoch`` mode (§11 A2)."""
    return max(1, math.ceil(sampling_rate * num_examples))


def local_sgd(
    ctx: ClientContext,
    params: Params,
    data: ClientData,
    task: ClientTask,
    *,
    private: bool,
    correction: Correction | None = None,
    loss_scale: Callable[[float], float] | None = None,
    weight_rule: WeightRule | None = None,
    normalizer: Normalizer = "expected",
    fixed_divisor: float = 64.0,
) -> tuple[Params, dict[str, float]]:
    """Runs the task's local steps from `params` (in place); returns (start params, metrics).

    Non-private: `task.local_steps` minibatch steps of size `task.batch_size`, walking a
    per-round permutation (``epoch`` mode sets local_steps·batch ≈ |D_i|). `loss_scale`
    maps the batch-mean loss to a factor on the gradient (FedFair's 1 + λΔ, Eq. 9).
    Private: the shared DP-SGD loop (`local_dp_sgd.dp_sgd_local_loop`): `task.local_steps`
    steps on Poisson(q) batches with `weight_rule` (default flat clipping at C), noise σC,
    divided by q·|D_i| (or a fixed divisor). Either way the correction term (a function of
    public or previously released values only, at the step's start point) is applied
    after the step: w ← w − η·g, then w ← w − η·correction.

    Metrics: ``first_batch_loss`` (non-private: the batch loss at the start model, which
    q-FFL uses as F_k(w_t)), ``train_loss`` (non-private mean batch loss),
    ``mean_batch_size`` and ``clipped_fraction`` (private), ``local_steps``.
    """
    metrics: dict[str, float] = {"local_steps": float(task.local_steps)}
    if private:  # the shared DP-SGD loop, with this algorithm's hooks
        start, dp_metrics = dp_sgd_local_loop(
            ctx,
            params,
            data,
            task,
            weight_rule=weight_rule,
            correction=correction,
            normalizer=normalizer,
            fixed_divisor=fixed_divisor,
        )
        metrics.update(dp_metrics)
        return start, metrics
    start = {n: p.detach().clone() for n, p in params.items()}
    payload = task.payload or {}
    n = data.num_examples
    losses: list[float] = []
    batch = min(task.batch_size or n, n)
    order = torch.randperm(n, generator=ctx.generator, device=ctx.generator.device)
    cursor = 0
    for _ in range(task.local_steps):
        # the correction at the step's starting point (it draws no randomness)
        extra = correction(params, start, payload) if correction is not None else None
        if cursor + batch > n:
            order = torch.randperm(n, generator=ctx.generator, device=ctx.generator.device)
            cursor = 0
        x, y = data.batch(order[cursor : cursor + batch])
        cursor += batch
        loss, grad = batch_loss_and_grad(ctx.model, params, x, y)
        losses.append(loss)
        if loss_scale is not None:
            factor = loss_scale(loss)
            grad = {k: g * factor for k, g in grad.items()}
        with torch.no_grad():
            for name, p in params.items():
                p.sub_(grad[name], alpha=task.lr)
        if extra is not None:  # w ← w − η·correction
            with torch.no_grad():
                for name, p in params.items():
                    p.sub_(extra[name], alpha=task.lr)
    if losses:
        metrics["train_loss"] = float(np.mean(losses))
        metrics["first_batch_loss"] = losses[0]
    return start, metrics


class LossUpload:
    """FedFDP's private loss upload (Eqs. 14–15, §5.3, §11 A6–A7), server-side state.

    Per client: the adaptive clip bound C_l^i (starts at `clip_init`, then
    max(floor, multiplier·F̃_i), post-processing). A ``loss`` task evaluates a model on an
    independent Poisson(q_l) batch, clips each loss to [0, C_l^i], sums, adds N(0, σ_l²C_l²)
    and divides by q_l·|D_i|: SGM(q_l, σ_l), declared as `cost`.
    """

    def __init__(
        self,
        *,
        noise_multiplier: float,
        sampling_rate: float,
        clip_init: float,
        clip_floor: float,
        clip_multiplier: float,
    ) -> None:
        self.noise_multiplier = noise_multiplier
        self.sampling_rate = sampling_rate
        self.clip_init = clip_init
        self.clip_floor = clip_floor
        self.clip_multiplier = clip_multiplier
        self.clip: dict[int, float] = {}

    def mechanism(self, client_id: int) -> SubsampledGaussian:
        """One release per client per round: SGM(q_l, σ_l) of losses clipped to the
        client's current C_l (charged `PrivacyCost(σ_l, q_l, 1)` whatever C_l is)."""
        return SubsampledGaussian(self.noise_multiplier, self.bound(client_id), self.sampling_rate)

    def bound(self, client_id: int) -> float:
        return self.clip.get(client_id, self.clip_init)

    def task(
        self, client_id: int, round_idx: int, payload: Mapping[str, torch.Tensor] | None
    ) -> ClientTask:
        """The follow-up task releasing client `client_id`'s loss of the payload model
        (``w.<name>`` tensors) or, without payload, of the broadcast model."""
        return ClientTask(
            client_id=client_id,
            round_idx=round_idx,
            local_steps=0,
            lr=0.0,
            mechanisms=(uses(self.mechanism(client_id), 1),),
            kind="loss",
            payload=payload,
        )

    def update(self, results: Sequence[ClientResult]) -> dict[int, float]:
        """Reads the released losses; moves each C_l^i; returns {client: F̃_i}."""
        out = {}
        for r in results:
            noisy = float(r.metrics["noisy_loss"])
            out[r.client_id] = noisy
            self.clip[r.client_id] = next_loss_clip_bound(
                noisy, floor=self.clip_floor, multiplier=self.clip_multiplier
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"clip": {str(k): v for k, v in self.clip.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.clip = {int(k): float(v) for k, v in state.get("clip", {}).items()}


def release_loss(
    ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
) -> ClientResult:
    """Client half of a ``loss`` task: the private mean loss (Alg. 2 L9–L11).

    The model is the payload's ``w.*`` tensors when present, else the broadcast params.
    The batch is a fresh Poisson(q_l) sample from the task's own RNG stream (independent
    of the gradient batch, so the two mechanisms compose additively, §6.4).
    ``raw_loss`` (the unclipped, noiseless batch mean) is a non-private diagnostic for the
    paper's Ψ variant; it is listed in the algorithm's unaccounted releases.
    """
    payload = task.payload or {}
    model_params = (
        {n: payload[f"w.{n}"] for n in params} if payload else {n: p for n, p in params.items()}
    )
    n = data.num_examples
    # the shared noisy loss query, in float64, through the task's declared mechanism
    noisy, losses = noisy_loss_query(ctx, model_params, data, task)
    raw = float(losses.mean()) if losses.numel() else float("nan")
    return ClientResult(
        client_id=task.client_id,
        update={},
        weight=float(n),
        num_examples=n,
        metrics={"noisy_loss": noisy, "raw_loss": raw, "loss_batch_size": float(losses.numel())},
    )


def weighted_variance(values: Sequence[float], weights: Sequence[float]) -> float:
    """Σ p_i (v_i − Σ p_j v_j)² with p ∝ weights (Ψ, Eq. 2), NaN entries dropped."""
    v, w = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
    keep = np.isfinite(v)
    if not keep.any() or w[keep].sum() <= 0:
        return float("nan")
    v, p = v[keep], w[keep] / w[keep].sum()
    return float(np.sum(p * (v - np.sum(p * v)) ** 2))


class PflBase(Algorithm):
    """Common server half: uniform cohort, local work planned per client.

    Non-private: ``epoch`` mode runs ⌈|D_i|/B_i⌉ steps with B_i = ⌈q|D_i|⌉ (one pass,
    §11 A2), ``steps`` mode `local_steps` steps of `batch_size`. Private: `local_steps`
    DP-SGD steps per round, each declared as PrivacyCost(σ, q, τ).
    """

    is_private = False

    def __init__(
        self,
        *,
        clients_per_round: int,
        lr: float,
        local_steps: int = 1,
        batch_size: int = 32,
        local_mode: LocalMode = "steps",
        sampling_rate: float = 0.05,
        clip_norm: float | None = None,
        noise_multiplier: float = 0.0,
        max_rounds: int | None = None,
        normalizer: Normalizer = "expected",
        fixed_divisor: float = 64.0,
    ) -> None:
        if self.is_private and clip_norm is None:
            raise ValueError(f"{self.name} needs a clip norm")
        self.clients_per_round = clients_per_round
        self.lr = lr
        self.local_steps = local_steps
        self.batch_size = batch_size
        self.local_mode = local_mode
        self.sampling_rate = sampling_rate
        self.clip_norm = clip_norm
        self.noise_multiplier = noise_multiplier
        self.max_rounds = max_rounds
        self.normalizer = normalizer
        self.fixed_divisor = fixed_divisor
        self.rounds_done = 0

    def select(self, round_idx: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        return uniform_cohort(num_clients, min(self.clients_per_round, num_clients), rng)

    def _train_task(self, client: int, round_idx: int, size: int, **kw: Any) -> ClientTask:
        if self.is_private:
            step = SubsampledGaussian(self.noise_multiplier, self.clip_norm, self.sampling_rate)
            return ClientTask(
                client_id=client,
                round_idx=round_idx,
                local_steps=self.local_steps,
                lr=self.lr,
                mechanisms=(uses(step, self.local_steps),),
                **kw,
            )
        if self.local_mode == "epoch":
            batch = epoch_batch_size(size, self.sampling_rate)
            steps = math.ceil(size / batch)
        else:
            batch, steps = self.batch_size, self.local_steps
        return ClientTask(
            client_id=client,
            round_idx=round_idx,
            local_steps=steps,
            lr=self.lr,
            batch_size=batch,
            **kw,
        )

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        kw = {"extras": self._round_extras()}
        return [self._train_task(c, round_idx, int(train_sizes[c]), **kw) for c in cohort]

    def _round_extras(self) -> dict[str, float]:
        """Scalars every client gets with this round's task (e.g. λ, the global loss)."""
        return {}

    def after_round(
        self,
        round_idx: int,
        metrics: Mapping[str, float],
        followups: Sequence[ClientResult] = (),
    ) -> dict[str, float]:
        self.rounds_done = round_idx + 1
        return {}

    def stop_reason(self) -> str | None:
        if self.max_rounds is not None and self.rounds_done >= self.max_rounds:
            return f"the privacy budget allows {self.max_rounds} rounds (all run)"
        return None

    def unaccounted_releases(self) -> list[str]:
        out = ["client_dataset_sizes (aggregation weights and DP-SGD denominators q*|D_i|)"]
        if self.is_private:
            out.append(
                "client_training_metrics (mean realised Poisson batch size and clipped "
                "fraction, averaged over the round's clients, in rounds.parquet)"
            )
        else:
            out.append("client_training_metrics (mean local training loss, in rounds.parquet)")
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rounds_done": self.rounds_done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rounds_done = int(state.get("rounds_done", 0))


def _run(
    algo: PflBase,
    ctx: ClientContext,
    params: Params,
    data: ClientData,
    task: ClientTask,
    correction: Correction | None = None,
) -> ClientResult:
    start, metrics = local_sgd(
        ctx,
        params,
        data,
        task,
        private=algo.is_private,
        correction=correction,
        normalizer=algo.normalizer,
        fixed_divisor=algo.fixed_divisor,
    )
    return ClientResult(
        client_id=task.client_id,
        update=parameter_delta(params, start),
        weight=float(data.num_examples),
        num_examples=data.num_examples,
        metrics=metrics,
    )


def _pack_server_and_clients(
    server_state: Params | None,
    client_states: Mapping[int, Params],
    server: str,
    clients: str,
) -> dict[str, torch.Tensor]:
    """The tensor state of a server-wide dict (None until the first round with results)
    and per-client dicts: `_load_server_and_clients`' inverse."""
    packed = pack_tensors(server, server_state) if server_state is not None else {}
    return {**packed, **pack_client_tensors(clients, client_states)}


def _load_server_and_clients(
    tensors: Mapping[str, torch.Tensor], server: str, clients: str
) -> tuple[Params | None, dict[int, Params]]:
    """(server-wide state or None, per-client states) from a tensor state holding the
    fields `server` and `clients` (SCAFFOLD's c and c_i, FedDyn's h and h_i).

    Copies, so restored state never aliases the loaded file's tensors. Per-client
    entries without the server-wide state, or with other parameter names than it,
    cannot come from this algorithm's `tensor_state`: ValueError naming the field."""
    shared, per_client = unpack_tensor_state(tensors, shared=(server,), per_client=(clients,))
    state = shared.get(server)
    by_client = {
        c: {n: t.clone() for n, t in p.items()}
        for c, p in sorted(per_client.get(clients, {}).items())
    }
    if by_client and state is None:
        raise ValueError(f"tensor state has {clients!r} entries but no {server!r}")
    for c, p in by_client.items():
        if state is not None and set(p) != set(state):
            raise ValueError(
                f"tensor state {clients}/{c} has parameters {sorted(p)}, "
                f"but {server!r} has {sorted(state)}"
            )
    restored = {n: t.clone() for n, t in state.items()} if state is not None else None
    return restored, by_client


# --------------------------------------------------------------------------------------- #
# FedProx
# --------------------------------------------------------------------------------------- #
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
    default ``sgd`` at 1.0 is plain w ← w + Δ̄.
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
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.mu = mu
        self._set_server_optimizer(
            server_optimizer, server_lr, server_momentum, server_beta2, server_adam_eps
        )

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        return _run(self, ctx, params, data, task, prox_correction(self.mu))


class DPFedProx(FedProx):
    """FedProx with DP-SGD local steps (Table 3's "FedProx")."""

    name = "dp_fedprox"
    is_private = True


# --------------------------------------------------------------------------------------- #
# SCAFFOLD
# --------------------------------------------------------------------------------------- #
def scaffold_correction(
    params: Params, start: Params, payload: Mapping[str, torch.Tensor]
) -> Params:
    """c − c_i, sent as ``corr.<name>`` (SCAFFOLD Alg. 1 line 10: y ← y − η(g + c − c_i))."""
    return {n: payload[f"corr.{n}"] for n in params}


def scaffold_control_update(
    c_i: Params, c: Params, delta: Params, steps: int, lr: float
) -> Params:
    """Option II: c_i⁺ = c_i − c + (w_t − y_i)/(Kη) = c_i − c − Δ_i/(Kη) (Alg. 1 line 12)."""
    return {n: c_i[n] - c[n] - delta[n] / (steps * lr) for n in c_i}


class Scaffold(PflBase):
    """SCAFFOLD with option-II control variates and global step η_g (server state)."""

    name = "scaffold"

    def __init__(self, *, global_lr: float = 1.0, num_clients: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.global_lr = global_lr
        self.num_clients = num_clients
        self.c: Params | None = None
        self.c_i: dict[int, Params] = {}

    def _ensure(self, like: Params) -> None:
        if self.c is None:
            self.c = {n: torch.zeros_like(t) for n, t in like.items()}

    def _ci(self, client: int) -> Params:
        assert self.c is not None
        return self.c_i.get(client) or {n: torch.zeros_like(t) for n, t in self.c.items()}

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        tasks = []
        for c in cohort:
            payload = None
            if self.c is not None:
                ci = self._ci(c)
                payload = {f"corr.{n}": self.c[n] - ci[n] for n in self.c}
            tasks.append(self._train_task(c, round_idx, int(train_sizes[c]), payload=payload))
        return tasks

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        if not results:
            return {n: t.clone() for n, t in global_params.items()}
        self._ensure(global_params)
        assert self.c is not None
        total_w = sum(r.weight for r in results)
        new = {n: t.clone() for n, t in global_params.items()}
        dc = {n: torch.zeros_like(t) for n, t in self.c.items()}
        by_id = {t.client_id: t for t in tasks}
        for r in results:
            for n in new:
                new[n].add_(r.update[n], alpha=self.global_lr * r.weight / total_w)
            ci = self._ci(r.client_id)
            task = by_id[r.client_id]
            ci_new = scaffold_control_update(ci, self.c, r.update, task.local_steps, task.lr)
            for n in dc:
                dc[n].add_(ci_new[n] - ci[n])
            self.c_i[r.client_id] = ci_new
        for n in self.c:  # c ← c + (1/N) Σ_{i∈S} Δc_i (Alg. 1 line 17)
            self.c[n].add_(dc[n], alpha=1.0 / self.num_clients)
        return new

    def tensor_state(self) -> dict[str, torch.Tensor]:
        """c under ``c/<name>`` and each c_i under ``c_i/<client>/<name>`` (both unset
        until the first round with results)."""
        return _pack_server_and_clients(self.c, self.c_i, "c", "c_i")

    def load_tensor_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restores c and every client's c_i (on the server's device, where they live)."""
        self.c, self.c_i = _load_server_and_clients(tensors, "c", "c_i")

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        corr = scaffold_correction if task.payload else None
        return _run(self, ctx, params, data, task, corr)


class DPScaffold(Scaffold):
    """SCAFFOLD with DP-SGD local steps; control variates are post-processing."""

    name = "dp_scaffold"
    is_private = True


# --------------------------------------------------------------------------------------- #
# FedDyn
# --------------------------------------------------------------------------------------- #
def feddyn_correction(alpha: float) -> Correction:
    """∇ of −⟨h_i, w⟩ + (α/2)‖w − w_t‖²: −h_i + α(w − w_t) (Acar et al. 2021, Alg. 1)."""

    def term(params: Params, start: Params, payload: Mapping[str, torch.Tensor]) -> Params:
        return {
            n: alpha * (params[n] - start[n]) - payload[f"h.{n}"]
            if f"h.{n}" in payload
            else alpha * (params[n] - start[n])
            for n in params
        }

    return term


class FedDyn(PflBase):
    """FedDyn: dynamic regularisation with per-client h_i and server state h."""

    name = "feddyn"

    def __init__(self, *, alpha: float = 0.01, num_clients: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.alpha = alpha
        self.num_clients = num_clients
        self.h: Params | None = None
        self.h_i: dict[int, Params] = {}

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        tasks = []
        for c in cohort:
            hi = self.h_i.get(c)
            payload = {f"h.{n}": t for n, t in hi.items()} if hi is not None else None
            tasks.append(self._train_task(c, round_idx, int(train_sizes[c]), payload=payload))
        return tasks

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        if not results:
            return {n: t.clone() for n, t in global_params.items()}
        if self.h is None:
            self.h = {n: torch.zeros_like(t) for n, t in global_params.items()}
        total_w = sum(r.weight for r in results)
        mean_delta = {n: torch.zeros_like(t) for n, t in global_params.items()}
        for r in results:
            hi = self.h_i.get(r.client_id) or {n: torch.zeros_like(t) for n, t in self.h.items()}
            # h_i ← h_i − α(y_i − w_t)
            self.h_i[r.client_id] = {n: hi[n] - self.alpha * r.update[n] for n in hi}
            for n in mean_delta:
                mean_delta[n].add_(r.update[n], alpha=r.weight / total_w)
            # h ← h − (α/N) Σ_{i∈S} (y_i − w_t)
            for n in self.h:
                self.h[n].sub_(r.update[n], alpha=self.alpha / self.num_clients)
        # w ← mean_i y_i − h/α
        return {
            n: global_params[n] + mean_delta[n] - self.h[n] / self.alpha for n in global_params
        }

    def tensor_state(self) -> dict[str, torch.Tensor]:
        """h under ``h/<name>`` and each h_i under ``h_i/<client>/<name>`` (both unset
        until the first round with results)."""
        return _pack_server_and_clients(self.h, self.h_i, "h", "h_i")

    def load_tensor_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restores h and every client's h_i (on the server's device, where they live)."""
        self.h, self.h_i = _load_server_and_clients(tensors, "h", "h_i")

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        return _run(self, ctx, params, data, task, feddyn_correction(self.alpha))


class DPFedDyn(FedDyn):
    """FedDyn with DP-SGD local steps; h_i, h are post-processing of DP updates."""

    name = "dp_feddyn"
    is_private = True


# --------------------------------------------------------------------------------------- #
# q-FFL
# --------------------------------------------------------------------------------------- #
def qffl_step(
    global_params: Params,
    deltas: Sequence[Params],
    losses: Sequence[float],
    *,
    q: float,
    lr: float,
    eps: float = 1e-10,
) -> Params:
    """q-FedAvg's server step (Li et al. 2020, Alg. 3) with L = 1/η.

    Δw_k = L(w_t − y_k) = −Δ_k/η;  h_k = q(F_k+eps)^{q−1}‖Δw_k‖² + L(F_k+eps)^q;
    w_{t+1} = w_t − Σ_k (F_k+eps)^q Δw_k / Σ_k h_k. q = 0 is FedAvg's uniform mean with
    step 1 (Σ Δ_k / K). Losses must be ≥ 0 (callers clip released losses at 0).
    """
    lip = 1.0 / lr
    num = {n: torch.zeros_like(t) for n, t in global_params.items()}
    denom = 0.0
    for delta, loss in zip(deltas, losses, strict=True):
        f = max(float(loss), 0.0) + eps
        dw = {n: -lip * d for n, d in delta.items()}
        sq = float(sum(t.double().pow(2).sum() for t in dw.values()))
        denom += q * f ** (q - 1.0) * sq + lip * f**q
        for n in num:
            num[n].add_(dw[n], alpha=f**q)
    if denom <= 0:
        return {n: t.clone() for n, t in global_params.items()}
    return {n: global_params[n] - num[n] / denom for n in global_params}


class QFFL(PflBase):
    """q-FFL (q-FedAvg) with exponent `qffl_q`; F_k(w_t) is the first local batch's loss."""

    name = "qffl"

    def __init__(self, *, qffl_q: float = 1.0, **kw: Any) -> None:
        super().__init__(**kw)
        self.qffl_q = qffl_q

    def _losses(self, results: Sequence[ClientResult]) -> list[float]:
        return [float(r.metrics.get("first_batch_loss", 0.0)) for r in results]

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        if not results:
            return {n: t.clone() for n, t in global_params.items()}
        return qffl_step(
            global_params,
            [r.update for r in results],
            self._losses(results),
            q=self.qffl_q,
            lr=self.lr,
        )

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        return _run(self, ctx, params, data, task)


class DPQFFL(QFFL):
    """q-FFL with DP-SGD local steps and F_k(w_t) from the private loss upload.

    After aggregation each client releases the loss of the new global model through
    `LossUpload` (a ``loss`` follow-up charged SGM(q_l, σ_l)); the server keeps it as
    F_k for the next round (post-processing). Before the first release F_k = `init_loss`
    (data-independent, ln(num_classes) by default).
    """

    name = "dp_qffl"
    is_private = True

    def __init__(self, *, loss_upload: LossUpload, init_loss: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.loss_upload = loss_upload
        self.init_loss = init_loss
        self.client_loss: dict[int, float] = {}

    def _losses(self, results: Sequence[ClientResult]) -> list[float]:
        return [max(self.client_loss.get(r.client_id, self.init_loss), 0.0) for r in results]

    def followup_tasks(
        self,
        round_idx: int,
        tasks: Sequence[ClientTask],
        results: Sequence[ClientResult],
        new_params: Params,
    ) -> list[ClientTask]:
        return [self.loss_upload.task(r.client_id, round_idx, None) for r in results]

    def after_round(
        self,
        round_idx: int,
        metrics: Mapping[str, float],
        followups: Sequence[ClientResult] = (),
    ) -> dict[str, float]:
        super().after_round(round_idx, metrics, followups)
        released = self.loss_upload.update([r for r in followups if "noisy_loss" in r.metrics])
        self.client_loss.update(released)
        if not released:
            return {}
        return {"qffl_loss_mean": float(np.mean(list(released.values())))}

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        if task.kind == "loss":
            return release_loss(ctx, params, data, task)
        return _run(self, ctx, params, data, task)

    def unaccounted_releases(self) -> list[str]:
        return [
            *super().unaccounted_releases(),
            "loss_task_diagnostics (raw noiseless mean loss and size of each loss batch, "
            "returned to the server half beside the private loss; not written to outputs)",
        ]

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "client_loss": {str(k): v for k, v in self.client_loss.items()},
            "loss_upload": self.loss_upload.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.client_loss = {int(k): float(v) for k, v in state.get("client_loss", {}).items()}
        self.loss_upload.load_state_dict(state.get("loss_upload", {}))
