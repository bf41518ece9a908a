"""Central evaluation (raydpfl/simulation/evaluation.py): its batching."""

from __future__ import annotations

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
