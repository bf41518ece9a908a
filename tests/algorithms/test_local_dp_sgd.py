"""The shared DP-SGD local loop and noisy loss query (`algorithms/local_dp_sgd.py`).

The loop must be exactly the τ DP-SGD steps the algorithms were published with: the same
draws from the client's stream in the same order (so a migrated algorithm keeps its bits),
each hook doing only its one job.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from raydpfl.algorithms.base import ClientContext, ClientData, ClientTask
from raydpfl.algorithms.local_dp_sgd import (
    batch_loss,
    clip_losses,
    dp_sgd_local_loop,
    dp_sgd_local_update,
    noisy_loss_query,
    private_mean_loss,
    step_divisor,
)
from raydpfl.privacy.per_sample.dpsgd import dp_sgd_step_, poisson_sample
from raydpfl.privacy.per_sample.engines import make_engine


def _setup(n: int = 40, seed: int = 0):
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(5, 3))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(99)
    x = torch.randn(n, 5, generator=gen)
    y = torch.randint(0, 3, (n,), generator=gen)
    data = ClientData(client_id=0, x=x, y=y, indices=torch.arange(n))
    ctx = ClientContext(
        model=model,
        clipping=make_engine(model),
        generator=torch.Generator().manual_seed(seed),
        device=torch.device("cpu"),
    )
    return ctx, params, data


def _task(**kw) -> ClientTask:
    args = dict(
        client_id=0,
        round_idx=0,
        local_steps=4,
        lr=0.3,
        sampling_rate=0.25,
        clip_norm=0.7,
        noise_multiplier=1.1,
    )
    args.update(kw)
    return ClientTask.dp_sgd(**args)


def _reference_steps(ctx, params, data, task, divisor_of):
    """τ DP-SGD steps written out by hand: the loop every algorithm used before."""
    for _ in range(task.local_steps):
        positions = poisson_sample(data.num_examples, task.sampling_rate, ctx.generator)
        x, y = data.batch(positions)
        dp_sgd_step_(
            ctx.clipping,
            params,
            x,
            y,
            lr=task.lr,
            clip_norm=task.clip_norm,
            noise_multiplier=task.noise_multiplier,
            expected_batch_size=divisor_of(int(positions.numel())),
            generator=ctx.generator,
        )


@pytest.mark.parametrize("normalizer", ["expected", "fixed"])
def test_loop_is_bit_identical_to_hand_written_dp_sgd(normalizer):
    task = _task()
    ctx_a, params_a, data = _setup()
    start, metrics = dp_sgd_local_loop(
        ctx_a, params_a, data, task, normalizer=normalizer, fixed_divisor=8.0
    )
    ctx_b, params_b, _ = _setup()
    divisor = 0.25 * 40 if normalizer == "expected" else 8.0
    _reference_steps(ctx_b, params_b, data, task, lambda b: divisor)
    for name in params_a:
        assert torch.equal(params_a[name], params_b[name]), name
    # the stream is left at the same point: the next draw agrees
    next_a = torch.rand(3, generator=ctx_a.generator)
    assert torch.equal(next_a, torch.rand(3, generator=ctx_b.generator))
    # the returned start is the untouched broadcast model
    _, fresh, _ = _setup()
    for name in fresh:
        assert torch.equal(start[name], fresh[name])
    assert 0.0 <= metrics["clipped_fraction"] <= 1.0
    assert metrics["mean_batch_size"] > 0


def test_update_is_trained_minus_start_with_the_clients_weight():
    ctx, params, data = _setup()
    _, before, _ = _setup()
    result = dp_sgd_local_update(ctx, params, data, _task())
    assert result.weight == 40.0 and result.num_examples == 40
    for name in params:
        assert torch.equal(result.update[name], params[name] - before[name])


def test_actual_normalizer_skips_an_empty_batch_but_expected_takes_a_noise_step():
    task = _task(sampling_rate=1e-9, local_steps=3)  # every Poisson batch is empty
    ctx, params, data = _setup()
    _, before, _ = _setup()
    _, metrics = dp_sgd_local_loop(ctx, params, data, task, normalizer="actual")
    for name in params:
        assert torch.equal(params[name], before[name])  # nothing moved
    assert metrics["mean_batch_size"] == 0.0
    ctx, params, data = _setup()
    dp_sgd_local_loop(ctx, params, data, task, normalizer="expected")
    assert any(not torch.equal(params[k], before[k]) for k in params)  # pure noise step


def test_step_divisor_rules_and_a_clear_error():
    assert step_divisor("expected", 0.1, 50, 7, 64.0) == pytest.approx(5.0)
    assert step_divisor("actual", 0.1, 50, 7, 64.0) == 7.0
    assert step_divisor("fixed", 0.1, 50, 7, 64.0) == 64.0
    with pytest.raises(ValueError, match="normalizer"):
        step_divisor("median", 0.1, 50, 7, 64.0)  # type: ignore[arg-type]


def test_correction_is_evaluated_at_each_steps_start_and_draws_nothing():
    seen = []

    def correction(current, start, payload):
        seen.append({k: v.clone() for k, v in current.items()})
        return {k: torch.full_like(v, 0.5) for k, v in current.items()}

    task = _task(noise_multiplier=0.0)
    ctx_a, params_a, data = _setup()
    dp_sgd_local_loop(ctx_a, params_a, data, task, correction=correction)
    assert len(seen) == task.local_steps
    # without noise the corrected run is the plain run shifted by η·0.5 per step,
    # and both consumed the same Poisson draws (the correction draws nothing)
    ctx_b, params_b, _ = _setup()
    dp_sgd_local_loop(ctx_b, params_b, data, task)
    next_a = torch.rand(2, generator=ctx_a.generator)
    assert torch.equal(next_a, torch.rand(2, generator=ctx_b.generator))
    _, start, _ = _setup()
    for name in start:
        assert torch.equal(seen[0][name], start[name])  # the first at the broadcast model


def test_fused_and_unfused_corrections_agree_up_to_rounding():
    def correction(current, start, payload):
        return {k: 0.2 * (current[k] - start[k]) + 0.01 for k in current}

    task = _task()
    ctx_a, params_a, data = _setup()
    dp_sgd_local_loop(ctx_a, params_a, data, task, correction=correction, fused_correction=False)
    ctx_b, params_b, _ = _setup()
    dp_sgd_local_loop(ctx_b, params_b, data, task, correction=correction, fused_correction=True)
    for name in params_a:
        torch.testing.assert_close(params_a[name], params_b[name], rtol=1e-5, atol=1e-6)


def test_track_last_loss_reports_the_last_batchs_loss_change():
    task = _task(noise_multiplier=0.0, sampling_rate=1.0, local_steps=2, lr=0.5)
    ctx, params, data = _setup()
    # with q = 1 and no noise both steps use the full data: recompute the last step's change
    _, metrics = dp_sgd_local_loop(ctx, params, data, task, track_last_loss=True)
    ctx_r, params_r, _ = _setup()
    one = _task(noise_multiplier=0.0, sampling_rate=1.0, local_steps=1, lr=0.5)
    dp_sgd_local_loop(ctx_r, params_r, data, one)
    x, y = data.records()
    expected = batch_loss(ctx.model, params, x, y) - batch_loss(ctx.model, params_r, x, y)
    assert metrics["last_step_loss_change"] == pytest.approx(expected, abs=1e-6)
    assert metrics["last_step_loss_change"] < 0  # a full-batch noiseless step descends


def test_clip_losses_is_total_and_bounded():
    losses = torch.tensor([-1.0, 0.5, 3.0, float("nan"), float("inf"), float("-inf")])
    assert clip_losses(losses, 2.0).tolist() == [0.0, 0.5, 2.0, 2.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="bound"):
        clip_losses(losses, -1.0)


@pytest.mark.parametrize("precision", ["float64", "native"])
def test_private_mean_loss_noise_has_the_claimed_std(precision):
    gen = torch.Generator().manual_seed(5)
    losses = torch.full((10,), 0.3)
    sigma, bound, denom = 1.3, 0.5, 4.0
    draws = torch.tensor(
        [
            private_mean_loss(
                losses,
                clip_bound=bound,
                noise_multiplier=sigma,
                denominator=denom,
                generator=gen,
                precision=precision,
            )
            for _ in range(4000)
        ],
        dtype=torch.float64,
    )
    clean = 10 * 0.3 / denom
    noise = draws - clean
    target = sigma * bound / denom
    # sample std within 5 % (n = 4000: the std of the estimate is ~1.1 %)
    assert float(noise.std()) == pytest.approx(target, rel=0.05)
    assert abs(float(noise.mean())) < 4 * target / math.sqrt(4000)


def test_private_mean_loss_rejects_bad_arguments():
    gen = torch.Generator()
    losses = torch.zeros(3)
    with pytest.raises(ValueError, match="denominator"):
        private_mean_loss(losses, clip_bound=1, noise_multiplier=1, denominator=0, generator=gen)
    with pytest.raises(ValueError, match="noise_multiplier"):
        private_mean_loss(losses, clip_bound=1, noise_multiplier=-1, denominator=1, generator=gen)
    with pytest.raises(ValueError, match="precision"):
        private_mean_loss(
            losses, clip_bound=1, noise_multiplier=1, denominator=1, generator=gen, precision="x"
        )
    with pytest.raises(ValueError, match="1-D"):
        private_mean_loss(
            torch.zeros(2, 2), clip_bound=1, noise_multiplier=1, denominator=1, generator=gen
        )


def test_noisy_loss_query_without_noise_is_the_clipped_mean_over_the_expected_batch():
    ctx, params, data = _setup()
    query = ClientTask.dp_sgd(
        0, 0, 0, 0.0, noise_multiplier=0.0, clip_norm=10.0, sampling_rate=1.0, invocations=1
    )
    noisy, raw = noisy_loss_query(ctx, params, data, query, with_raw_losses=True)
    assert raw.numel() == 40  # q = 1: every record
    assert noisy == pytest.approx(float(raw.clamp(0, 10).double().sum()) / 40.0)
