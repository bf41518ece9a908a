"""benchmarks/_floors.py: every floor trains the same clients on the same batches, so
the one-process, multi-process and client-vectorised non-private floors end at the same
model (up to float summation order), and the multi-process split is the Ray pool's."""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from raydpfl.algorithms.base import ClientTask
from raydpfl.experiment.build import build_experiment
from raydpfl.simulation.reduction import group_tasks, group_work, lpt_bins
from tests.conftest import small_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _floors  # noqa: E402


@pytest.fixture(scope="module")
def plan():
    torch.set_num_threads(1)  # the workers are forked: no OpenMP pool in the parent
    cfg = small_config(
        experiment__data={"dataset": "digits", "num_clients": 20, "partition": {"kind": "iid"}},
        experiment__model={"name": "mlp"},
        experiment__algorithm__clients_per_round=8,
        runtime__aggregation_groups=4,
    )
    return _floors.record_batches(build_experiment(cfg), 3, workers=2)


def _close(a, b):
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-5, atol=1e-6)


def test_nonprivate_floors_agree_in_one_and_in_two_processes_and_vectorised(plan):
    one = _floors.run_nonprivate(plan)
    two = _floors.run_nonprivate(plan, processes=2)
    vec = _floors.run_vectorised_nonprivate(plan)
    vec2 = _floors.run_vectorised_nonprivate(plan, processes=2)
    assert len(one.round_seconds) == len(two.round_seconds) == 3
    moved = sum(
        float((one.final_params[n] - plan.init_params[n]).abs().sum()) for n in one.final_params
    )
    assert moved > 0  # the floors train
    for other in (two, vec, vec2):
        _close(one.final_params, other.final_params)
    assert one.test_accuracy == pytest.approx(two.test_accuracy, abs=2e-3)


def test_the_two_process_split_covers_each_round_once(plan):
    for clients, split in zip(plan.rounds, plan.splits, strict=True):
        assert len(split) == 2
        assert sorted(i for part in split for i in part) == list(range(len(clients)))


@pytest.mark.parametrize("seed", range(5))
def test_worker_split_is_the_ray_pools_split(seed):
    """The floor's split equals the server's grouping then the Ray backend's dealing."""
    rnd = random.Random(seed)
    sizes = np.array([rnd.randint(1, 900) for _ in range(rnd.randint(3, 60))])
    q, tau, groups, workers = rnd.choice([0.05, 0.3, 1.0]), rnd.randint(1, 5), 8, 2
    tasks = [
        ClientTask.dp_sgd(i, 0, tau, 0.1, noise_multiplier=1.0, clip_norm=1.0, sampling_rate=q)
        for i in range(len(sizes))
    ]
    grouped = group_tasks(tasks, sizes, groups)
    bins = lpt_bins(group_work(grouped, sizes), workers)
    ray_split = [sorted(t.client_id for g in b for t in grouped[g]) for b in bins]
    ours = _floors.worker_split(sizes.tolist(), q, tau, groups, workers)
    assert [list(part) for part in ours] == ray_split


@pytest.mark.parametrize("sampler", ["torch", "ziggurat", "boxmuller"])
def test_the_per_sample_floor_replays_raydpfls_batches_and_noise(sampler, tmp_path):
    """Same batches, same noise (any sampler): the per-sample floor ends where raydpfl
    ends, up to float summation order, and a wrong replay would not."""
    from raydpfl.experiment.build import run_experiment

    torch.set_num_threads(1)
    cfg = small_config(
        experiment__data={"dataset": "digits", "num_clients": 20, "partition": {"kind": "iid"}},
        experiment__model={"name": "mlp"},
        experiment__algorithm__clients_per_round=6,
        experiment__algorithm__rounds=2,
        experiment__algorithm__eval_every=1,
        experiment__privacy={"noise_sampler": sampler},
        runtime__aggregation_groups=4,
    )
    plan = _floors.record_batches(build_experiment(cfg), 2, workers=2)
    assert plan.noise_sampler == sampler
    floor = _floors.run_per_sample(plan)
    ours = run_experiment(build_experiment(cfg), tmp_path)
    model = torch.load(tmp_path / "model.pt")
    for name, t in floor.final_params.items():
        torch.testing.assert_close(model[name], t, rtol=1e-4, atol=1e-5)
    assert ours["final_test_accuracy"] == pytest.approx(floor.test_accuracy, abs=1.5 / 360)
    # the other sampler's noise gives another model
    other = "torch" if sampler != "torch" else "boxmuller"
    wrong = _floors.run_per_sample(dataclasses.replace(plan, noise_sampler=other))
    moved = sum(
        float((wrong.final_params[n] - floor.final_params[n]).abs().max())
        for n in floor.final_params
    )
    assert moved > 1e-3
