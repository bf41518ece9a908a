"""`ClientWorker`: a long-lived trainer that hosts many clients, one after another.

A worker is not a client. It keeps one model, the per-sample gradient function and
the whole federated data pool resident, and per client it copies the broadcast
parameters into its resident parameter tensors in place. The same class runs
in-process (local backend) and inside a Ray actor (Ray backend).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raydpfl.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    WeightedUpdateSum,
)
from raydpfl.algorithms.multi_model import ALL_MODELS, GLOBAL_MODEL
from raydpfl.data.federated import FederatedDataset, IndexTable
from raydpfl.models import assert_dp_compatible, build_model
from raydpfl.privacy.mechanisms.client_level_mechanisms import (
    GaussianShare,
    check_update_bound,
    check_upload_terms,
)
from raydpfl.privacy.mechanisms.kernel import (
    RAW_RECORDS_NOTE,
    RESULT_WEIGHT_NOTE,
    UNBOUNDED_WEIGHT_RULES,
    PrivacyContractError,
    PrivacySession,
    Receipt,
    check_receipt,
)
from raydpfl.privacy.noise.noise_samplers import seeded_stream
from raydpfl.privacy.noise.secure_noise import SecureGenerator
from raydpfl.privacy.per_sample import multi_client
from raydpfl.privacy.per_sample.dpsgd import SensitivityError
from raydpfl.privacy.per_sample.engines import make_engine
from raydpfl.simulation.evaluation import (
    BatchScores,
    EvalResult,
    evaluate,
    evaluate_batches,
    evaluation_params,
)
from raydpfl.simulation.seeding import derive_seed

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild the model architecture in any process.

    A zoo model is rebuilt by name. A user's model comes as `factory`, a callable with no
    arguments returning the module (a class or function from the user's script, a
    notebook or ``__main__`` included): it travels to Ray workers with the spec
    (cloudpickle takes such definitions by value).
    """

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    options: Mapping[str, int]
    factory: Callable[[], torch.nn.Module] | None = None

    def build(self) -> torch.nn.Module:
        """A fresh instance (parameters are overwritten by the broadcast ones)."""
        if self.factory is None:
            return build_model(self.name, self.input_shape, self.num_classes, **dict(self.options))
        model = self.factory()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"model: the factory {self.name!r} must return a torch.nn.Module, "
                f"got {type(model).__name__}"
            )
        assert_dp_compatible(model)  # e.g. no BatchNorm: it mixes a batch's records
        return model


def resolve_device(device: str) -> torch.device:
    """`auto` → CUDA when this process sees a GPU, else CPU; `cuda` must exist here."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"runtime.device is {device!r} but this process sees no CUDA device")
    return torch.device(device)


def as_tensor(array: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """`torch.as_tensor` without a copy on CPU, also for read-only arrays."""
    # Arrays from Ray's object store are read-only views of shared memory; torch warns
    # about that, but we never write to the data tensors.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return torch.as_tensor(array, device=device)


class _LazyIndex:
    """A CPU worker's view of an `IndexTable`: client k's index tensor is made when asked
    for (zero-copy, from the shared table), not one tensor per client up front."""

    __slots__ = ("table",)

    def __init__(self, table: IndexTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, client_id: int) -> torch.Tensor:
        return as_tensor(self.table[client_id], "cpu")


def _index_tensors(parts: Sequence[np.ndarray], device: torch.device) -> Sequence[torch.Tensor]:
    """Per-client index tensors: lazy views of a CSR table on the CPU; otherwise one
    tensor per client made once (on an accelerator: copied there once, not per task)."""
    if isinstance(parts, IndexTable) and device.type == "cpu":
        return _LazyIndex(parts)
    return [as_tensor(i, device) for i in parts]


class ClientWorker:
    """Trains and evaluates whichever clients it is handed.

    Args:
        algorithm: Its client half (`local_update`) is what runs here.
        model_spec: The architecture.
        dataset: The federated records (numpy; wrapped as tensors without a copy on CPU).
        run_seed: The run's seed; each client's stream derives from it.
        device: ``cpu``, ``cuda`` or ``auto`` (resolved in this process).
        engine: Per-sample clipping engine: ``auto``, ``bookkeeping`` or ``vmap``.
        vectorise: Train a group's clients simultaneously, vectorised over clients
            (`raydpfl.privacy.per_sample.multi_client`), where the algorithm supports it: ``auto``
            (where it pays off: on a GPU, or small models on a CPU), ``on`` or ``off``.
            Same results as one at a time up to float rounding.

    Secure-noise mode (``privacy.secure_noise``) travels on the algorithm, which every
    worker process receives, as ``algorithm.secure_noise`` (set by the experiment
    builder): then each client's stream is a `SecureGenerator` (`_stream`).
    """

    def __init__(
        self,
        algorithm: Algorithm,
        model_spec: ModelSpec,
        dataset: FederatedDataset,
        run_seed: int,
        device: str = "cpu",
        engine: str = "auto",
        vectorise: str = "auto",
    ) -> None:
        if vectorise not in ("auto", "on", "off"):
            raise ValueError(f"vectorise must be auto, on or off, got {vectorise!r}")
        self.algorithm = algorithm
        self.vectorise = vectorise
        self.run_seed = run_seed
        self.secure_noise = bool(getattr(algorithm, "secure_noise", False))
        self.noise_sampler = str(getattr(algorithm, "noise_sampler", "torch"))
        self.device = resolve_device(device)
        self.model = model_spec.build().to(self.device)
        self.model.requires_grad_(False)  # used functionally; its own tensors are never trained
        self.params: Params = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        self.clipping = make_engine(self.model, engine)
        # The run-level opt-out of the per-sample bound check (FedFDP's clip_mode: paper),
        # read once here: what the client half sets on the algorithm later changes nothing.
        self.unbounded_weight_rules = bool(getattr(algorithm, UNBOUNDED_WEIGHT_RULES, False))
        self.x = as_tensor(dataset.x, self.device)
        self.y = as_tensor(dataset.y, self.device)
        self.client_train = _index_tensors(dataset.client_train, self.device)
        self.client_test = _index_tensors(dataset.client_test, self.device)
        self._central_test = (dataset.x_test, dataset.y_test)  # numpy; on the device lazily
        self._central_test_on_device: tuple[torch.Tensor, torch.Tensor] | None = None

    def _stream(self, task: ClientTask) -> torch.Generator:
        """The client's RNG stream for `task`: derived from (run seed, round, client,
        kind), so reproducible on any worker; in secure-noise mode a `SecureGenerator`
        (DP noise and Poisson samples from os.urandom; not reproducible, by design). The
        seed is the same whatever ``privacy.noise_sampler``; only its Gaussians differ."""
        if self.secure_noise:
            return SecureGenerator(device=self.device)
        seed = derive_seed(self.run_seed, task.round_idx, task.client_id, task.kind)
        return seeded_stream(self.noise_sampler, seed, self.device)

    def load_params(
        self, params: Mapping[str, torch.Tensor], model_key: str = GLOBAL_MODEL
    ) -> None:
        """Copies model `model_key` of `params` into the resident tensors (no allocation).

        ``global`` reads the unprefixed names of a single-model broadcast; any other key
        reads ``"{model_key}/{name}"`` from a multi-model broadcast
        (`raydpfl.algorithms.multi_model`).
        """
        with torch.no_grad():
            for name, t in self.params.items():
                t.copy_(params[name if model_key == GLOBAL_MODEL else f"{model_key}/{name}"])

    def run_task(
        self, global_params: Mapping[str, torch.Tensor], task: ClientTask
    ) -> ClientResult:
        """Runs one client's task from `global_params` on that client's data.

        The client starts from the broadcast model named by `task.model_key`
        (`load_params`). With ``model_key == ALL_MODELS`` the client half instead gets the
        whole broadcast mapping (every model, prefixed names) and must only read it.
        """
        if task.model_key == ALL_MODELS:
            start: Params = dict(global_params)
        else:
            self.load_params(global_params, task.model_key)
            start = self.params
        if task.payload is not None:  # per-client tensors travel to the worker's device
            task = dataclasses.replace(
                task, payload={n: t.to(self.device) for n, t in task.payload.items()}
            )
        data, ctx, session = self._client(task)
        try:
            result = self.algorithm.local_update(ctx, start, data, task)
        except (PrivacyContractError, SensitivityError) as e:
            raise PrivacyContractError(
                f"algorithm {self.algorithm.name!r}, client {task.client_id}, round "
                f"{task.round_idx + 1} ({task.kind} task): {e}"
            ) from None
        except Exception as e:
            # Name the client and round: a traceback from deep inside torch says neither.
            raise RuntimeError(
                f"client {task.client_id} failed in round {task.round_idx + 1}: {e}"
            ) from e
        receipt = session.receipt()  # what the platform counted, not what the result says
        self._check_result(task, result, session, receipt, data)
        receipt = session.receipt()  # with the notes the checks added
        if _perturbed_updates(session):  # checked above: the upload is one of them
            # Whatever the client half read, its update left through the platform's clip
            # and noise; what else it returns (metrics, fields) is listed on its own.
            receipt = dataclasses.replace(
                receipt, notes=tuple(n for n in receipt.notes if n != RAW_RECORDS_NOTE)
            )
        result.receipt = receipt
        return result

    def _client(self, task: ClientTask) -> tuple[ClientData, ClientContext, PrivacySession]:
        """The client's records, context and privacy session for `task`: the session holds
        the task's declared mechanisms on the client's stream, bound to its records, the
        resident model and the worker's engine; the context's `generator` is, for a private
        algorithm's task that declares mechanisms, another stream (the mechanisms' is the
        platform's alone)."""
        data = ClientData(task.client_id, self.x, self.y, self.client_train[task.client_id])
        generator = self._stream(task)
        session = PrivacySession(task.mechanisms, generator, self.device)._bind(
            data, self.model, self.clipping, unbounded_weight_rules=self.unbounded_weight_rules
        )
        data._session = session
        ctx = ClientContext(
            model=self.model,
            clipping=self.clipping,
            # A task that declares no mechanism draws no noise: its stream is the client's.
            generator=self._own_stream(task)
            if self.algorithm.is_private and task.mechanisms
            else generator,
            device=self.device,
            privacy=session,
        )
        return data, ctx, session

    def _own_stream(self, task: ClientTask) -> torch.Generator:
        """A private algorithm's client half's own stream (its shuffles and probes): from
        (run seed, round, client, kind + ``/own``), never the mechanisms' stream."""
        seed = derive_seed(self.run_seed, task.round_idx, task.client_id, f"{task.kind}/own")
        return seeded_stream("torch", seed, self.device)

    def _check_result(
        self,
        task: ClientTask,
        result: ClientResult,
        session: PrivacySession,
        receipt: Receipt,
        data: ClientData,
    ) -> None:
        """The platform's checks on a result before it leaves the worker: the receipt of
        the worker's own session equals the declaration; a private run's result states the
        client's true record count, and an aggregation weight other than 0, 1 or that count
        is listed; an output-perturbation release uploads exactly what it returned; and in
        a private record-level run a task that declared no mechanism returns no update (it
        may report metrics, which the run lists as unaccounted)."""
        algo = self.algorithm
        where = f"algorithm {algo.name!r}, client {task.client_id}, round {task.round_idx + 1}"
        if not isinstance(result, ClientResult):
            raise PrivacyContractError(
                f"{where}: local_update returned {type(result).__name__}, not a ClientResult"
            )
        check_receipt(task.client_id, task.round_idx, task.kind, task.mechanisms, receipt)
        if algo.is_private:
            n = data.num_examples
            if result.num_examples != n:
                raise PrivacyContractError(
                    f"{where} ({task.kind} task): the result states num_examples="
                    f"{result.num_examples!r}, the client holds {n} records"
                )
            if float(result.weight) not in (0.0, 1.0, float(n)):
                session._note(RESULT_WEIGHT_NOTE)
        perturbed = _perturbed_updates(session)
        if perturbed and not any(_is_upload(released, result) for _, released in perturbed):
            raise PrivacyContractError(
                f"{where} ({task.kind} task): the task perturbed an update through "
                f"{perturbed[0][0].describe()} but uploads other tensors; the upload "
                "must be what perturb_update returned"
            )
        if task.client_update_bound is not None:
            self._check_upload(task, result, session, where)
        unnoised = algo.is_private and algo.privacy_unit == "record" and not task.mechanisms
        if unnoised and any(t.numel() and bool(t.ne(0).any()) for t in result.update.values()):
            raise PrivacyContractError(
                f"{where} ({task.kind} task): the task declared no mechanism but its "
                "result carries a model update; an un-noised task may report metrics only"
            )

    def _check_upload(
        self, task: ClientTask, result: ClientResult, session: PrivacySession, where: str
    ) -> None:
        """A client-level upload: clipped to the round's S (central noise), or exactly the
        output of the client's `GaussianShare`, which checked ‖Δ‖ ≤ S before adding its
        share (distributed noise); weight 1 and a 0/1 clip bit (`check_upload_terms`)."""
        check_upload_terms(result.weight, result.metrics, f"{where} ({task.kind} task)")
        bound = float(task.client_update_bound)  # type: ignore[arg-type]
        shares = [live for live in session if type(live.mechanism) is GaussianShare]
        if not shares:
            check_update_bound(result.update, bound, f"{where} ({task.kind} task)")
            return
        released = getattr(shares[0], "_released", None)
        if released is None or not _is_upload(released, result):
            raise PrivacyContractError(
                f"{where} ({task.kind} task): with distributed noise the upload must be what the "
                "client's GaussianShare released (its clipped update plus its share)"
            )

    def run_tasks(
        self, global_params: Mapping[str, torch.Tensor], tasks: Sequence[ClientTask]
    ) -> list[ClientResult]:
        """Runs tasks in order; results come back in the same order, on the CPU."""
        broadcast = {n: t.to(self.device) for n, t in global_params.items()}
        results = [self.run_task(broadcast, t) for t in tasks]
        if self.device.type == "cpu":
            return results
        return [result_on_host(r) for r in results]

    def run_groups(
        self,
        global_params: Mapping[str, torch.Tensor],
        groups: Sequence[Sequence[ClientTask]],
    ) -> list[WeightedUpdateSum]:
        """Runs each group's tasks in order and returns one weighted partial sum per group.

        Only the partial sums leave the worker, on the CPU; per-client updates are
        dropped as soon as they are added, so memory does not grow with the number of
        clients. A group the algorithm can train at once is vectorised over its clients
        (`_vectorise`).
        """
        broadcast = {n: t.to(self.device) for n, t in global_params.items()}
        out = []
        for group in groups:
            if self._vectorise(group):
                out.append(self._run_group_vectorised(broadcast, group))
                continue
            acc = WeightedUpdateSum()
            for task in group:
                acc.add_result(self.run_task(broadcast, task))
            out.append(acc)
        for acc in out:
            if acc.total is not None:
                acc.total = _on_host(acc.total)
        return out

    def _vectorise(self, group: Sequence[ClientTask]) -> bool:
        """Whether to train `group` vectorised over clients (see `multi_client`)."""
        if self.vectorise == "off" or len(group) < 2:
            return False
        if group[0].client_update_bound is not None:  # client level: every upload checked
            return False
        if not self.algorithm.supports_group(group):
            return False
        return self.vectorise == "on" or multi_client.pays_off(self.model, self.device)

    def _run_group_vectorised(
        self, broadcast: Mapping[str, torch.Tensor], group: Sequence[ClientTask]
    ) -> WeightedUpdateSum:
        """All of a group's clients at once: the same per-client RNG streams and draws as
        `run_task` one at a time, so the same results up to float rounding."""
        self.load_params(broadcast, group[0].model_key)
        clients = [self._client(t) for t in group]
        datas = [c[0] for c in clients]
        ctxs = [c[1] for c in clients]
        sessions = [c[2] for c in clients]
        try:
            acc = self.algorithm.local_update_group_sum(ctxs, self.params, datas, group)
        except (PrivacyContractError, SensitivityError) as e:
            ids = ", ".join(str(t.client_id) for t in group)
            raise PrivacyContractError(
                f"algorithm {self.algorithm.name!r}, clients {ids} (vectorised), round "
                f"{group[0].round_idx + 1}: {e}"
            ) from None
        except Exception as e:
            ids = ", ".join(str(t.client_id) for t in group)
            raise RuntimeError(
                f"clients {ids} (vectorised) failed in round {group[0].round_idx + 1}: {e}"
            ) from e
        # The receipts are the sessions' own counts, whatever the group function recorded.
        acc.receipts = [
            (t.client_id, session.receipt()) for t, session in zip(group, sessions, strict=True)
        ]
        for t, (_, receipt) in zip(group, acc.receipts, strict=True):
            check_receipt(t.client_id, t.round_idx, t.kind, t.mechanisms, receipt)
        return acc

    def evaluate_clients(
        self,
        params: Mapping[str, torch.Tensor],
        client_ids: Sequence[int],
        model_keys: Sequence[str] | None = None,
    ) -> list[EvalResult]:
        """Evaluates `params` on each client's held-out test records.

        `model_keys[k]` names the model that scores `client_ids[k]` in a multi-model
        broadcast (see `evaluation_params`); None scores every client with the single model.
        """
        broadcast = {n: t.to(self.device) for n, t in params.items()}
        if model_keys is not None and len(model_keys) != len(client_ids):
            raise ValueError(f"{len(model_keys)} model keys for {len(client_ids)} clients")
        out = []
        for k, c in enumerate(client_ids):
            idx = self.client_test[c]
            key = model_keys[k] if model_keys is not None else None
            chosen = broadcast if key is None else evaluation_params(broadcast, key)
            out.append(evaluate(self.model, chosen, self.x[idx], self.y[idx]))
        return out

    def evaluate_central_batches(
        self, params: Mapping[str, torch.Tensor], batch_size: int, batches: range
    ) -> BatchScores:
        """Scores `params` on batches `batches` of the central test set (the dataset's
        ``x_test``/``y_test``, cut at multiples of `batch_size`): one stretch of the
        server's evaluation, spread over the workers (`RayBackend.evaluate_central`)."""
        if self._central_test_on_device is None:
            x, y = self._central_test
            self._central_test_on_device = (as_tensor(x, self.device), as_tensor(y, self.device))
        x, y = self._central_test_on_device
        on_device = {n: t.to(self.device) for n, t in params.items()}
        return evaluate_batches(self.model, on_device, x, y, batch_size, batches)


def _perturbed_updates(session: PrivacySession) -> list[tuple[Any, Params]]:
    """(mechanism, returned tensors) of each record-level `perturb_update` the task
    invoked (a client-level `GaussianShare` is checked on its own, `_check_upload`)."""
    return [
        (live.mechanism, live._released)
        for live in session
        if getattr(live, "_released", None) is not None
        and type(live.mechanism) is not GaussianShare
    ]


def _is_upload(released: Mapping[str, torch.Tensor], result: ClientResult) -> bool:
    """The result uploads exactly `released`: the same tensor objects, every name."""
    update = result.update
    return set(update) == set(released) and all(update[n] is released[n] for n in released)


def _on_host(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with every tensor on the CPU: what a worker hands back to the server,
    whose parameters live on the CPU, and what may cross a process boundary to a server
    actor without a GPU. A no-op for CPU tensors; other values are kept as they are."""
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in values.items()}


def result_on_host(result: ClientResult) -> ClientResult:
    """`result` with every tensor it carries on the CPU: the update and any other field
    an algorithm's result type adds (e.g. PRIVATEFL's `local_state`), each a tensor or a
    {name: tensor} mapping."""
    changes: dict[str, object] = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, torch.Tensor):
            changes[f.name] = value.cpu()
        elif isinstance(value, Mapping) and any(
            isinstance(t, torch.Tensor) for t in value.values()
        ):
            changes[f.name] = _on_host(value)
    return dataclasses.replace(result, **changes) if changes else result
