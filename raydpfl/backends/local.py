"""`LocalBackend`: one in-process `ClientWorker`, tasks run sequentially.

The reference backend: the fastest path for debugging, and what every other backend
must reproduce for the same seed.

``runtime.round_timeout_s`` holds here as on Ray: each call (a round's tasks, an
evaluation) runs under a SIGALRM deadline (`_deadline`), so a client step or a plug-in
that blocks stops the run with `RoundTimeoutError` instead of hanging. A signal is the
one way to interrupt Python code running in this very thread; it is raised between
bytecodes (a blocking C call, one long torch kernel, ends first). Off the main thread (a
caller's own thread) no signal can be set and the calls are not timed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from raydpfl.algorithms.base import ClientResult, ClientTask, WeightedUpdateSum
from raydpfl.backends.allocator import tune_allocator
from raydpfl.simulation.backend import Backend, RoundTimeoutError
from raydpfl.simulation.evaluation import CentralTestSet, EvalResult
from raydpfl.simulation.worker import ClientWorker


class LocalBackend(Backend):
    """Runs every task in this process on one resident worker.

    Training uses `threads` torch threads (the Ray workers' count for the same config,
    see `worker_threads`), so both backends produce the same bits; the process's own
    setting is restored between calls, for evaluation and the caller.
    """

    def __init__(
        self, worker: ClientWorker, threads: int, round_timeout_s: float | None = None
    ) -> None:
        self.worker = worker
        self.threads = threads
        self.round_timeout_s = round_timeout_s
        tune_allocator()  # this process trains: keep freed step buffers (allocator.py)

    def run_tasks(
        self, global_params: Mapping[str, torch.Tensor], tasks: Sequence[ClientTask]
    ) -> list[ClientResult]:
        with _torch_threads(self.threads), _deadline(self.round_timeout_s, "a round"):
            return self.worker.run_tasks(global_params, tasks)

    def run_groups(
        self, global_params: Mapping[str, torch.Tensor], groups: Sequence[Sequence[ClientTask]]
    ) -> list[WeightedUpdateSum]:
        with _torch_threads(self.threads), _deadline(self.round_timeout_s, "a round"):
            return self.worker.run_groups(global_params, groups)

    def evaluate_clients(
        self,
        params: Mapping[str, torch.Tensor],
        client_ids: Sequence[int],
        model_keys: Sequence[str] | None = None,
    ) -> list[EvalResult]:
        with _deadline(self.round_timeout_s, "evaluation"):
            return self.worker.evaluate_clients(params, client_ids, model_keys)

    def evaluate_central(
        self, params: Mapping[str, torch.Tensor], test_set: CentralTestSet
    ) -> EvalResult:
        with _deadline(self.round_timeout_s, "central evaluation"):
            return super().evaluate_central(params, test_set)


class _DeadlinePassed(BaseException):
    """Raised by the alarm handler; a BaseException, so that no ``except Exception`` in
    the code it interrupts (a fallback path, a plug-in's) can swallow it."""


@contextlib.contextmanager
def _deadline(timeout_s: float | None, what: str) -> Iterator[None]:
    """Raises `RoundTimeoutError` if the block runs longer than `timeout_s` (the same
    message as the Ray backend's); no deadline for None or off the main thread. The
    caller's SIGALRM handler and timer are put back afterwards."""
    if timeout_s is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def passed(signum: int, frame: Any) -> None:
        raise _DeadlinePassed()

    previous = signal.signal(signal.SIGALRM, passed)
    started = time.monotonic()
    outer_delay, _ = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    except _DeadlinePassed:
        raise RoundTimeoutError(
            f"{what} did not finish within {timeout_s:g} s (runtime.round_timeout_s); a "
            "client step (a plug-in's algorithm or model?) may be hung"
        ) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay:  # an enclosing timer keeps running, less the time spent here
            left = outer_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3))


@contextlib.contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
