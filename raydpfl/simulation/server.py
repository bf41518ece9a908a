"""`Server`: drives the rounds, owns the global model and every client's ledger entry.

One round (design.md §1):

  1. select a cohort            (algorithm, on the server's "select" stream)
  2. plan each client's task    (algorithm; each task declares its privacy cost)
  3. charge the ledger          (before dispatch; a task that would exceed the client's
                                 budget is refused and never sent)
  4. workers train              (backend; results in plan order)
  5. aggregate                  (algorithm; in a client-level round the platform
                                 releases the sum through the round's declared, charged
                                 mechanism and the server half gets only the release)
  6. per-round optimisers       (algorithm.after_round)
  7. evaluate, record, report

The same class runs in-process and inside a Ray actor; it never imports Ray.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from raydpfl.algorithms.base import (
    Algorithm,
    ClientResult,
    ClientTask,
    ServerRound,
    WeightedUpdateSum,
    with_round,
)
from raydpfl.privacy.accounting.client_level import ClientLevelLedger
from raydpfl.privacy.accounting.ledger import PrivacyLedger
from raydpfl.privacy.accounting.ledger_stats import EpsilonStats
from raydpfl.privacy.mechanisms.client_level_mechanisms import TreeState
from raydpfl.privacy.mechanisms.kernel import (
    MechanismUse,
)
from raydpfl.simulation.backend import Backend
from raydpfl.simulation.charging import PrivacyAccounting, check_receipts, diverged
from raydpfl.simulation.evaluation import CentralTestSet, EvalResult
from raydpfl.simulation.fairness import fairness_metrics
from raydpfl.simulation.finite import check_finite_model
from raydpfl.simulation.integrity import (
    ResumeError,
    check_row_epsilons,
    first_ledger_difference,
    rebuild_ledger,
)
from raydpfl.simulation.outputs import RunWriter, model_sha256
from raydpfl.simulation.reduction import group_tasks
from raydpfl.simulation.seeding import SERVER, numpy_rng

Params = dict[str, torch.Tensor]


@dataclass
class ServerSettings:
    """Round schedule and metadata for one run."""

    run_seed: int
    rounds: int
    eval_every: int = 1
    evaluate_clients: bool = True
    aggregation_groups: int = 8  # fixed partial-sum groups (see simulation/reduction.py)
    metadata: Mapping[str, Any] = field(default_factory=dict)  # merged into summary.json
    # Side releases the run makes beside the algorithm's own (e.g. client test metrics).
    extra_unaccounted: Sequence[str] = ()
    checkpoint_every: int | None = None  # rounds between checkpoints (needs a writer)
    # Probability that a charged client's update never arrives (client dropout after charge).
    dropout: float = 0.0
    # Each client's natural name (FEMNIST writer, HF client_column), for clients.parquet.
    client_names: Sequence[str] = ()
    # ``privacy.batch_shape: fixed``: the cap B the platform stamps on every record-level
    # DP-SGD mechanism (`PrivacyAccounting._stamp_batch_shape`); None: plain Poisson.
    max_batch_size: int | None = None


class Server(PrivacyAccounting):
    """Runs a federated simulation on a backend.

    Args:
        algorithm: The algorithm (server half runs here).
        ledger: Per-client privacy ledger; None for a non-private algorithm.
        train_sizes: |D_i| per client (public, see the algorithm's unaccounted releases).
        init_params: The initial global parameters.
        test_set: Central test set for the global model.
        settings: Schedule and metadata.
        writer: Where tables and files go; None keeps results in memory only.
        on_round: Called with each round's row (progress reporting).
    """

    def __init__(
        self,
        *,
        algorithm: Algorithm,
        ledger: PrivacyLedger | ClientLevelLedger | None,
        train_sizes: np.ndarray,
        init_params: Params,
        test_set: CentralTestSet,
        settings: ServerSettings,
        writer: RunWriter | None = None,
        on_round: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> None:
        if algorithm.is_private and ledger is None:
            raise ValueError(f"algorithm {algorithm.name!r} is private and needs a ledger")
        self.algorithm = algorithm
        self.ledger = ledger
        self.train_sizes = np.asarray(train_sizes)
        self.num_clients = len(self.train_sizes)
        self.params = {n: t.detach().clone() for n, t in init_params.items()}
        self.test_set = test_set
        self.settings = settings
        self.writer = writer
        self.on_round = on_round
        self.rows: list[dict[str, Any]] = []
        self.rounds_completed = 0
        self.stop_reason = "completed all rounds"
        self._started: float | None = None
        self._outputs_closed = False
        self.resumed_from: int | None = None
        self._logged: dict[int, list[list[Any]]] = {}  # charges of rounds being replayed
        self._log_position = 0  # lines of ledger_log.jsonl the ledger holds
        self._backend: Backend | None = None
        self._clients_round: int | None = None  # the last round listed in clients.parquet
        self._final_scored = False  # `_score_final_model` ran
        # Client-level runs: the population-level mechanisms the current round declared
        # (charged before dispatch, drawn through the round's session at aggregation).
        self._round_declared: tuple[MechanismUse, ...] | None = None
        # DP-FTRL: the tree's clean running sum and its nodes' noise (the platform's state,
        # never the algorithm's; checkpointed beside the algorithm's tensor state).
        self._tree_state = TreeState()
        # What the platform saw leave the client halves un-noised (receipt notes, client
        # metric keys), listed in summary.json's unaccounted_releases; an ordered set.
        self._platform_unaccounted: dict[str, None] = {}
        # What the ledger was charged, by event (its fields but the step count): total
        # steps and number of charges; summary.json's privacy block is written from it.
        self._charged: dict[tuple[tuple[str, Any], ...], list[int]] = {}
        # Every client's ε as one array, kept current from the charged clients only.
        self._eps_stats = EpsilonStats(ledger, self.num_clients) if ledger is not None else None

    # ---- the round loop -----------------------------------------------------------
    def run(self, backend: Backend) -> dict[str, Any]:
        """Runs every round (or until every client's budget is spent); returns the summary."""
        try:
            self.checkpoint_start()
            for round_idx in range(self.rounds_completed, self.settings.rounds):
                if not self.run_round(backend, round_idx):
                    break
            self._score_final_model()  # while the outputs are open (its clients rows)
        finally:
            self.close_outputs()
        return self.finish()

    def run_round(self, backend: Backend, round_idx: int) -> bool:
        """Runs one round; returns False when no client can train any more."""
        t0 = time.perf_counter()
        if self._started is None:
            self._started = t0
        self._backend = backend  # multi-model runs score their final models through it
        reason = self.algorithm.stop_reason()
        if reason is not None:
            self.stop_reason = reason
            return False
        if not self._charge_round(round_idx):
            return False
        rng = numpy_rng(self.settings.run_seed, round_idx, SERVER, "select")
        cohort = self.algorithm.select(round_idx, self.num_clients, rng)
        tasks = self._stamp_bound(self.algorithm.plan(round_idx, cohort, self.train_sizes))
        tasks = self._stamp_batch_shape(tasks)
        self._check_declared(tasks)
        dispatched, refused = self._charge(round_idx, tasks)
        if not dispatched and refused and self._budget_exhausted(refused):
            self.stop_reason = "privacy budget exhausted for every client"
            return False
        # Dropout after charge: a charged client's update may never arrive (its charge
        # stands: the ledger bounds what it may have released).
        arrived = self._survivors(round_idx, dispatched)
        server_round = ServerRound(index=round_idx, seed=self.settings.run_seed)
        trained, received, metrics, followups = self._train_and_aggregate(
            backend, round_idx, arrived, server_round
        )
        if self._logged.pop(round_idx, None):  # the interrupted run charged more
            raise diverged(round_idx)
        row = self._round_row(round_idx, dispatched, refused, trained, received)
        if self.settings.dropout:
            row["clients_dropped"] = len(dispatched) - len(arrived)
        row.update(metrics)
        row.update(server_round.metrics)
        row.update(self.algorithm.after_round(round_idx, row, followups))
        self._evaluate(backend, round_idx, row)
        row["wall_seconds"] = time.perf_counter() - t0
        self.rows.append(row)
        self.rounds_completed = round_idx + 1
        if self.writer is not None:
            self.writer.add_round(row)
            every = self.settings.checkpoint_every
            if every and self.rounds_completed % every == 0:
                self._write_checkpoint()
        if self.on_round is not None:
            self.on_round(row)
        return True

    def _survivors(self, round_idx: int, dispatched: list[ClientTask]) -> list[ClientTask]:
        """The dispatched tasks whose results arrive: each is lost with probability
        `ServerSettings.dropout`, drawn in plan order from the round's own stream (the same
        clients drop however many workers run). A lost client is not run at all: its
        update would be discarded, and no other draw depends on it."""
        p = self.settings.dropout
        if not p or not dispatched:
            return dispatched
        lost = numpy_rng(self.settings.run_seed, round_idx, SERVER, "dropout").random(
            len(dispatched)
        )
        return [t for t, u in zip(dispatched, lost, strict=True) if u >= p]

    def _train_and_aggregate(
        self,
        backend: Backend,
        round_idx: int,
        tasks: list[ClientTask],
        server_round: ServerRound,
    ) -> tuple[int, int, dict[str, float], list[ClientResult]]:
        """Runs `tasks`, aggregates what comes back into `self.params` and runs the
        algorithm's follow-ups; (clients trained, updates received, the results' mean
        metrics, the follow-ups' results)."""
        algo = self.algorithm
        # A round with population mechanisms (client level) is always summed and released
        # by the platform, whatever the algorithm says of its aggregation.
        released_here = self._round_declared is not None
        if algo.linear_aggregation or released_here:
            groups = group_tasks(tasks, self.train_sizes, self.settings.aggregation_groups)
            partials = backend.run_groups(self.params, groups) if groups else []
            total = WeightedUpdateSum.merged(partials)
            check_receipts(tasks, total.receipts)
            self._note_releases([r for _, r in total.receipts], total.metric_sums)
            if released_here:
                with self._released_round(round_idx, total, tasks) as released:
                    self.params = with_round(algo.aggregate_release, server_round)(  # type: ignore[attr-defined]
                        self.params, tasks, released
                    )
            else:
                self.params = with_round(algo.aggregate_sum, server_round)(
                    self.params, tasks, total
                )
            check_finite_model(self.params, round_idx, [t.client_id for t in tasks])
            return total.count, len(partials), total.metric_means(), []
        results = backend.run_tasks(self.params, tasks) if tasks else []
        check_receipts(tasks, [(r.client_id, r.receipt) for r in results])
        self._note_results(results)
        self.params = with_round(algo.aggregate, server_round)(self.params, tasks, results)
        check_finite_model(self.params, round_idx, [t.client_id for t in tasks])
        metrics = _mean_metrics([r.metrics for r in results])
        followups: list[ClientResult] = []
        extra = self._stamp_batch_shape(
            algo.followup_tasks(round_idx, tasks, results, self.params)
        )
        # Follow-ups are charged like training tasks; a refused one is simply not run.
        extra_sent, _ = self._charge(round_idx, extra)
        if extra_sent:
            followups = backend.run_tasks(self.params, extra_sent)
            check_receipts(extra_sent, [(r.client_id, r.receipt) for r in followups])
            self._note_results(followups)
        return len(results), len(results), metrics, followups

    # ---- checkpoints ----------------------------------------------------------------
    def checkpoint_start(self) -> None:
        """Checkpoints a fresh run before its first round (when checkpoints are on), so a
        run that dies before its first periodic checkpoint can still be resumed."""
        fresh = self.rounds_completed == 0 and self.resumed_from is None
        if fresh and self.settings.checkpoint_every:
            self._write_checkpoint()

    def _write_checkpoint(self) -> None:
        if self.writer is None or not self.algorithm.resumable:
            return
        tensors = dict(self.algorithm.tensor_state())
        _, population = self._population_checkpoint()
        if any(k.startswith(TreeState.PREFIX) for k in tensors):
            raise ValueError(
                f"algorithm {self.algorithm.name!r}: tensor state keys starting with "
                f"{TreeState.PREFIX!r} are the platform's"
            )
        tensors.update(population)
        self.writer.write_checkpoint(
            self.rounds_completed,
            self.params,
            self.checkpoint_state(),
            tensors,
            log_entries=self._log_position,
        )

    def checkpoint_state(self) -> dict[str, Any]:
        """What a resumed run needs besides the parameters and the algorithm's tensor
        state (`Algorithm.tensor_state`, saved to its own file by the writer): JSON."""
        return {
            "format": 1,
            "rounds_completed": self.rounds_completed,
            "stop_reason": self.stop_reason,
            "rows": [_encode_nonfinite(r) for r in self.rows],
            "ledger": self.ledger.to_dict() if self.ledger is not None else None,
            "algorithm": self.algorithm.state_dict(),
            "platform_unaccounted": list(self._platform_unaccounted),
            "population": self._population_checkpoint()[0],
        }

    def resume(self) -> int:
        """Restores the last checkpoint of the run directory; returns the next round index.

        Every checkpoint file is verified against the manifest, and the ledger is rebuilt
        from ledger_log.jsonl (the record of what was charged) and must equal the
        checkpoint's copy (`_restore_ledger`); any mismatch raises `ResumeError`. Rounds
        after the checkpoint are re-run; their outputs are dropped and re-written. The RNG
        streams derive from (seed, round, client), so the replay is the same computation,
        and it is checked against the charges logged before the crash. The algorithm gets
        its JSON state, then its tensor state on the server's device.
        """
        if self.writer is None:
            raise ValueError("resume needs the run directory's writer")
        if not self.algorithm.resumable:
            raise ValueError(f"algorithm {self.algorithm.name!r} cannot be resumed yet")
        if (self.writer.run_dir / "summary.json").exists():
            raise ValueError(f"{self.writer.run_dir} is a finished run; nothing to resume")
        state, params = self.writer.read_checkpoint()
        if state.get("format") != 1:
            raise ValueError(f"unknown checkpoint format {state.get('format')!r}")
        # A multi-model algorithm's checkpoint may hold other (prefixed) names than the
        # initial parameters: restore the saved dict as it is, on the server's device.
        device = next(iter(self.params.values())).device
        self.params = {n: t.to(device) for n, t in params.items()}
        tensors = self.writer.read_checkpoint_tensors(state)
        self.rounds_completed = int(state["rounds_completed"])
        self.stop_reason = state["stop_reason"]
        self.rows = [_restore_nans(r) for r in state["rows"]]
        self._platform_unaccounted = dict.fromkeys(
            str(x) for x in state.get("platform_unaccounted", [])
        )
        self._restore_ledger(state)
        settled = self.writer.charge_batches()[: self._log_position]
        check_row_epsilons(self.ledger, settled, self.rows, self.num_clients)
        self._charged = {}
        for batch in settled:
            for _, cost in batch.charges:
                self._count_charge(cost)
        tensors = self._restore_population(
            state.get("population"), {n: t.to(device) for n, t in tensors.items()}
        )
        self.algorithm.load_state_dict(state["algorithm"])
        self.algorithm.load_tensor_state(tensors)
        self.writer.prepare_resume(self.rounds_completed, self.rows)
        self.resumed_from = self.rounds_completed
        return self.rounds_completed

    def _restore_ledger(self, state: Mapping[str, Any]) -> None:
        """The ledger from the charge log, checked against the checkpoint's copy.

        The checkpoint recorded how many log lines existed when it was written and the
        chain value after them: the log must still reach that value (a truncated or edited
        log cannot), and the charges in those lines must rebuild exactly the checkpoint's
        ledger. The lines after them belong to rounds the resume replays (`_charge`).
        """
        assert self.writer is not None
        batches = self.writer.charge_batches()
        mark = state.get("ledger_log")
        if not isinstance(mark, Mapping) or not isinstance(mark.get("entries"), int):
            raise ResumeError("the checkpoint does not say how far ledger_log.jsonl reached")
        n = mark["entries"]
        reached = batches[n - 1].chain if 0 < n <= len(batches) else None
        if len(batches) < n or (n > 0 and reached != mark.get("chain")):
            raise ResumeError(
                f"ledger_log.jsonl holds {len(batches)} charge records, but the checkpoint "
                f"was written after {n} of them: the log was truncated or replaced; the "
                "run cannot be resumed without under-counting its privacy cost"
            )
        settled, replay = batches[:n], batches[n:]
        late = [b.round + 1 for b in settled if b.round >= self.rounds_completed]
        early = [b.round + 1 for b in replay if b.round < self.rounds_completed]
        if late or early:
            raise ResumeError(
                f"ledger_log.jsonl does not match the checkpoint's round "
                f"{self.rounds_completed} (charges of round {(late or early)[0]} are on the "
                "wrong side of it)"
            )
        if self.ledger is None:
            if settled or state.get("ledger") is not None:
                raise ResumeError("a non-private run's checkpoint or log holds privacy charges")
        else:
            rebuilt = rebuild_ledger(self.ledger, settled)
            logged = json.loads(json.dumps(rebuilt.to_dict()))
            saved = state.get("ledger")
            where = first_ledger_difference(logged, saved if isinstance(saved, Mapping) else {})
            if where is not None:
                raise ResumeError(
                    f"the checkpoint's ledger disagrees with ledger_log.jsonl ({where}); "
                    "the log is the record of what was charged, so the run is not resumed"
                )
            self.ledger = rebuilt
        self._log_position = n
        self._logged = {}
        for batch in replay:
            self._logged.setdefault(batch.round, []).append(batch.charges)

    # ---- metrics ------------------------------------------------------------------
    def _epsilon_stats(self) -> EpsilonStats | None:
        """The ε statistics, brought up to date (rebuilt if the ledger was replaced, e.g.
        on resume, or charged behind the server's back)."""
        if self.ledger is None:
            return None
        if self._eps_stats is None:
            self._eps_stats = EpsilonStats(self.ledger, self.num_clients)
        else:
            self._eps_stats.sync(self.ledger)
        return self._eps_stats

    def _epsilons(self) -> np.ndarray:
        stats = self._epsilon_stats()
        if stats is None:
            return np.full(self.num_clients, np.inf)
        return stats.values

    def _round_row(
        self,
        round_idx: int,
        dispatched: Sequence[ClientTask],
        refused: Sequence[ClientTask],
        trained: int,
        received: int,
    ) -> dict[str, Any]:
        stats = self._epsilon_stats()
        eps_max, eps_mean = (stats.max(), stats.mean()) if stats is not None else (np.inf, np.inf)
        row: dict[str, Any] = {
            "round": round_idx + 1,
            "test_accuracy": float("nan"),
            "test_loss": float("nan"),
            "epsilon_max": float(eps_max),
            "epsilon_mean": float(eps_mean),
            "local_steps": float(np.mean([t.local_steps for t in dispatched]))
            if dispatched
            else 0.0,
            "clients_trained": trained,
            "clients_refused": len(refused),
            "updates_received": received,  # partial sums or client results that came back
        }
        return row

    def _evaluate(
        self, backend: Backend, round_idx: int, row: dict[str, Any], final: bool = False
    ) -> None:
        # The last round is always scored, also when the algorithm ends the run early
        # (`final`: the run stopped after this round, see `_score_final_model`).
        last = (
            final
            or round_idx + 1 == self.settings.rounds
            or self.algorithm.stop_reason() is not None
        )
        if not (last or (round_idx + 1) % self.settings.eval_every == 0):
            return
        ids = list(range(self.num_clients))
        keys = self.algorithm.evaluation_model_keys(self.num_clients)
        if keys is None:
            central = backend.evaluate_central(self.params, self.test_set)
            row["test_accuracy"], row["test_loss"] = central.accuracy, central.loss
            if not self.settings.evaluate_clients:
                # Not scored per client (no client test split, or turned off): the last
                # round still lists every client's ε and size in clients.parquet.
                if last:
                    self._write_clients(round_idx, None)
                return
            per_client = backend.evaluate_clients(self.params, ids)
        else:
            # Several models: each client is scored with its own; the central figures are
            # the example-weighted mean over the clients' test splits (`_pooled`).
            per_client = backend.evaluate_clients(self.params, ids, keys)
            central = _pooled(per_client)
            row["test_accuracy"], row["test_loss"] = central.accuracy, central.loss
            if not self.settings.evaluate_clients:
                if last:
                    self._write_clients(round_idx, None)
                return
        self._write_clients(round_idx, per_client)
        accs = np.array([e.accuracy for e in per_client], dtype=float)
        if np.isfinite(accs).any():
            row["client_accuracy_mean"] = float(np.nanmean(accs))
            row["client_accuracy_std"] = float(np.nanstd(accs))
            row.update(self._fairness(per_client))

    def _write_clients(self, round_idx: int, per_client: Sequence[EvalResult] | None) -> None:
        """One clients.parquet row per client for this round: its ε and size, and its test
        figures when it was scored (`per_client`; None: NaN and 0 test records)."""
        self._clients_round = round_idx
        if self.writer is None:
            return
        # Column arrays: the ε and size columns are the server's arrays as they are.
        n = self.num_clients
        nan = np.full(n, np.nan)
        self.writer.add_clients(
            {
                "round": np.full(n, round_idx + 1, dtype=np.int32),
                "client_id": np.arange(n, dtype=np.int32),
                "test_accuracy": nan if per_client is None else [e.accuracy for e in per_client],
                "test_loss": nan if per_client is None else [e.loss for e in per_client],
                "epsilon": np.array(self._epsilons(), dtype=np.float64),
                "num_examples": np.asarray(self.train_sizes, dtype=np.int64),
                "num_test_examples": np.zeros(n, dtype=np.int64)
                if per_client is None
                else [e.num_examples for e in per_client],
                **({"client_name": list(names)} if (names := self.settings.client_names) else {}),
            }
        )

    def _fairness(self, per_client: Sequence[EvalResult]) -> dict[str, float]:
        """FedFDP's Ψ and the accuracy-spread metrics over the clients with test records,
        p_i ∝ |D_i| (see `raydpfl.simulation.fairness`); keys prefixed ``fair_``."""
        scored = [c for c, e in enumerate(per_client) if e.num_examples > 0]
        if not scored:
            return {}
        metrics = fairness_metrics(
            losses=[per_client[c].loss for c in scored],
            accuracies=[per_client[c].accuracy for c in scored],
            weights=[float(self.train_sizes[c]) for c in scored],
        )
        return {f"fair_{k}": v for k, v in metrics.items()}

    def _privacy_figures(self) -> dict[str, Any]:
        """ε max and mean with the δ each holds at, never a pair that no client has.

        With one δ for every client, ``delta`` is that δ. With heterogeneous budgets (each
        client its own δ_n), ``delta`` is the δ of the client with the largest ε (named in
        ``epsilon_max_client``), ``delta_max`` the largest δ of any client, and
        ``epsilon_mean`` mixes δs (``deltas: "per client"``; each client's (ε_n, δ_n) is
        in ledger.json and clients.parquet).
        """
        if self.ledger is None:
            keys = ("epsilon_max", "epsilon_mean", "delta", "accountant", "epsilon_unit")
            return dict.fromkeys(keys)
        stats = self._epsilon_stats()
        assert stats is not None
        top = stats.argmax()
        out: dict[str, Any] = {
            "epsilon_max": stats.max(),
            "epsilon_mean": stats.mean(),
            "delta": self.ledger.delta_of(top),
            "accountant": self.ledger.accountant,
            "epsilon_unit": _epsilon_unit(self.settings.metadata),
        }
        budgets = self.ledger.client_budgets
        if budgets:
            # max over every client's δ: the listed clients' own, and the ledger's δ if
            # any client in range is not listed (no Python loop over all N clients).
            own = [d for c, (_, d) in budgets.items() if 0 <= c < self.num_clients]
            deltas = own + ([self.ledger.delta] if len(own) < self.num_clients else [])
            out.update(epsilon_max_client=top, delta_max=max(deltas), deltas="per client")
        return out

    # ---- end of run -----------------------------------------------------------------
    def _score_final_model(self) -> None:
        """Scores the final model and lists every client's ε and size in clients.parquet
        if its round was not (a run that stopped early, e.g. every client's budget spent,
        ends on a round that `eval_every` skipped)."""
        if not self.rows or self._final_scored:
            return
        self._final_scored = True
        row = self.rows[-1]
        round_idx = int(row["round"]) - 1
        scored = bool(np.isfinite(row["test_accuracy"]))
        if scored and self._clients_round == round_idx:
            return
        if scored:  # scored centrally, without per-client rows: list ε and sizes
            self._write_clients(round_idx, None)
            return
        if self._backend is not None:
            self._evaluate(self._backend, round_idx, row, final=True)
        elif self.algorithm.evaluation_model_keys(self.num_clients) is None:
            central = self.test_set.evaluate(self.params)
            row["test_accuracy"], row["test_loss"] = central.accuracy, central.loss
            self._write_clients(round_idx, None)
        else:
            return
        if self.writer is not None and not self._outputs_closed:
            self.writer.replace_last_round(row)

    def close_outputs(self) -> None:
        """Finalises the tables and writes the ledger (idempotent; keeps finished rounds)."""
        if self.writer is None or self._outputs_closed:
            return
        self._outputs_closed = True
        self.writer.close()
        if self.ledger is not None:
            self.writer.write_ledger(self.ledger.to_dict())

    def finish(self) -> dict[str, Any]:
        """Closes the outputs, writes the final model and summary, returns the summary."""
        self._score_final_model()
        self.close_outputs()
        wall = time.perf_counter() - self._started if self._started is not None else 0.0
        summary = self.summary(wall)
        if self.writer is not None:
            self.writer.write_model(self.params)
            self.writer.write_summary(summary)
        return summary

    def summary(self, wall_seconds: float) -> dict[str, Any]:
        """The run's final figures and privacy statement."""
        accs = [r["test_accuracy"] for r in self.rows if np.isfinite(r["test_accuracy"])]
        private = self.ledger is not None
        out: dict[str, Any] = {
            "final_test_accuracy": accs[-1] if accs else None,
            "best_test_accuracy": max(accs) if accs else None,
            **self._privacy_figures(),
            "private": private,
            "rounds_completed": self.rounds_completed,
            "updates_received_max": max((r["updates_received"] for r in self.rows), default=0),
            "rounds_planned": self.settings.rounds,
            "stop_reason": self.stop_reason,
            "resumed_from_round": self.resumed_from,
            "wall_seconds": wall_seconds,
            "model_sha256": model_sha256(self.params),
            "ledger_sha256": self.ledger.sha256() if private else None,
            "unaccounted_releases": list(
                dict.fromkeys(
                    [
                        *self.algorithm.unaccounted_releases(),
                        *self.settings.extra_unaccounted,
                        *self._platform_unaccounted,
                    ]
                )
            ),
        }
        out.update(self.settings.metadata)
        if private:
            stated = out.get("privacy")
            out["privacy"] = self._privacy_block(stated if isinstance(stated, Mapping) else {})
        return out


def _epsilon_unit(metadata: Mapping[str, Any]) -> str:
    """Which unit a run's ε is about: the privacy metadata's ``epsilon_unit`` (record-level
    DP-SGD, today's only unit, when it says nothing)."""
    privacy = metadata.get("privacy")
    unit = privacy.get("epsilon_unit") if isinstance(privacy, Mapping) else None
    return str(unit) if unit else "record"


#: How a checkpointed row spells a non-finite float (JSON has none; the writer would
#: turn it into null, and ±inf, e.g. a non-private run's ε, must come back as ±inf).
_NONFINITE = "__nonfinite__"


def _encode_nonfinite(row: Mapping[str, Any]) -> dict[str, Any]:
    """`row` with each non-finite float as ``{"__nonfinite__": "nan" | "inf" | "-inf"}``."""
    return {
        k: {_NONFINITE: repr(v)} if isinstance(v, float) and not math.isfinite(v) else v
        for k, v in row.items()
    }


def _restore_nans(row: Mapping[str, Any]) -> dict[str, Any]:
    """Undoes `_encode_nonfinite`, so rows are exactly a fresh run's. Checkpoints written
    before it stored every non-finite float as null: those come back as NaN."""
    return {k: _decode_nonfinite(v) for k, v in row.items()}


def _decode_nonfinite(value: Any) -> Any:
    if value is None:
        return float("nan")
    if isinstance(value, Mapping) and set(value) == {_NONFINITE}:
        return float(value[_NONFINITE])
    return value


def _pooled(per_client: Sequence[EvalResult]) -> EvalResult:
    """The example-weighted mean of per-client results: the central test figures of a
    multi-model run, where each client's test split is scored with its own model."""
    return EvalResult(
        loss_sum=float(sum(e.loss_sum for e in per_client)),
        correct=int(sum(e.correct for e in per_client)),
        num_examples=int(sum(e.num_examples for e in per_client)),
        regression=any(e.regression for e in per_client),
    )


def _mean_metrics(per_client: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean of each metric over the clients that reported it."""
    keys = sorted({k for m in per_client for k in m})
    return {k: float(np.mean([m[k] for m in per_client if k in m])) for k in keys}
