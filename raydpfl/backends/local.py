"""`LocalBackend`: one in-process `ClientWorker`, tasks run sequentially.

The reference backend: the fastest path for debugging, and what every other backend
must reproduce for the same seed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import torch

from raydpfl.algorithms.base import ClientResult, ClientTask, WeightedUpdateSum
from raydpfl.backends.allocator import tune_allocator
from raydpfl.simulation.backend import Backend
from raydpfl.simulation.evaluation import EvalResult
from raydpfl.simulation.worker import ClientWorker


class LocalBackend(Backend):
    """Runs every task in this process on one resident worker.

    Training uses `threads` torch threads (the Ray workers' count for the same config,
    see `worker_threads`), so both backends produce the same bits; the process's own
    setting is restored between calls, for evaluation and the caller.
    """

    def __init__(self, worker: ClientWorker, threads: int) -> None:
        self.worker = worker
        self.threads = threads
        tune_allocator()  # this process trains: keep freed step buffers (allocator.py)

    def run_tasks(
        self, global_params: Mapping[str, torch.Tensor], tasks: Sequence[ClientTask]
    ) -> list[ClientResult]:
        with _torch_threads(self.threads):
            return self.worker.run_tasks(global_params, tasks)

    def run_groups(
        self, global_params: Mapping[str, torch.Tensor], groups: Sequence[Sequence[ClientTask]]
    ) -> list[WeightedUpdateSum]:
        with _torch_threads(self.threads):
            return self.worker.run_groups(global_params, groups)

    def evaluate_clients(
        self,
        params: Mapping[str, torch.Tensor],
        client_ids: Sequence[int],
        model_keys: Sequence[str] | None = None,
    ) -> list[EvalResult]:
        return self.worker.evaluate_clients(params, client_ids, model_keys)


@contextlib.contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
