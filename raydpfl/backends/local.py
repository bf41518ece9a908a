"""`LocalBackend`: one in-process `ClientWorker`, tasks run sequentially.

The reference backend: the fastest path for debugging, and what every other backend
must reproduce for the same seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from raydpfl.algorithms.base import ClientResult, ClientTask, WeightedUpdateSum
from raydpfl.backends.base import Backend
from raydpfl.simulation.evaluation import EvalResult
from raydpfl.simulation.worker import ClientWorker


class LocalBackend(Backend):
    """Runs every task in this process on one resident worker."""

    def __init__(self, worker: ClientWorker) -> None:
        self.worker = worker

    def run_tasks(
        self, global_params: Mapping[str, torch.Tensor], tasks: Sequence[ClientTask]
    ) -> list[ClientResult]:
        return self.worker.run_tasks(global_params, tasks)

    def run_groups(
        self, global_params: Mapping[str, torch.Tensor], groups: Sequence[Sequence[ClientTask]]
    ) -> list[WeightedUpdateSum]:
        return self.worker.run_groups(global_params, groups)

    def evaluate_clients(
        self, params: Mapping[str, torch.Tensor], client_ids: Sequence[int]
    ) -> list[EvalResult]:
        return self.worker.evaluate_clients(params, client_ids)
