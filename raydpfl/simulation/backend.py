"""The backend contract (beside the server that calls it): where client tasks run, never
what they compute.

A backend runs a round's tasks and returns the results in the order of the tasks,
whatever order they finished in, and evaluates parameters on clients' held-out data
and on the central test set.
`close()` releases only what the backend created and may be called more than once.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

import torch

from raydpfl.algorithms.base import ClientResult, ClientTask, WeightedUpdateSum
from raydpfl.simulation.evaluation import CentralTestSet, EvalResult


class RoundTimeoutError(RuntimeError):
    """A round did not finish within ``runtime.round_timeout_s``."""


class WorkerLostError(RuntimeError):
    """A worker died and could not be restarted."""


class ServerLostError(RuntimeError):
    """The server actor died and the run could not continue from a checkpoint."""


class ServerStartError(RuntimeError):
    """The server actor could not be created (the same every time: not retried)."""


def worker_threads(cpus_per_worker: float) -> int:
    """Torch threads of a worker with this CPU share: max(1, floor(cpus)).

    Every backend trains with this many threads per worker: CPU kernels may reduce in a
    different order with another thread count, and results must not depend on the
    backend.
    """
    return max(1, int(cpus_per_worker))


class Backend(abc.ABC):
    """Runs client tasks on workers."""

    @abc.abstractmethod
    def run_tasks(
        self, global_params: Mapping[str, torch.Tensor], tasks: Sequence[ClientTask]
    ) -> list[ClientResult]:
        """Runs every task from `global_params`; results in the order of `tasks`."""

    @abc.abstractmethod
    def run_groups(
        self, global_params: Mapping[str, torch.Tensor], groups: Sequence[Sequence[ClientTask]]
    ) -> list[WeightedUpdateSum]:
        """Runs every group (tasks in order); one weighted partial sum per group, in order."""

    @abc.abstractmethod
    def evaluate_clients(
        self,
        params: Mapping[str, torch.Tensor],
        client_ids: Sequence[int],
        model_keys: Sequence[str] | None = None,
    ) -> list[EvalResult]:
        """Evaluates `params` on each client's test split; in the order of `client_ids`.

        `model_keys[k]` names the model of a multi-model `params` that scores client
        `client_ids[k]` (see `raydpfl.algorithms.multi_model`); None: one model.
        """

    def evaluate_central(
        self, params: Mapping[str, torch.Tensor], test_set: CentralTestSet
    ) -> EvalResult:
        """Scores `params` on the central test set. This default scores it in the
        calling (server) process; a backend with workers may spread the set's batches
        over them (the Ray backend does), with the same batches and the same sums."""
        return test_set.evaluate(params)

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Releases what the backend created."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
