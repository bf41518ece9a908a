"""The classes that become Ray actors. `ray.remote` is applied here, at import time of
this module only, so `raydpfl.simulation` never imports Ray."""

from __future__ import annotations

import os
from typing import Any

import ray
import torch

from raydpfl.algorithms.base import Algorithm
from raydpfl.backends.allocator import tune_allocator
from raydpfl.backends.ray.runtime_env import check_same_code
from raydpfl.simulation.worker import ClientWorker, ModelSpec


class RayClientWorker(ClientWorker):
    """A `ClientWorker` in a Ray actor: sets its torch threads to its CPU share, maps the
    dataset from the object store, and can report where Ray placed it.

    The dataset arrives boxed (``[ObjectRef]``) and is fetched here, so a restarted
    actor fetches it again by reference (zero-copy on the node) from its owner.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        model_spec: ModelSpec,
        dataset_box: list[Any],
        run_seed: int,
        device: str,
        engine: str,
        vectorise: str = "auto",
        *,
        threads: int,
    ) -> None:
        check_same_code()  # the driver's raydpfl (`runtime_env`), or refuse to start
        torch.set_num_threads(threads)
        tune_allocator()  # reuse freed step buffers instead of faulting pages in again
        dataset = ray.get(dataset_box[0])
        super().__init__(algorithm, model_spec, dataset, run_seed, device, engine, vectorise)

    def placement(self) -> dict[str, Any]:
        """Where this worker runs: node, process, accelerator ids Ray granted, threads."""
        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "torch_threads": torch.get_num_threads(),
            "device": str(self.device),
            "restarted": ctx.was_current_actor_reconstructed,
        }

    def ping(self) -> bool:
        """Answers once the constructor has finished (data and model resident)."""
        return True


RemoteClientWorker = ray.remote(RayClientWorker)
