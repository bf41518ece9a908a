"""The algorithm interface: a server half and a client half, no Ray, no config.

An algorithm is one plain object. Its *server half* runs inside `Server` (in-process
or in the server actor): it selects a cohort, plans each client's task, aggregates
results and updates its own server state. Its *client half* (`local_update`) runs
inside a `ClientWorker`, which may be another process: it sees only the task, the
broadcast parameters and the client's data, never the server state. Backends decide
where clients run, never what they compute.

Every privacy-relevant release is declared in the task as mechanism uses
(`ClientTask.mechanisms`, `raydpfl.privacy.mechanisms.kernel`), so the server charges the client's
ledger before dispatch with exactly those mechanisms' events. The client half draws every
noisy release through the worker's `PrivacySession` for the task (`ClientContext.privacy`),
which hands out only the declared mechanisms and counts their invocations; the receipt
goes back with the result and the server refuses one that differs from the charge.
"""

from __future__ import annotations

import abc
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from raydpfl.privacy.accounting.ledger import PrivacyCost
from raydpfl.privacy.mechanisms.kernel import (
    RAW_RECORDS_NOTE,
    ClientRecords,
    MechanismUse,
    PrivacyContractError,
    PrivacySession,
    Receipt,
    SubsampledGaussian,
    costs_of,
)
from raydpfl.privacy.per_sample.dpsgd import ClippedSumEngine

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ClientTask:
    """What one client must do this round. Built by the server half, run by a worker.

    Attributes:
        client_id: The client.
        round_idx: 0-based round.
        local_steps: τ, the number of local optimisation steps.
        lr: Local learning rate η.
        mechanisms: The randomised releases the task makes about the client's records,
            each a mechanism (`raydpfl.privacy.mechanisms.kernel`: σ, bound, sampling rate) and how
            many times it is invoked. The server charges exactly these before dispatch;
            the worker hands the client half only these (`ClientContext.privacy`) and
            the result's receipt must match them. Empty: the task releases nothing that
            needs accounting.
        batch_size: Minibatch size for non-private training.
        model_key: Which broadcast model the client starts from.
        extras: Algorithm-specific scalars (λ, a global loss, a cluster id...). Never a
            noise parameter: noise comes from `mechanisms` only.
        kind: What the client half does: ``train`` (the round's local update) or an
            algorithm-defined follow-up (e.g. ALI-DPFL's ``mu_stats``). It also names
            the client's RNG stream, so a follow-up never replays the training draws.
        payload: Per-client tensors sent with the task (e.g. the client's own last local
            model, which a stateless worker no longer holds).
        client_update_bound: Set by the server in a client-level round: the round's S. The
            worker refuses an upload whose norm exceeds it (or, with distributed noise, one
            that is not exactly what the client's `GaussianShare` released). What the
            server half puts here is overwritten.

    The DP-SGD view (`sampling_rate`, `clip_norm`, `noise_multiplier`) and the charge
    (`privacy_costs`) are read-only, derived from `mechanisms`.
    """

    client_id: int
    round_idx: int
    local_steps: int
    lr: float
    mechanisms: tuple[MechanismUse, ...] = ()
    batch_size: int | None = None
    model_key: str = "global"
    extras: Mapping[str, float] = field(default_factory=dict)
    kind: str = "train"
    payload: Mapping[str, torch.Tensor] | None = None
    client_update_bound: float | None = None

    def __post_init__(self) -> None:
        mechanisms = tuple(self.mechanisms)
        for use in mechanisms:
            if not isinstance(use, MechanismUse):
                raise TypeError(
                    "ClientTask.mechanisms holds MechanismUse values "
                    "(raydpfl.privacy.mechanisms.kernel.uses(mechanism, count)), got "
                    f"{type(use).__name__}"
                )
            if use.count < 1:
                raise PrivacyContractError(
                    f"client {self.client_id}, round {self.round_idx + 1} ({self.kind} task): "
                    f"declares {use.describe()}; a declared mechanism is invoked at least "
                    "once (leave out a mechanism the task does not use)"
                )
        object.__setattr__(self, "mechanisms", mechanisms)

    @classmethod
    def dp_sgd(
        cls,
        client_id: int,
        round_idx: int,
        local_steps: int,
        lr: float,
        *,
        noise_multiplier: float,
        clip_norm: float,
        sampling_rate: float,
        invocations: int | None = None,
        **fields: Any,
    ) -> ClientTask:
        """A task of `local_steps` DP-SGD steps: it declares `invocations` (default τ)
        uses of `SubsampledGaussian(noise_multiplier, clip_norm, sampling_rate)`."""
        mechanism = SubsampledGaussian(noise_multiplier, clip_norm, sampling_rate)
        count = local_steps if invocations is None else invocations
        return cls(
            client_id=client_id,
            round_idx=round_idx,
            local_steps=local_steps,
            lr=lr,
            mechanisms=(MechanismUse(mechanism, count),),
            **fields,
        )

    @property
    def privacy_costs(self) -> tuple[PrivacyCost, ...]:
        """The ledger events the task is charged, one per declared mechanism, in order."""
        return costs_of(self.mechanisms)

    @property
    def privacy_cost(self) -> PrivacyCost | None:
        """The one event of a task that declares one mechanism (None if it declares none).

        Raises:
            ValueError: If the task declares several (read `privacy_costs`).
        """
        costs = self.privacy_costs
        if len(costs) > 1:
            raise ValueError(
                f"task of client {self.client_id} declares {len(costs)} mechanisms; "
                "read privacy_costs"
            )
        return costs[0] if costs else None

    def _dp_sgd(self) -> SubsampledGaussian | None:
        found = [
            u.mechanism for u in self.mechanisms if isinstance(u.mechanism, SubsampledGaussian)
        ]
        return found[0] if len(found) == 1 else None

    @property
    def sampling_rate(self) -> float | None:
        """q of the task's one `SubsampledGaussian` (None without exactly one)."""
        m = self._dp_sgd()
        return None if m is None else m.sampling_rate

    @property
    def clip_norm(self) -> float | None:
        """C of the task's one `SubsampledGaussian` (None without exactly one)."""
        m = self._dp_sgd()
        return None if m is None else m.clip_norm

    @property
    def noise_multiplier(self) -> float:
        """σ of the task's one `SubsampledGaussian` (0.0 without exactly one)."""
        m = self._dp_sgd()
        return 0.0 if m is None else m.noise_multiplier


@dataclass
class ClientResult:
    """What a client sends back: its model update and aggregation weight."""

    client_id: int
    update: Params
    weight: float
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    #: What the task's mechanisms were invoked (set by the worker from its session;
    #: checked by the server against the charge).
    receipt: Receipt | None = None


class ClientData(ClientRecords):
    """A client's training records, held by the platform.

    The records are the worker's resident pool and this client's rows in it; the client
    half of a private algorithm reaches them through the platform's primitives: the private
    step and the noisy loss query of its task's `PrivacySession` (`ClientContext.privacy`),
    and evaluation. `batch` and `records` hand out raw records: for a private algorithm the
    platform then lists ``raw_record_access`` in the run's ``unaccounted_releases``
    (non-private algorithms read them freely).
    """

    def __init__(
        self, client_id: int, x: torch.Tensor, y: torch.Tensor, indices: torch.Tensor
    ) -> None:
        super().__init__(x, y, indices)
        self.client_id = int(client_id)
        self._session: PrivacySession | None = None  # the worker's session for this task

    def batch(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The raw records at `positions` (0-based within the client's data); listed as
        ``raw_record_access`` in a private run."""
        if self._session is not None:
            self._session._note(RAW_RECORDS_NOTE)
        return self._gather(positions)

    def records(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All of the client's raw records (listed like `batch`)."""
        return self.batch(torch.arange(self.num_examples, device=self.device))

    def __repr__(self) -> str:
        return f"ClientData(client_id={self.client_id}, num_examples={self.num_examples})"


@dataclass
class ClientContext:
    """The resident machinery a worker lends to `local_update`.

    Attributes:
        model: The worker's one resident model (used functionally; never trained in place).
        clipping: Per-sample clipping engine built once for that model (book-keeping
            or torch.func; see `raydpfl.privacy.per_sample.engines.make_engine`). The private step
            always uses the worker's own engine, whatever is passed around.
        generator: A stream for the client half's own randomness (shuffling, probes): for
            a private algorithm it is *not* the stream the mechanisms draw their samples
            and noise from, which only the platform holds.
        device: Where tensors live.
        privacy: The task's declared mechanisms, live and bound to the client's records
            (`raydpfl.privacy.mechanisms.kernel`): the only way a client half makes a charged
            release. Set by the worker (`direct_context` for tests and notebooks).
    """

    model: nn.Module
    clipping: ClippedSumEngine
    generator: torch.Generator
    device: torch.device
    privacy: PrivacySession | None = None


def privacy_session(
    ctx: ClientContext, task: ClientTask, data: ClientData | None = None
) -> PrivacySession:
    """The task's privacy session: the one the platform bound to the client's records.

    On a worker that is `data`'s (or `ctx.privacy`), whatever context or task object the
    client half passes around. Called directly (tests, notebooks: `data` built by hand,
    so no worker session exists), one is built from `task.mechanisms` on the context's
    stream, bound to `data`, and kept on `data` for that declaration, so every release of
    the call is counted once; a `ClientData` made from records read through `batch` is
    such a hand-built one, and that read is what the run lists.

    Raises:
        PrivacyContractError: Neither a session nor records to bind one to.
    """
    if data is not None and data._session is not None:
        session = data._session
        if getattr(session, "_direct", None) is None:
            return session  # the worker's
        if session._direct is ctx.generator and session.declared == task.mechanisms:  # type: ignore[attr-defined]
            return session
    elif ctx.privacy is not None:
        return ctx.privacy
    if data is None:
        raise PrivacyContractError(
            f"client {task.client_id}, round {task.round_idx + 1}: no privacy session; a "
            "client half runs on a ClientWorker, or is called through "
            "raydpfl.algorithms.base.direct_context (tests, notebooks)"
        )
    session = _direct_session(ctx.model, data, task, ctx.generator, ctx.clipping, ctx.device)
    return session


def _direct_session(
    model: nn.Module,
    data: ClientData,
    task: ClientTask,
    generator: torch.Generator,
    engine: ClippedSumEngine | None,
    device: torch.device | str,
) -> PrivacySession:
    held = data._session
    if held is not None and getattr(held, "_direct", None) is None:
        # The records are a worker's: their session is the one it charged and checks. A
        # session of the caller's, on a stream the caller knows, may not be bound to them.
        raise PrivacyContractError(
            f"client {task.client_id}, round {task.round_idx + 1}: these records are bound "
            "to the worker's privacy session; a direct context is for records built outside "
            "a worker (tests, notebooks)"
        )
    if engine is None:
        from raydpfl.privacy.per_sample.engines import make_engine

        engine = make_engine(model, "auto")
    session = PrivacySession(task.mechanisms, generator, device)._bind(data, model, engine)
    session._direct = generator  # type: ignore[attr-defined]  # a direct call's, on this stream
    data._session = session
    return session


def direct_context(
    model: nn.Module,
    data: ClientData,
    task: ClientTask,
    generator: torch.Generator,
    *,
    engine: ClippedSumEngine | None = None,
    device: torch.device | str = "cpu",
    unbounded_weight_rules: bool = False,
) -> ClientContext:
    """A context for calling a client half directly (tests, notebooks) the way a worker
    does: a `PrivacySession` of `task`'s declaration on `generator`, bound to `data`,
    `model` and `engine` (default: the worker's choice for the model). The mechanisms draw
    from `generator`; the context's own `generator` is the same stream, as a direct call
    has no other. `unbounded_weight_rules` stands for the run-level opt-out of the
    per-sample bound check (FedFDP's ``clip_mode: paper``), which a worker reads from the
    experiment."""
    session = _direct_session(model, data, task, generator, engine, device)
    session._unbounded_ok = bool(unbounded_weight_rules)
    return ClientContext(
        model=model,
        clipping=session._engine,
        generator=generator,
        device=torch.device(device),
        privacy=session,
    )


class WeightedUpdateSum:
    """Running Σ w_k Δ_k, Σ w_k and per-metric sums: the state of a weighted-mean round.

    Linear aggregations are accumulated where results are produced (inside a worker)
    and merged on the server, so one partial sum per task group travels instead of one
    update per client. Additions happen in the order they are made; callers fix that
    order (plan order inside a group, group order across groups) so the bits of the
    result do not depend on how many workers ran.
    """

    def __init__(self) -> None:
        self.total: Params | None = None
        self.weight = 0.0
        self.count = 0
        self.metric_sums: dict[str, float] = {}
        self.metric_counts: dict[str, int] = {}
        #: (client_id, receipt) of every added client, in the order added.
        self.receipts: list[tuple[int, Receipt | None]] = []

    def add_result(self, result: ClientResult) -> None:
        """Adds one client's result: its update, weight and metrics, and its receipt."""
        self.add(result.update, result.weight, result.metrics)
        self.receipts.append((result.client_id, result.receipt))

    def add(self, update: Params, weight: float, metrics: Mapping[str, float] = {}) -> None:
        """Adds one client's update with its weight (and its metrics, for means)."""
        if self.total is None:
            self.total = {n: t.detach().clone().mul_(weight) for n, t in update.items()}
        else:
            for n, t in update.items():
                self.total[n].add_(t, alpha=weight)
        self.weight += weight
        self.count += 1
        self._add_metrics(metrics)

    @classmethod
    def of_stacked(
        cls,
        updates: Params,
        weights: Sequence[float],
        metrics: Sequence[Mapping[str, float]] = (),
    ) -> WeightedUpdateSum:
        """Σ_k w_k Δ_k of updates stacked on a leading client axis ({name: (K, *shape)}),
        as one contraction over the clients per tensor instead of K additions (on a GPU,
        a vectorised group of small clients would otherwise launch K kernels per tensor).
        Equal to `add`-ing the clients one by one up to float rounding; the weight, count
        and metric sums are accumulated in client order, exactly as `add` does."""
        out = cls()
        if len(weights) == 0:
            return out
        for name, t in updates.items():
            if t.shape[0] != len(weights):
                raise ValueError(
                    f"{name}: {t.shape[0]} stacked updates for {len(weights)} weights"
                )
        out.total = {
            n: torch.tensordot(torch.tensor(weights, dtype=t.dtype, device=t.device), t, dims=1)
            for n, t in updates.items()
        }
        for k, weight in enumerate(weights):
            out.weight += weight
            out.count += 1
            out._add_metrics(metrics[k] if k < len(metrics) else {})
        return out

    def _add_metrics(self, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            self.metric_sums[k] = self.metric_sums.get(k, 0.0) + float(v)
            self.metric_counts[k] = self.metric_counts.get(k, 0) + 1

    def merge(self, other: WeightedUpdateSum) -> None:
        """Adds another partial sum into this one."""
        if other.total is not None:
            if self.total is None:
                self.total = {n: t.clone() for n, t in other.total.items()}
            else:
                for n, t in other.total.items():
                    self.total[n].add_(t)
        self.weight += other.weight
        self.count += other.count
        self.receipts.extend(other.receipts)
        for k, v in other.metric_sums.items():
            self.metric_sums[k] = self.metric_sums.get(k, 0.0) + v
            self.metric_counts[k] = self.metric_counts.get(k, 0) + other.metric_counts[k]

    @classmethod
    def merged(cls, parts: Sequence[WeightedUpdateSum]) -> WeightedUpdateSum:
        """The sum of `parts`, added in the given order."""
        out = cls()
        for part in parts:
            out.merge(part)
        return out

    def mean(self) -> Params | None:
        """Σ w_k Δ_k / Σ w_k, or None if nothing was added."""
        if self.total is None or self.weight <= 0:
            return None
        return {n: t / self.weight for n, t in self.total.items()}

    def metric_means(self) -> dict[str, float]:
        """Mean of each client metric over the clients that reported it."""
        return {k: self.metric_sums[k] / self.metric_counts[k] for k in sorted(self.metric_sums)}


class Algorithm(abc.ABC):
    """Server half + client half of a federated algorithm.

    Subclasses set `name`, `is_private`, and implement the abstract methods. The
    object is pickled to workers, so the client half must rely only on its arguments
    and on hyperparameters fixed at construction.
    """

    name: ClassVar[str]
    is_private: ClassVar[bool]
    #: True when the round's results only feed a weighted mean of updates: workers may
    #: then sum them where they are produced, and the server calls `aggregate_sum`.
    linear_aggregation: ClassVar[bool] = False
    #: Whether a checkpointed run of this algorithm can be resumed (see `state_dict` and
    #: `tensor_state`). False makes the server skip checkpoints and refuse ``--resume``.
    resumable: ClassVar[bool] = True
    #: What a reported ε is about: ``record`` (each task declares its DP-SGD cost, charged
    #: to its client's ledger) or ``client`` (one population-level charge per round,
    #: `round_privacy_cost`, to a `raydpfl.privacy.accounting.client_level.ClientLevelLedger`).
    privacy_unit: ClassVar[str] = "record"

    # ---- server half -------------------------------------------------------------
    @abc.abstractmethod
    def select(self, round_idx: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        """The cohort of this round, in ascending client-id order."""

    @abc.abstractmethod
    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        """One task per cohort member; `train_sizes[i]` = |D_i|."""

    def aggregate(
        self,
        global_params: Params,
        tasks: Sequence[ClientTask],
        results: Sequence[ClientResult],
        server_round: ServerRound | None = None,
    ) -> Params:
        """The new global parameters from the results that arrived (non-linear algorithms).

        `tasks` are the round's tasks whose results were due (charged and not dropped);
        `results` the ones that arrived, in plan order. The server passes `server_round`
        (round index, seeded streams, `ServerRound.emit` for the round's row) to an
        override that takes that keyword; older overrides without it still work. The
        default sums the results in plan order and calls `aggregate_sum`.
        """
        acc = WeightedUpdateSum()
        for r in results:
            acc.add(r.update, r.weight, r.metrics)
        return with_round(self.aggregate_sum, server_round)(global_params, tasks, acc)

    def aggregate_sum(
        self,
        global_params: Params,
        tasks: Sequence[ClientTask],
        total: WeightedUpdateSum,
        server_round: ServerRound | None = None,
    ) -> Params:
        """The new global parameters from the round's weighted sum (linear algorithms).

        `server_round` as in `aggregate`. The default is FedAvg's step:
        w + Σ w_k Δ_k / Σ w_k; no result leaves w unchanged.
        """
        mean = total.mean()
        if mean is None:
            return {n: t.clone() for n, t in global_params.items()}
        return {n: global_params[n] + mean[n] for n in global_params}

    def followup_tasks(
        self,
        round_idx: int,
        tasks: Sequence[ClientTask],
        results: Sequence[ClientResult],
        new_params: Params,
    ) -> list[ClientTask]:
        """Tasks to run after aggregation, from the new global parameters (non-linear
        algorithms only): statistics a per-round optimiser needs from the clients.

        Each task declares its privacy cost like a training task and is charged before
        dispatch; a follow-up without a cost must be named in `unaccounted_releases`.

        The default: when `followups_due` says the round has follow-ups, one task for the
        client of each result, in the results' order (`followup_task`); none otherwise.
        """
        if not self.followups_due(round_idx, results, new_params):
            return []
        return [self.followup_task(round_idx, r) for r in results]

    def followups_due(
        self, round_idx: int, results: Sequence[ClientResult], new_params: Params
    ) -> bool:
        """Whether this round sends every reporting client a follow-up (`followup_task`);
        an override may record here what the tasks need (the new parameters, their
        charge in a schedule). The default: no follow-ups."""
        return False

    def followup_task(self, round_idx: int, result: ClientResult) -> ClientTask:
        """The follow-up task of the client that reported `result`, in a round that
        `followups_due` gave follow-ups."""
        raise NotImplementedError(f"{type(self).__name__} plans no follow-up tasks")

    def after_round(
        self,
        round_idx: int,
        metrics: Mapping[str, float],
        followups: Sequence[ClientResult] = (),
    ) -> dict[str, float]:
        """Hook for per-round optimisers (τ*, λ*, selection...); returns extra metrics.

        `followups` are the results of `followup_tasks`, in plan order.
        """
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The server half's mutable state, JSON-serialisable (checkpoints).

        Algorithms whose server half keeps state across rounds override this and
        `load_state_dict`; tensors go to `tensor_state` instead. One that cannot be
        restored sets `resumable = False`.
        """
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores what `state_dict` returned (nothing, for a stateless server half)."""
        return None

    def tensor_state(self) -> dict[str, torch.Tensor]:
        """The server half's mutable tensor state (checkpoints), beside `state_dict`.

        Tensors (control variates, server momentum, per-client state parked on the
        server because workers are stateless) would be lossy or huge as JSON, so the
        checkpoint saves them in a tensors-only torch file instead. Keys are flat and
        deterministic: ``"{field}/{name}"`` for one server-wide parameter dict and
        ``"{field}/{client_id}/{name}"`` for per-client ones (written and read by
        `raydpfl.algorithms.tensor_state`). The default, for algorithms without tensor
        state, is {}.
        """
        return {}

    def load_tensor_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restores what `tensor_state` returned, after `load_state_dict`.

        The tensors come on the server's device; an algorithm that keeps some of them
        elsewhere (e.g. on the CPU) moves them itself. An empty mapping means "no tensor
        state yet" (also what a checkpoint without a tensor file gives). The default
        accepts only that: tensors this algorithm does not keep mean the checkpoint
        belongs to another algorithm or was altered, so it raises instead of ignoring them.
        """
        if tensors:
            keys = sorted(tensors)
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            raise ValueError(
                f"algorithm {self.name!r} keeps no tensor state, but the checkpoint holds "
                f"tensor state entries {keys[:3]}{more}"
            )

    def round_mechanisms(self, round_idx: int) -> tuple[MechanismUse, ...] | None:
        """Client-level algorithms: the population-level mechanism released in this round
        (`raydpfl.privacy.mechanisms.client_level_mechanisms`; one, once). The server
        charges its event to the population ledger before the round is selected and
        dispatched; after summing the uploads the platform makes the release itself and
        hands the server half only the result (``aggregate_release(global_params, tasks,
        released)``, see `raydpfl.algorithms.dp_fedavg_client.ClientLevelAlgorithm`), then
        checks the round's receipt. None (default): the round's costs are its tasks'."""
        return None

    def round_privacy_cost(self, round_idx: int) -> Any | None:
        """Client-level algorithms: the round's population-level charge (a
        `raydpfl.privacy.accounting.client_level.ClientLevelCost`): a read-only view of what
        `round_mechanisms` costs (the server refuses one that differs). None (default):
        the round's costs are its tasks'."""
        return None

    def stop_reason(self) -> str | None:
        """Why the run must stop before the next round (e.g. an iteration budget is
        spent), or None to go on. Checked by the server before every round."""
        return None

    def unaccounted_releases(self) -> list[str]:
        """Names of information this algorithm releases without privacy accounting."""
        return []

    def evaluation_model_keys(self, num_clients: int) -> list[str] | None:
        """Multi-model algorithms: the `ClientTask.model_key` of the model that scores
        each client's test split now (the server's params then hold every model under
        ``"{model_key}/{name}"``). None (default): one global model, unprefixed names."""
        return None

    # ---- client half -------------------------------------------------------------
    @abc.abstractmethod
    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        """Trains from `params` (modified in place) on `data` and returns the update."""

    def supports_group(self, tasks: Sequence[ClientTask]) -> bool:
        """Whether `local_update_group_sum` can train `tasks` together, vectorised over
        clients (`raydpfl.privacy.per_sample.multi_client`). The default, False, trains one client
        at a time; an algorithm that overrides it must give the same results up to float
        rounding, with the same RNG streams and draws."""
        return False

    def local_update_group_sum(
        self,
        ctxs: Sequence[ClientContext],
        params: Params,
        datas: Sequence[ClientData],
        tasks: Sequence[ClientTask],
    ) -> WeightedUpdateSum:
        """The group's Σ w_k Δ_k trained at once (only called when `supports_group`)."""
        raise NotImplementedError(f"{type(self).__name__} does not train groups vectorised")


#: Registry tags by which an algorithm declares how `raydpfl audit` may put canaries into
#: its runs: DP-FedAvg's own record canaries, the shared DP-SGD loop's null-record gradient
#: canaries (record level), client-level DP-FedAvg's canary clients. A private algorithm
#: without one is refused, with its ``notes["audit"]`` as the reason.
AUDIT_TAGS = {
    "audit:dp_fedavg": "record",
    "audit:dp_sgd_loop": "record",
    "audit:client": "client",
}


class UniformCohortAlgorithm(Algorithm):
    """An algorithm whose cohort is `clients_per_round` clients drawn uniformly without
    replacement every round (`uniform_cohort`); subclasses set `clients_per_round`."""

    clients_per_round: int

    def select(self, round_idx: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        return uniform_cohort(num_clients, self.clients_per_round, rng)


@dataclass
class ServerRound:
    """What the server half knows of the round it is aggregating, handed to `aggregate` and
    `aggregate_sum` when they take a ``server_round`` keyword.

    ``index``: the 0-based round; ``seed``: the run seed. `rng` gives the round's seeded
    numpy streams (`server_stream`: the same draws whatever the number or order of
    workers); `emit` puts a number into the round's row (rounds.parquet) from where it is
    computed, with no state to stash until `after_round`.
    """

    index: int
    seed: int
    metrics: dict[str, float] = field(default_factory=dict)

    def rng(self, purpose: str) -> np.random.Generator:
        """The stream of this round named by `purpose` (one name, one stream)."""
        return server_stream(self.seed, self.index, purpose)

    def emit(self, name: str, value: float) -> None:
        """Adds ``name`` = `value` to the round's row (a later `emit` of a name replaces it)."""
        self.metrics[name] = float(value)


def with_round(hook: Callable[..., Any], server_round: ServerRound | None) -> Callable[..., Any]:
    """`hook` (`Algorithm.aggregate` or `aggregate_sum`) with ``server_round`` bound when it
    takes that keyword; an override written before the keyword existed is called without."""
    if server_round is not None and "server_round" in inspect.signature(hook).parameters:
        return functools.partial(hook, server_round=server_round)
    return hook


def server_stream(seed: int, round_idx: int, purpose: str) -> np.random.Generator:
    """A numpy stream of the server half named by (run seed, round, purpose): the same
    draws however many workers run and in whatever order clients finish (a server half's
    own randomness, e.g. k-means initialisation, a robust aggregator's tie-breaks)."""
    tag = sum((i + 1) * ord(ch) for i, ch in enumerate(purpose))
    return np.random.default_rng(np.random.SeedSequence([int(seed), round_idx + 1, tag]))


def uniform_cohort(num_clients: int, cohort_size: int, rng: np.random.Generator) -> list[int]:
    """`cohort_size` distinct clients drawn uniformly without replacement, sorted.

    Client selection is treated as public: the ledger charges each client only for the
    rounds it takes part in, with no amplification claimed from client sampling.
    """
    chosen = rng.choice(num_clients, size=cohort_size, replace=False)
    return sorted(int(c) for c in chosen)


def parameter_delta(local: Params, start: Params) -> Params:
    """local − start, per tensor."""
    return {n: local[n] - start[n] for n in local}


def trained_result(
    task: ClientTask,
    data: ClientData,
    params: Params,
    start: Params,
    metrics: dict[str, float],
) -> ClientResult:
    """The `ClientResult` of local training from `start` to `params`: the update
    params − start (`parameter_delta`), weight and example count |D| of the client's
    training records."""
    n = data.num_examples
    return ClientResult(
        client_id=task.client_id,
        update=parameter_delta(params, start),
        weight=float(n),
        num_examples=n,
        metrics=metrics,
    )
