"""The PFLlib-style base of FedFDP's algorithms and baselines (shared/specs/fedfdp.md §8.3,
§11 A2), and their one local loop.

Every client half is `local_sgd`: non-private minibatch SGD, or (the ``dp_`` variants)
the DP-SGD loop the DP algorithms share (`raydpfl.algorithms.local_dp_sgd.dp_sgd_local_loop`:
Poisson sampling, per-sample clipping at C, Gaussian noise σC), one step per round in the
paper's DP setting. Algorithm-specific terms (proximal, control variate, dynamic
regulariser) are the loop's correction hook, applied after the privatised gradient; they
depend on the client's data only through its earlier DP releases, so they are
post-processing and each DP task costs exactly `PrivacyCost(σ, q, τ)`. Per-client state
(c_i, h_i) lives in the server half and travels in `ClientTask.payload`; workers are
stateless. Checkpoints save it, with the server's c or h, as the algorithm's tensor state
(`Algorithm.tensor_state`, `pack_server_and_clients`).

The baselines: `raydpfl.papers.fedfdp.fedprox`, `.scaffold`, `.feddyn`, `.qffl`; the
private loss upload FedFDP and DP q-FFL share: `raydpfl.papers.fedfdp.loss_upload`.
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
    trained_result,
    uniform_cohort,
)
from raydpfl.algorithms.local_dp_sgd import (
    DPSGD_METRICS_RELEASE,
    Correction,
    dp_sgd_local_loop,
    per_sample_losses,
)
from raydpfl.algorithms.tensor_state import pack_client_tensors, pack_tensors, unpack_tensor_state
from raydpfl.privacy.mechanisms.kernel import SubsampledGaussian, uses
from raydpfl.privacy.per_sample.dpsgd import WeightRule

LocalMode = Literal["epoch", "steps"]
Normalizer = Literal["expected", "fixed"]


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
        x, y = data.batch(torch.arange(start, min(n, start + chunk), device=data.device))
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
        return [
            self._train_task(c, round_idx, int(train_sizes[c]), payload=self._payload(c), **kw)
            for c in cohort
        ]

    def _payload(self, client: int) -> dict[str, torch.Tensor] | None:
        """Tensors client `client` gets with this round's task (SCAFFOLD's c − c_i,
        FedDyn's h_i); None: none."""
        return None

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
            out.append(DPSGD_METRICS_RELEASE)
        else:
            out.append("client_training_metrics (mean local training loss, in rounds.parquet)")
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rounds_done": self.rounds_done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rounds_done = int(state.get("rounds_done", 0))


def run_local_sgd(
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
    return trained_result(task, data, params, start, metrics)


def pack_server_and_clients(
    server_state: Params | None,
    client_states: Mapping[int, Params],
    server: str,
    clients: str,
) -> dict[str, torch.Tensor]:
    """The tensor state of a server-wide dict (None until the first round with results)
    and per-client dicts: `load_server_and_clients`' inverse."""
    packed = pack_tensors(server, server_state) if server_state is not None else {}
    return {**packed, **pack_client_tensors(clients, client_states)}


def load_server_and_clients(
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


class ServerAndClientState:
    """Tensor state of a server-wide dict and per-client dicts (SCAFFOLD's c and c_i,
    FedDyn's h and h_i), the attributes named by `state_fields` (server, clients)."""

    state_fields: tuple[str, str]

    def tensor_state(self) -> dict[str, torch.Tensor]:
        """The server dict under ``<server>/<name>`` and each client's under
        ``<clients>/<client>/<name>`` (both unset until the first round with results)."""
        server, clients = self.state_fields
        return pack_server_and_clients(
            getattr(self, server), getattr(self, clients), server, clients
        )

    def load_tensor_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restores the server dict and every client's (on the server's device, where
        they live)."""
        server, clients = self.state_fields
        restored, by_client = load_server_and_clients(tensors, server, clients)
        setattr(self, server, restored)
        setattr(self, clients, by_client)
