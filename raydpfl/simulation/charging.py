"""The server's privacy accounting: what a round is charged, what comes back, what is listed.

`PrivacyAccounting` is the part of `raydpfl.simulation.server.Server` that keeps the
ledger honest, in one place: it stamps client-level tasks with the round's bound S,
checks declarations (`_check_declared`), charges each task's declared mechanisms before
dispatch (`_charge`, `_charge_tasks`; a client-level round's event before the cohort is
drawn, `_charge_round`), logs every batch of charges (`_log_charges`; on resume, checks the
replay against the log), makes a client-level round's release itself on the actual sum
of uploads and hands the server half only the result (`_released_round`; the DP-FTRL tree
state it keeps is checkpointed with the server, `_population_checkpoint`), checks
receipts (`check_receipts`), lists what came back outside a mechanism (`_note_releases`)
and writes summary.json's privacy block from the charges (`_privacy_block`). The mixin
reads the server's state (`algorithm`, `ledger`, `writer`, `settings`, the replay
state); it never imports Ray.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from raydpfl.algorithms.base import Algorithm, ClientResult, ClientTask, WeightedUpdateSum
from raydpfl.algorithms.dp_fedavg_client import ClientLevelAlgorithm
from raydpfl.privacy.accounting.client_level import POPULATION, ClientLevelLedger
from raydpfl.privacy.accounting.ledger import PrivacyLedger
from raydpfl.privacy.accounting.plan import check_planned
from raydpfl.privacy.mechanisms.client_level_mechanisms import (
    ROUND_SESSION_ATTR,
    SERVED_ATTR,
    ReleasedSum,
    RoundUploads,
    TreeState,
    check_round_receipt,
    open_round_session,
    population_charge,
)
from raydpfl.privacy.mechanisms.kernel import (
    RAW_RECORDS_NOTE,
    MechanismUse,
    PrivacyContractError,
    Receipt,
    SubsampledGaussian,
    check_receipt,
)
from raydpfl.simulation.integrity import ResumeDivergedError
from raydpfl.simulation.outputs import RunWriter

__all__ = ["PrivacyAccounting", "check_receipts", "diverged"]


class PrivacyAccounting:
    """The server's charging, receipts and listings (a mixin of `Server`)."""

    algorithm: Algorithm
    ledger: PrivacyLedger | ClientLevelLedger | None
    writer: RunWriter | None
    settings: Any
    num_clients: int
    stop_reason: str
    _round_declared: tuple[MechanismUse, ...] | None
    _logged: dict[int, list[list[Any]]]
    _log_position: int
    _platform_unaccounted: dict[str, None]
    _charged: dict[tuple[tuple[str, Any], ...], list[int]]
    _epsilon_stats: Any  # the server's ε statistics, brought up to date (a method)
    _tree_state: (
        TreeState  # a client-level run's DP-FTRL tree (the platform's, not the algorithm's)
    )

    def _stamp_bound(self, tasks: Sequence[ClientTask]) -> list[ClientTask]:
        """In a client-level round, every task carries the round's S (the bound of its
        declared population mechanism) for the worker's upload check; otherwise none."""
        bound = None
        for use in self._round_declared or ():
            if use.mechanism.population_level and hasattr(use.mechanism, "clip_norm"):
                bound = float(use.mechanism.clip_norm)  # type: ignore[attr-defined]
                break
        return [
            t
            if t.client_update_bound == bound
            else dataclasses.replace(t, client_update_bound=bound)
            for t in tasks
        ]

    def _stamp_batch_shape(self, tasks: Sequence[ClientTask]) -> list[ClientTask]:
        """``privacy.batch_shape: fixed``: every declared `SubsampledGaussian` gets the
        run's cap B and the client's |D| (`SubsampledGaussian.with_batch_shape`) before it
        is charged, so the charge is the truncated event and the worker samples truncated
        at that cap (both read the one stamped mechanism). A cap the algorithm declared
        itself must be the run's (the platform's setting, not the plug-in's): any other,
        or any cap in a plain-Poisson run, is refused."""
        cap = getattr(self.settings, "max_batch_size", None)
        out = []
        for task in tasks:
            stamped = []
            for use in task.mechanisms:
                m = use.mechanism
                if type(m) is SubsampledGaussian:
                    n = int(self.train_sizes[task.client_id])  # type: ignore[attr-defined]
                    if m.max_batch_size is None and cap is not None:
                        use = MechanismUse(m.with_batch_shape(cap, n), use.count)
                    elif m.max_batch_size is not None and (
                        m.max_batch_size != cap or m.dataset_size != n
                    ):
                        raise PrivacyContractError(
                            f"client {task.client_id}, round {task.round_idx + 1}: algorithm "
                            f"{self.algorithm.name!r} declares {m.describe()}, but the run's "
                            f"batch shape is {'poisson' if cap is None else f'fixed at {cap}'} "
                            f"for this client's {n} records: the cap is the run's "
                            "privacy.max_batch_size, stamped by the platform"
                        )
                stamped.append(use)
            stamped_uses = tuple(stamped)
            out.append(
                task
                if stamped_uses == tuple(task.mechanisms)
                else dataclasses.replace(task, mechanisms=stamped_uses)
            )
        return out

    def _note_results(self, results: Sequence[ClientResult]) -> None:
        self._note_releases(
            [r.receipt for r in results],
            {k for r in results for k in r.metrics},
            [_extra_fields(r) for r in results],
        )

    def _note_releases(
        self,
        receipts: Sequence[Receipt | None],
        metric_keys: Iterable[str],
        extra_fields: Sequence[Sequence[str]] = (),
    ) -> None:
        """Lists what reached the server from the client halves outside a mechanism: the
        platform's notes on each receipt (raw record access, batch sizes, ...), every
        client metric (rounds.parquet averages them) and any field a result type adds
        beside the update. Private runs only; the list is the platform's, whatever the
        algorithm's own `unaccounted_releases` says."""
        if not self.algorithm.is_private:
            return
        found = self._platform_unaccounted
        # Client-level DP covers everything a client's records do to its clipped update:
        # its local training reads them by design.
        client_level = self.algorithm.privacy_unit == "client"
        if client_level:
            # the number of uploads summed: un-noised, in rounds.parquet and the release
            found.setdefault(COHORT_SIZES_NOTE, None)
        for receipt in receipts:
            for note in receipt.notes if receipt is not None else ():
                if not (client_level and note == RAW_RECORDS_NOTE):
                    found.setdefault(note, None)
        for key in sorted(metric_keys):
            found.setdefault(
                f"client_metric {key} (reported by the client half outside a mechanism; "
                "averaged into rounds.parquet)",
                None,
            )
        for names in extra_fields:
            for name in names:
                found.setdefault(
                    f"client_result_field {name} (returned beside the update outside a mechanism)",
                    None,
                )

    def _charge(
        self, round_idx: int, tasks: Sequence[ClientTask]
    ) -> tuple[list[ClientTask], list[ClientTask]]:
        """Charges each task's declared cost before dispatch; refuses unaffordable tasks.

        The batch of charges is logged (and synced) before the tasks are dispatched. In a
        resumed run, a replayed round must make exactly the charges the crashed run
        logged; anything else is an error rather than a silently different ledger.
        """
        dispatched, refused = self._charge_tasks(tasks)
        charges = [(t.client_id, cost.to_dict()) for t in dispatched for cost in t.privacy_costs]
        if not charges:
            return dispatched, refused
        self._log_charges(round_idx, charges)
        return dispatched, refused

    def _count_charge(self, cost: Mapping[str, Any]) -> None:
        key = tuple(sorted((k, v) for k, v in cost.items() if k != "steps"))
        entry = self._charged.setdefault(key, [0, 0])
        entry[0] += int(cost.get("steps", 1))
        entry[1] += 1

    def charged_events(self) -> list[dict[str, Any]]:
        """Every distinct event the ledger was charged (its fields, with ``steps`` the
        total over all charges and ``charges`` their number), in first-charge order."""
        return [
            {**dict(key), "steps": steps, "charges": count}
            for key, (steps, count) in self._charged.items()
        ]

    def _privacy_block(self, stated: Mapping[str, Any]) -> dict[str, Any]:
        """summary.json's privacy block: the plan's statement, with σ and q replaced by
        what the ledger was actually charged (one value, or the distinct values in charge
        order), and the charged events themselves. A field the config stated but no charge
        carries is kept as stated."""
        out = dict(stated)
        events = self.charged_events()
        out["charged"] = events
        sgm = [
            e
            for e in events
            if e.get("mechanism", "subsampled_gaussian")
            in ("subsampled_gaussian", "truncated_subsampled_gaussian")
        ]
        for name in ("noise_multiplier", "sampling_rate"):
            values = list(dict.fromkeys(e[name] for e in sgm if e.get(name) is not None))
            if values:
                out[name] = values[0] if len(values) == 1 else values
        return out

    def _charge_round(self, round_idx: int) -> bool:
        """Client-level runs: charges the event of the round's declared population-level
        mechanisms (`round_declaration`) to the `ClientLevelLedger` before anything of the
        round is drawn or dispatched, and logs it like a task's charge. False (and the
        stop reason) when it would exceed the client-level budget: the round is not run."""
        self._round_declared = None
        declared = self._round_declaration(round_idx)
        if declared is None:
            return True
        self._round_declared = declared
        cost = population_charge(declared)
        if cost is None:  # e.g. a later round of a DP-FTRL tree, paid by its first
            return True
        if not isinstance(self.ledger, ClientLevelLedger):
            raise ValueError(
                f"algorithm {self.algorithm.name!r} declares a client-level round cost, but the "
                "run's ledger is record-level: units never mix in one run"
            )
        if self.ledger.would_exceed(POPULATION, cost):
            eps = self.ledger.epsilon_after(POPULATION, cost)
            self.stop_reason = (
                f"client-level privacy budget exhausted: round {round_idx + 1} would raise "
                f"epsilon to {eps:.4g} > {self.ledger.epsilon_budget:g}"
            )
            return False
        stats = self._epsilon_stats()
        self.ledger.charge(POPULATION, cost)
        if stats is not None:
            stats.update([POPULATION], 1)
        self._log_charges(round_idx, [(POPULATION, cost.to_dict())])
        return True

    def _round_declaration(self, round_idx: int) -> tuple[MechanismUse, ...] | None:
        """The round's population-level mechanisms (``algorithm.round_mechanisms``), or
        None for an algorithm whose costs are its tasks'. A client-level private algorithm
        must declare at least one release per round, and a `round_privacy_cost` it states
        must be its mechanisms' event: σ or a cost cannot be stated on the side."""
        algo = self.algorithm
        declared_uses = algo.round_mechanisms(round_idx)
        client_level = algo.is_private and algo.privacy_unit == "client"
        if declared_uses is None:
            if client_level or algo.round_privacy_cost(round_idx) is not None:
                raise PrivacyContractError(
                    f"round {round_idx + 1}: algorithm {algo.name!r} is client-level but "
                    "declares no round mechanisms (round_mechanisms(round_idx), from "
                    "raydpfl.privacy.mechanisms.client_level_mechanisms): its server-side noise "
                    "would not be drawn through the kernel"
                )
            return None
        declared = tuple(declared_uses)
        self._check_server_half(round_idx)
        if client_level and not any(u.count for u in declared):
            raise PrivacyContractError(
                f"round {round_idx + 1}: algorithm {algo.name!r} is client-level private but "
                "its round declares no release (round_mechanisms); nothing would be noised"
            )
        charge = population_charge(declared)
        stated = algo.round_privacy_cost(round_idx)
        if stated != charge:
            raise PrivacyContractError(
                f"round {round_idx + 1}: algorithm {algo.name!r} states the round cost "
                f"{stated!r} but its declared mechanisms cost {charge!r}; the charge is the "
                "mechanisms' own event"
            )
        return declared

    def _check_server_half(self, round_idx: int) -> None:
        """A round with population mechanisms is released by the platform, and its server
        half is `aggregate_release`, which sees only the release: an override of
        `aggregate_sum` or `aggregate` (hooks that would see the un-noised sum, or each
        clipped upload) is refused, in one line naming the algorithm and the round."""
        algo = self.algorithm
        platform = {
            "aggregate_sum": (Algorithm.aggregate_sum, ClientLevelAlgorithm.aggregate_sum),
            "aggregate": (Algorithm.aggregate,),
        }
        for hook, allowed in platform.items():
            if hook in vars(algo) or getattr(type(algo), hook) not in allowed:
                raise PrivacyContractError(
                    f"round {round_idx + 1} (client-level, server half): algorithm "
                    f"{algo.name!r} overrides {hook}, which would see the un-noised uploads; "
                    "the platform makes the round's release and the server half is "
                    "aggregate_release(global_params, tasks, released)"
                )
        if not callable(getattr(algo, "aggregate_release", None)):
            raise PrivacyContractError(
                f"round {round_idx + 1} (client-level, server half): algorithm {algo.name!r} "
                "has no aggregate_release(global_params, tasks, released) to build its model "
                "from the round's release"
            )

    @contextlib.contextmanager
    def _released_round(
        self, round_idx: int, total: WeightedUpdateSum, tasks: Sequence[ClientTask]
    ) -> Iterator[ReleasedSum]:
        """Client-level rounds: the platform's release of the round's actual sum of uploads
        through the round's `PopulationSession` (`release_round`; its tree state, for
        DP-FTRL, is the server's), yielded for the server half. While the server half
        builds its model the session is set on the algorithm (``round_session``), so any
        release of its own in the round is refused; afterwards the receipt must equal the
        declared, charged release (`check_round_receipt`: one line naming the round)."""
        declared = self._round_declared
        assert declared is not None
        algo = self.algorithm
        seed = getattr(algo, "seed", self.settings.run_seed)
        session = open_round_session(algo, round_idx, declared, seed, self._tree_state)
        uploads = RoundUploads(total.total, total.count, dict(total.metric_sums))
        released = session.release_round(uploads, tasks, self._params_like())
        setattr(algo, SERVED_ATTR, True)  # no fresh (direct) session while a server runs it
        setattr(algo, ROUND_SESSION_ATTR, session)
        try:
            yield released
        finally:
            setattr(algo, ROUND_SESSION_ATTR, None)
        check_round_receipt(round_idx, declared, session.receipt())

    def _params_like(self) -> Mapping[str, torch.Tensor]:
        """The global model (the release's parameter order and devices)."""
        return self.params  # type: ignore[attr-defined,no-any-return]

    def _population_checkpoint(self) -> tuple[dict[str, Any] | None, dict[str, torch.Tensor]]:
        """The platform's population state to checkpoint: (JSON, tensors under the
        `TreeState.PREFIX` keys, beside the algorithm's own tensor state)."""
        return self._tree_state.state_dict(), self._tree_state.tensor_state()

    def _restore_population(
        self, state: Mapping[str, Any] | None, tensors: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Restores the platform's population state from a checkpoint; returns the tensors
        that are the algorithm's."""
        prefix = TreeState.PREFIX
        ours = {k: t for k, t in tensors.items() if k.startswith(prefix)}
        self._tree_state.load(state, ours)
        return {k: t for k, t in tensors.items() if not k.startswith(prefix)}

    def _log_charges(self, round_idx: int, charges: list[tuple[int, dict[str, Any]]]) -> None:
        """Appends a batch of charges to the log (synced), or, in a replayed round, checks
        it against the batch the interrupted run logged."""
        for _, cost in charges:
            self._count_charge(cost)
        logged = self._logged.get(round_idx)
        if logged:
            expected = logged.pop(0)
            if json.loads(json.dumps([[c, d] for c, d in charges])) != expected:
                raise diverged(round_idx)
            self._log_position += 1
        elif self.writer is not None:
            self.writer.log_charges(round_idx, charges)
            self._log_position += 1

    def _charge_tasks(
        self, tasks: Sequence[ClientTask]
    ) -> tuple[list[ClientTask], list[ClientTask]]:
        dispatched, refused = [], []
        charged: list[int] = []
        stats = self._epsilon_stats()
        planned = getattr(self.ledger, "planned", None)
        for task in tasks:
            # σ, C and q are the plan's: refused before anything is charged or sent
            check_planned(
                planned, task.client_id, task.round_idx, task.mechanisms, self.algorithm.name
            )
            costs = task.privacy_costs
            if costs:
                if self.ledger is None:
                    raise ValueError(
                        f"task for client {task.client_id} has a privacy cost but no ledger"
                    )
                # charged before release; refused (nothing recorded) over the budget
                if len(costs) == 1:
                    charged_eps = self.ledger.try_charge(task.client_id, costs[0])
                else:  # all of the task's mechanisms, or none of them
                    charged_eps = self.ledger.try_charge_all(task.client_id, costs)
                if charged_eps is None:
                    refused.append(task)
                    continue
                charged.append(task.client_id)
            dispatched.append(task)
        if charged and stats is not None:
            stats.update(charged, len(charged))
        return dispatched, refused

    def _budget_exhausted(self, refused: Sequence[ClientTask]) -> bool:
        assert self.ledger is not None  # only private tasks are ever refused
        costs = refused[0].privacy_costs
        assert costs
        if len(costs) == 1:
            return all(self.ledger.would_exceed(c, costs[0]) for c in range(self.num_clients))
        return all(self.ledger.would_exceed_all(c, costs) for c in range(self.num_clients))

    def _check_declared(self, tasks: Sequence[ClientTask]) -> None:
        """A private record-level algorithm's training tasks must release through at least
        one declared mechanism: one that declares none would train on the client's
        records and report ε = 0."""
        algo = self.algorithm
        if not algo.is_private or algo.privacy_unit != "record":
            return
        for task in tasks:
            if task.kind == "train" and not task.mechanisms:
                raise PrivacyContractError(
                    f"client {task.client_id}, round {task.round_idx + 1}: algorithm "
                    f"{algo.name!r} is private but its train task declares no mechanism "
                    "(ClientTask.mechanisms); nothing would be charged for its training"
                )


#: What a client-level run lists for the number of uploads of each round (un-noised; the
#: platform's listing, worded as `DPFedAvgClientLevel` words its own).
COHORT_SIZES_NOTE = "cohort_sizes (clients_trained per round in rounds.parquet)"

#: The fields every `ClientResult` has; a result type's other fields travel beside the
#: update and are listed as unaccounted (`PrivacyAccounting._note_releases`).
_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(ClientResult))


def _extra_fields(result: ClientResult) -> list[str]:
    if not dataclasses.is_dataclass(result):
        return []
    return [f.name for f in dataclasses.fields(result) if f.name not in _RESULT_FIELDS]


def check_receipts(
    tasks: Sequence[ClientTask], receipts: Sequence[tuple[int, Receipt | None]]
) -> None:
    """Every result's receipt equals its task's declaration (`check_receipt`); results
    come back in plan order per client."""
    pending: dict[int, deque[ClientTask]] = defaultdict(deque)
    for t in tasks:
        pending[t.client_id].append(t)
    for client_id, receipt in receipts:
        queue = pending.get(client_id)
        if not queue:
            raise PrivacyContractError(
                f"client {client_id}: a result arrived for a task that was not dispatched"
            )
        task = queue.popleft()
        check_receipt(client_id, task.round_idx, task.kind, task.mechanisms, receipt)


def diverged(round_idx: int) -> ResumeDivergedError:
    return ResumeDivergedError(
        f"resume diverged from the interrupted run in round {round_idx + 1}: the replayed "
        "charges differ from ledger_log.jsonl (different code, config or hardware?); the "
        "ledger log is the record of what was charged"
    )
