"""`ClientWorker`: a long-lived trainer that hosts many clients, one after another.

A worker is not a client. It keeps one model, the per-sample gradient function and
the whole federated data pool resident, and per client it copies the broadcast
parameters into its resident parameter tensors in place. The same class runs
in-process (local backend) and inside a Ray actor (Ray backend).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from raydpfl.algorithms.base import Algorithm, ClientContext, ClientData, ClientResult, ClientTask
from raydpfl.models import build_model
from raydpfl.privacy.dpsgd import PerSampleGradients
from raydpfl.simulation.evaluation import EvalResult, evaluate
from raydpfl.simulation.seeding import torch_generator

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild the model architecture in any process."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    options: Mapping[str, int]

    def build(self) -> torch.nn.Module:
        """A fresh instance (parameters are overwritten by the broadcast ones)."""
        return build_model(self.name, self.input_shape, self.num_classes, **dict(self.options))


@dataclass(frozen=True)
class ClientPool:
    """The federated records a worker can serve: one pool plus per-client index arrays."""

    x: np.ndarray
    y: np.ndarray
    client_train: tuple[np.ndarray, ...]
    client_test: tuple[np.ndarray, ...]


class ClientWorker:
    """Trains and evaluates whichever clients it is handed.

    Args:
        algorithm: Its client half (`local_update`) is what runs here.
        model_spec: The architecture.
        pool: The clients' records (numpy; wrapped as tensors without copying on CPU).
        run_seed: The run's seed; each client's stream derives from it.
        device: Torch device for the model and the data.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        model_spec: ModelSpec,
        pool: ClientPool,
        run_seed: int,
        device: str = "cpu",
    ) -> None:
        self.algorithm = algorithm
        self.run_seed = run_seed
        self.device = torch.device(device)
        self.model = model_spec.build().to(self.device)
        self.model.requires_grad_(False)  # used functionally; its own tensors are never trained
        self.params: Params = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        self.per_sample = PerSampleGradients(self.model)
        self.x = torch.as_tensor(pool.x, device=self.device)
        self.y = torch.as_tensor(pool.y, device=self.device)
        self.client_train = [torch.as_tensor(i, device=self.device) for i in pool.client_train]
        self.client_test = [torch.as_tensor(i, device=self.device) for i in pool.client_test]

    def load_params(self, params: Mapping[str, torch.Tensor]) -> None:
        """Copies `params` into the resident parameter tensors (no allocation)."""
        with torch.no_grad():
            for name, t in self.params.items():
                t.copy_(params[name])

    def run_task(
        self, global_params: Mapping[str, torch.Tensor], task: ClientTask
    ) -> ClientResult:
        """Runs one client's task from `global_params` on that client's data."""
        self.load_params(global_params)
        data = ClientData(task.client_id, self.x, self.y, self.client_train[task.client_id])
        ctx = ClientContext(
            model=self.model,
            per_sample=self.per_sample,
            generator=torch_generator(
                self.run_seed, task.round_idx, task.client_id, "train", device=self.device
            ),
            device=self.device,
        )
        return self.algorithm.local_update(ctx, self.params, data, task)

    def run_tasks(
        self, global_params: Mapping[str, torch.Tensor], tasks: Sequence[ClientTask]
    ) -> list[ClientResult]:
        """Runs tasks in order; results come back in the same order."""
        broadcast = {n: t.to(self.device) for n, t in global_params.items()}
        return [self.run_task(broadcast, t) for t in tasks]

    def evaluate_clients(
        self, params: Mapping[str, torch.Tensor], client_ids: Sequence[int]
    ) -> list[EvalResult]:
        """Evaluates `params` on each client's held-out test records."""
        broadcast = {n: t.to(self.device) for n, t in params.items()}
        out = []
        for c in client_ids:
            idx = self.client_test[c]
            out.append(evaluate(self.model, broadcast, self.x[idx], self.y[idx]))
        return out
