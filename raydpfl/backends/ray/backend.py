"""`RayBackend`: a pool of long-lived `ClientWorker` actors on (fractional) CPUs/GPUs.

- A worker hosts many clients: the model, the compiled per-sample gradient function and
  the whole federated dataset stay resident; there is no actor per client.
- The dataset enters the object store once; every worker on a node maps the same numpy
  buffers (zero-copy).
- Each round the global parameters are `ray.put` once. Work is split over workers by
  greedy LPT on estimated work (largest first, to the least-loaded worker).
- For algorithms with a linear (weighted-mean) aggregation, each worker returns one
  partial sum per task group (see `raydpfl.simulation.reduction`), not one update per
  client; results are reassembled in plan order, whatever order workers finish in.
- Faults: workers restart (`max_restarts`) and Ray re-runs their in-flight calls
  (`max_task_retries`) with the same arguments. Client RNG streams derive from (seed,
  round, client), so a re-run reproduces the lost result exactly; the ledger was charged
  once, before dispatch, and is never charged again by a retry. A round that exceeds its
  deadline raises `RoundTimeoutError` instead of hanging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError

from raydpfl.algorithms.base import ClientResult, ClientTask, WeightedUpdateSum
from raydpfl.backends.ray.actors import RemoteClientWorker
from raydpfl.simulation.backend import Backend, RoundTimeoutError, WorkerLostError, worker_threads
from raydpfl.simulation.evaluation import CentralTestSet, EvalResult, merge_batches, num_batches
from raydpfl.simulation.reduction import estimated_work, group_work, lpt_bins


class RayBackend(Backend):
    """Runs client tasks on a pool of `ClientWorker` actors.

    Args:
        worker_args: Positional arguments of `RayClientWorker` (algorithm, model spec,
            boxed dataset reference, run seed, device, engine, vectorise).
        train_sizes: |D_i| per client, for load balancing.
        num_workers: Number of worker actors.
        cpus_per_worker: CPUs each worker reserves; its torch threads =
            `worker_threads(cpus_per_worker)`.
        gpus_per_worker: GPU fraction each worker reserves (e.g. 0.25: four per GPU).
        max_restarts: How often a dead worker is restarted (its calls re-run).
        round_timeout_s: Deadline for one round's calls; None waits forever.
        startup_timeout_s: Deadline for the workers to load data and models.
    """

    def __init__(
        self,
        worker_args: Sequence[Any],
        train_sizes: np.ndarray,
        *,
        num_workers: int,
        cpus_per_worker: float,
        gpus_per_worker: float,
        max_restarts: int,
        round_timeout_s: float | None,
        startup_timeout_s: float = 600.0,
    ) -> None:
        self.train_sizes = np.asarray(train_sizes)
        self.round_timeout_s = round_timeout_s
        self.max_restarts = max_restarts
        options = {
            "num_cpus": cpus_per_worker,
            "num_gpus": gpus_per_worker,
            "max_restarts": max_restarts,
            "max_task_retries": max_restarts,
        }
        threads = worker_threads(cpus_per_worker)
        self.workers = [
            RemoteClientWorker.options(**options).remote(*worker_args, threads=threads)
            for _ in range(num_workers)
        ]
        self._get([w.ping.remote() for w in self.workers], startup_timeout_s, "starting workers")

    # ---- Backend contract ---------------------------------------------------------
    def run_tasks(
        self, global_params: Mapping[str, torch.Tensor], tasks: Sequence[ClientTask]
    ) -> list[ClientResult]:
        work = [estimated_work(t, int(self.train_sizes[t.client_id])) for t in tasks]
        return self._scatter("run_tasks", global_params, tasks, work)

    def run_groups(
        self, global_params: Mapping[str, torch.Tensor], groups: Sequence[Sequence[ClientTask]]
    ) -> list[WeightedUpdateSum]:
        return self._scatter(
            "run_groups", global_params, groups, group_work(groups, self.train_sizes)
        )

    def evaluate_clients(
        self,
        params: Mapping[str, torch.Tensor],
        client_ids: Sequence[int],
        model_keys: Sequence[str] | None = None,
    ) -> list[EvalResult]:
        params_ref = ray.put(dict(params))
        positions = [
            c
            for c in np.array_split(np.arange(len(client_ids), dtype=np.int64), len(self.workers))
            if len(c)
        ]
        refs = [
            w.evaluate_clients.remote(
                params_ref,
                [int(client_ids[k]) for k in chunk],
                *([[model_keys[k] for k in chunk]] if model_keys is not None else []),
            )
            for w, chunk in zip(self.workers, positions, strict=False)
        ]
        return [r for part in self._get(refs, self.round_timeout_s, "evaluation") for r in part]

    def evaluate_central(
        self, params: Mapping[str, torch.Tensor], test_set: CentralTestSet
    ) -> EvalResult:
        """The central test set's batches split into one consecutive stretch per worker
        (every worker holds the set), summed in batch order: the same batches and sums
        whatever the number of workers, and the server's own thread stays free."""
        n, size = test_set.num_examples, test_set.batch_size
        stretches = [
            c for c in np.array_split(np.arange(num_batches(n, size)), len(self.workers)) if len(c)
        ]
        parts = []
        if stretches:
            params_ref = ray.put(dict(params))
            refs = [
                w.evaluate_central_batches.remote(
                    params_ref, size, range(int(c[0]), int(c[-1]) + 1)
                )
                for w, c in zip(self.workers, stretches, strict=False)
            ]
            parts = self._get(refs, self.round_timeout_s, "central evaluation")
        return merge_batches(parts, n, test_set.regression)

    def placements(self) -> list[dict[str, Any]]:
        """Where each worker runs (node, pid, GPU ids, threads)."""
        return self._get([w.placement.remote() for w in self.workers], 60.0, "placement query")

    def close(self) -> None:
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []

    # ---- helpers ------------------------------------------------------------------
    def _scatter(
        self,
        method: str,
        global_params: Mapping[str, torch.Tensor],
        items: Sequence[Any],
        work: Sequence[float],
    ) -> list[Any]:
        """Calls `method(params, items_of_worker)` on each worker, items split by LPT on
        `work`, and returns the per-item results in the order of `items`."""
        params_ref = ray.put(dict(global_params))  # one put per round, shared by all workers
        bins = lpt_bins(work, len(self.workers))
        refs = [
            getattr(w, method).remote(params_ref, [items[i] for i in b])
            for w, b in zip(self.workers, bins, strict=False)
        ]
        out: list[Any] = [None] * len(items)
        for b, part in zip(bins, self._get(refs, self.round_timeout_s, "a round"), strict=True):
            for i, result in zip(b, part, strict=True):
                out[i] = result
        return out

    def _get(self, refs: list[Any], timeout_s: float | None, what: str) -> list[Any]:
        try:
            return ray.get(refs, timeout=timeout_s)
        except GetTimeoutError:
            raise RoundTimeoutError(
                f"{what} did not finish within {timeout_s} s (runtime.round_timeout_s); "
                "a worker may be hung or the cluster may lack the requested resources"
            ) from None
        except RayActorError as e:
            raise WorkerLostError(
                f"a client worker died during {what} and could not be restarted "
                f"(runtime.max_restarts={self.max_restarts}): {e}"
            ) from e
