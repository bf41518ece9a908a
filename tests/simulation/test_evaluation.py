"""Central evaluation (raydpfl/simulation/evaluation.py): its batching."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from raydpfl.simulation import evaluation
from raydpfl.simulation.evaluation import eval_batch_size, evaluate


def test_the_cpu_batch_keeps_activations_under_the_mmap_threshold():
    """FedAvgCNN's largest activation (32 × 24 × 24 floats per image) at the CPU batch
    stays below the allocator's 64 MiB mmap threshold, so it is reused, not faulted in."""
    from raydpfl.backends.allocator import MMAP_THRESHOLD

    assert eval_batch_size("cpu") * 32 * 24 * 24 * 4 < MMAP_THRESHOLD
    assert eval_batch_size(torch.device("cpu")) == evaluation.CPU_EVAL_BATCH
    assert eval_batch_size("meta") == evaluation.DEVICE_EVAL_BATCH


def test_batches_do_not_change_the_result(monkeypatch):
    """Any batch gives the same correct count and the same loss up to float rounding;
    the default on the CPU batches by CPU_EVAL_BATCH."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    params = {n: p.detach() for n, p in model.named_parameters()}
    x, y = torch.randn(1000, 6), torch.randint(0, 3, (1000,))
    whole = evaluate(model, params, x, y, batch_size=1000)
    seen = []
    original = evaluation.functional_call

    def spy(m, p, args):
        seen.append(args[0].shape[0])
        return original(m, p, args)

    monkeypatch.setattr(evaluation, "CPU_EVAL_BATCH", 300)
    monkeypatch.setattr(evaluation, "functional_call", spy)
    default = evaluate(model, params, x, y)
    assert seen == [300, 300, 300, 100]
    assert default.correct == whole.correct and default.num_examples == 1000
    assert default.loss_sum == pytest.approx(whole.loss_sum, rel=1e-6)


@pytest.mark.parametrize("regression", [False, True])
def test_stretches_of_batches_merge_to_the_whole_evaluation_bit_for_bit(regression):
    """Split anywhere between batches, the per-batch sums added in batch order give the
    very float `evaluate` gives: a backend may spread the batches over its workers."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1 if regression else 3))
    params = {n: p.detach() for n, p in model.named_parameters()}
    x = torch.randn(1000, 6)
    y = torch.randn(1000) if regression else torch.randint(0, 3, (1000,))
    whole = evaluate(model, params, x, y, batch_size=64)
    nb = evaluation.num_batches(1000, 64)
    assert nb == 16

    for cuts in ([0, 16], [0, 8, 16], [0, 1, 5, 6, 15, 16], list(range(17))):
        parts = [
            evaluation.evaluate_batches(model, params, x, y, 64, range(a, b))
            for a, b in itertools.pairwise(cuts)
        ]
        merged = evaluation.merge_batches(parts, 1000, regression)
        assert merged == whole, cuts
    assert whole.regression is regression
    assert evaluation.merge_batches([], 0, False).num_examples == 0


def test_a_workers_stretches_equal_the_servers_central_evaluation():
    """`ClientWorker.evaluate_central_batches` scores the dataset's x_test/y_test: its
    stretches merge to `CentralTestSet.evaluate`, bit for bit at one thread."""
    from raydpfl.experiment.build import build_experiment
    from raydpfl.simulation.evaluation import CentralTestSet
    from raydpfl.simulation.worker import ClientWorker
    from tests.conftest import small_config

    exp = build_experiment(small_config())
    worker = ClientWorker(exp.algorithm, exp.model_spec, exp.dataset, 0)
    model = exp.model_spec.build().requires_grad_(False)
    test_set = CentralTestSet(
        model, torch.as_tensor(exp.dataset.x_test), torch.as_tensor(exp.dataset.y_test)
    )
    params = {n: t + 0.01 for n, t in exp.init_params.items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = test_set.evaluate(params)
        nb = evaluation.num_batches(test_set.num_examples, test_set.batch_size)
        assert nb >= 3
        parts = [
            worker.evaluate_central_batches(params, test_set.batch_size, range(0, 1)),
            worker.evaluate_central_batches(params, test_set.batch_size, range(1, nb)),
        ]
    finally:
        torch.set_num_threads(threads)
    assert evaluation.merge_batches(parts, test_set.num_examples, False) == expected


def test_the_ray_backend_gives_each_worker_one_consecutive_stretch(monkeypatch):
    """RayBackend.evaluate_central without Ray: fake workers record the stretches they
    are handed; every batch is scored once, in order, one stretch per worker."""
    import raydpfl.backends.ray.backend as ray_backend
    from raydpfl.simulation.evaluation import BatchScores, CentralTestSet

    class FakeWorker:
        def __init__(self) -> None:
            self.asked: list[range] = []
            self.evaluate_central_batches = self  # so .remote(...) is ours

        def remote(self, params_ref, batch_size, batches):
            self.asked.append(batches)
            return BatchScores(tuple(float(b) for b in batches), tuple(1 for _ in batches))

    def backend_of(workers: int) -> ray_backend.RayBackend:
        backend = ray_backend.RayBackend.__new__(ray_backend.RayBackend)
        backend.workers = [FakeWorker() for _ in range(workers)]
        backend.round_timeout_s = None
        backend._get = lambda refs, timeout, what: list(refs)
        return backend

    monkeypatch.setattr(ray_backend.ray, "put", lambda value: value)
    # 1,000 records at the CPU batch of 256: batches 0-3
    test_set = CentralTestSet(
        nn.Linear(2, 3), torch.zeros(1000, 2), torch.zeros(1000, dtype=torch.int64)
    )
    for workers, expected in [
        (1, [[range(4)]]),
        (3, [[range(2)], [range(2, 3)], [range(3, 4)]]),
        (6, [[range(1)], [range(1, 2)], [range(2, 3)], [range(3, 4)], [], []]),
    ]:
        backend = backend_of(workers)
        result = backend.evaluate_central({}, test_set)
        assert [w.asked for w in backend.workers] == expected
        assert result.loss_sum == 0.0 + 1.0 + 2.0 + 3.0 and result.correct == 4
        assert result.num_examples == 1000
