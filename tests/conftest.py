"""Shared fixtures: tiny real configs that train in seconds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from raydpfl.algorithms.base import ClientTask
from raydpfl.config import Config, config_from_dict
from raydpfl.privacy.mechanisms.kernel import GaussianRelease, LaplaceRelease, uses

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(autouse=True)
def _two_threads():
    # CI has 2 cores; tests must not depend on the machine's default thread count.
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


def small_config(**sections) -> Config:
    """A DP-FedAvg config on a small synthetic population; sections override parts."""
    raw = {
        "experiment": {
            "name": "test",
            "data": {
                "dataset": "synthetic",
                "num_clients": 12,
                "synthetic": {"alpha": 0.5, "beta": 0.5, "min_samples": 300, "max_samples": 800},
            },
            "model": {"name": "logreg"},
            "algorithm": {
                "name": "dp_fedavg",
                "rounds": 4,
                "clients_per_round": 4,
                "local_steps": 3,
                "lr": 0.5,
            },
            "privacy": {
                "epsilon": 50.0,
                "delta": 1e-5,
                "clip_norm": 1.0,
                "noise_multiplier": 1.0,
                "sampling_rate": 0.1,
            },
        },
        "runtime": {"backend": "local", "seed": 0, "progress": False},
    }
    return config_from_dict(override(raw, **sections))


def dp_task() -> ClientTask:
    """Client 0's round-0 DP-SGD task for `small_config`'s data: 2 steps, q = 0.1, C = 1,
    σ = 1 (what a worker runs when it is asked to train that client)."""
    return ClientTask.dp_sgd(
        client_id=0,
        round_idx=0,
        local_steps=2,
        lr=0.5,
        sampling_rate=0.1,
        clip_norm=1.0,
        noise_multiplier=1.0,
    )


def override(raw: dict, **sections) -> dict:
    """`raw` with parts replaced, in place: ``experiment__data__num_clients=3`` sets one
    value; a dict value is merged into the dict it replaces (keys not given are kept)."""
    for dotted, value in sections.items():
        node = raw
        *head, last = dotted.split("__")
        for k in head:
            node = node.setdefault(k, {})
        if isinstance(value, dict) and isinstance(node.get(last), dict):
            node[last] = {**node[last], **value}  # merge: keep the keys not overridden
        else:
            node[last] = value
    return raw


def release_scale(task: ClientTask) -> float:
    """The noise std (Gaussian) or scale (Laplace) of the task's one full-batch release."""
    (use,) = task.mechanisms
    m = use.mechanism
    return m.noise_scale if isinstance(m, LaplaceRelease) else m.noise_std


def with_release_scale(
    task: ClientTask, scale: float, sensitivity: float | None = None
) -> ClientTask:
    """`task` with its one full-batch release's noise std (or Laplace scale) set to
    `scale` at the same sensitivity (or `sensitivity`: e.g. the one a hand-built client's
    record count needs); 0 makes it noise-free (a zero-noise Gaussian)."""
    (use,) = task.mechanisms
    m = use.mechanism
    if sensitivity is not None:
        m = dataclasses.replace(m, sensitivity=float(sensitivity))
    if scale == 0:
        new = GaussianRelease(0.0, m.sensitivity)
    elif isinstance(m, LaplaceRelease):
        new = LaplaceRelease(scale / m.sensitivity, m.sensitivity)
    else:
        new = GaussianRelease(scale / m.sensitivity, m.sensitivity)
    return dataclasses.replace(task, mechanisms=(uses(new, use.count),))
