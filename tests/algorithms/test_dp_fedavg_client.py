"""Client-level DP-FedAvg's math (`raydpfl.algorithms.dp_fedavg_client`): the aggregate
noise against its claimed distribution, the clipping bound on one client's influence,
the distributed-noise split and the client-sampling rate.

Statistical checks use bounds whose false-failure probability is stated beside them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from raydpfl.algorithms.base import ClientContext, ClientData, WeightedUpdateSum
from raydpfl.algorithms.dp_fedavg_client import (
    DPFedAvgClientLevel,
    clip_update,
    noise_generator,
    update_norm,
)
from raydpfl.privacy.noise import secure_noise

DIM, CLASSES = 6, 3


def _algorithm(**kw) -> DPFedAvgClientLevel:
    args = dict(
        num_clients=40,
        sampling="poisson",
        sampling_rate=0.25,
        local_steps=3,
        lr=0.5,
        batch_size=16,
        clip_norm=0.7,
        noise_multiplier=1.3,
        seed=11,
    )
    args.update(kw)
    return DPFedAvgClientLevel(**args)


def _params() -> dict[str, torch.Tensor]:
    return {"weight": torch.zeros(CLASSES, DIM), "bias": torch.zeros(CLASSES)}


def _client(seed: int, n: int = 64, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, DIM, generator=g) * scale
    y = torch.randint(0, CLASSES, (n,), generator=g)
    model = torch.nn.Linear(DIM, CLASSES)
    model.requires_grad_(False)
    ctx = ClientContext(
        model=model,
        clipping=None,
        generator=torch.Generator().manual_seed(seed),
        device=torch.device("cpu"),
    )
    return ctx, ClientData(client_id=seed, x=x, y=y, indices=torch.arange(n))


def _noise_draws(alg: DPFedAvgClientLevel, rounds: int) -> np.ndarray:
    """The server's aggregate noise / E, `rounds` rounds with no client (empty cohorts)."""
    out = []
    params = {"w": torch.zeros(64)}
    for r in range(rounds):
        alg.plan(r, [], np.array([]))
        new = alg.aggregate_sum(params, [], WeightedUpdateSum())
        out.append(new["w"].double().numpy())
    return np.concatenate(out)


def _chi2_std_bounds(n: int, std: float, alpha: float) -> tuple[float, float]:
    """Two-sided bounds on the sample std of n i.i.d. N(0, std²) draws (false failure
    probability alpha): (n−1)s²/std² ~ χ²(n−1)."""
    lo, hi = stats.chi2.ppf([alpha / 2, 1 - alpha / 2], n - 1)
    return std * math.sqrt(lo / (n - 1)), std * math.sqrt(hi / (n - 1))


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_aggregate_noise_is_gaussian_with_std_sigma_s_over_the_expected_cohort(sampling):
    kw = (
        {"sampling_rate": 0.25}
        if sampling == "poisson"
        else {"sampling_rate": None, "cohort_size": 8}
    )
    alg = _algorithm(sampling=sampling, **kw)
    draws = _noise_draws(alg, 500)  # 32,000 draws
    expected_std = alg.noise_multiplier * alg.clip_norm / alg.expected_cohort
    assert alg.expected_cohort == (10.0 if sampling == "poisson" else 8.0)
    # False-failure probability of each check: 1e-6 (χ² bounds, z bound, KS p-value).
    lo, hi = _chi2_std_bounds(draws.size, expected_std, 1e-6)
    assert lo <= draws.std(ddof=1) <= hi
    assert abs(draws.mean()) <= stats.norm.ppf(1 - 0.5e-6) * expected_std / math.sqrt(draws.size)
    assert stats.kstest(draws / expected_std, "norm").pvalue > 1e-6


def test_the_noise_stream_is_reproducible_per_round_and_independent_across_rounds():
    a = _noise_draws(_algorithm(), 3).reshape(3, -1)
    b = _noise_draws(_algorithm(), 3).reshape(3, -1)
    assert np.array_equal(a, b)  # a function of (seed, round) only
    assert not np.array_equal(a[0], a[1])
    other_seed = _noise_draws(_algorithm(seed=12), 1)
    assert not np.array_equal(a[0], other_seed)
    # Rounds drawn out of order give the same noise for each round.
    alg = _algorithm()
    params = {"w": torch.zeros(64)}
    alg.plan(2, [], np.array([]))
    third = alg.aggregate_sum(params, [], WeightedUpdateSum())["w"].double().numpy()
    assert np.array_equal(third, a[2])


def test_secure_mode_draws_the_aggregate_noise_from_the_os():
    assert secure_noise.is_secure(noise_generator(0, 0, secure=True))
    alg = _algorithm()
    alg.secure_noise = True
    first, second = _noise_draws(alg, 1), _noise_draws(alg, 1)
    assert not np.array_equal(first, second)  # not reproducible, by design
    std = alg.noise_multiplier * alg.clip_norm / alg.expected_cohort
    assert 0.5 * std < first.std() < 2 * std


@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
def test_a_client_far_above_s_never_moves_the_aggregate_by_more_than_s_over_e(clipping):
    s = 0.7
    alg = _algorithm(noise_multiplier=0.0, clip_norm=s, lr=50.0, clipping=clipping)
    ctx, data = _client(1, scale=30.0)  # big inputs, big lr: a huge raw update
    params = _params()
    result = alg.local_update(
        ctx, {n: t.clone() for n, t in params.items()}, data, alg.plan(0, [1], np.array([64]))[0]
    )
    assert result.metrics["update_norm"] > 100 * s and result.metrics["update_clipped"] == 1.0
    assert update_norm(result.update) <= s * (1 + 1e-6)
    if clipping == "per_layer":  # S/sqrt(L) on each of the L = 2 tensors
        for t in result.update.values():
            assert update_norm({"t": t}) <= s / math.sqrt(2) * (1 + 1e-6)
    # With ordinary clients beside it, the outlier moves the mean by at most S / E.
    others = WeightedUpdateSum()
    for seed in (2, 3, 4):
        c, d = _client(seed)
        r = alg.local_update(
            c, {n: t.clone() for n, t in params.items()}, d, alg.plan(0, [seed], np.array([64]))[0]
        )
        others.add(r.update, r.weight)
    without = alg.aggregate_sum(params, [], others)
    others.add(result.update, result.weight)
    with_outlier = alg.aggregate_sum(params, [], others)
    moved = update_norm({n: with_outlier[n] - without[n] for n in params})
    assert 0 < moved <= s / alg.expected_cohort * (1 + 1e-5)


def test_clip_update_leaves_small_updates_alone_and_scales_large_ones_onto_the_ball():
    small = {"a": torch.tensor([0.3, 0.4])}  # norm 0.5
    assert torch.equal(clip_update(small, 1.0)["a"], small["a"])
    big = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.0])}
    clipped = clip_update(big, 1.0)
    assert update_norm(clipped) == pytest.approx(1.0)
    assert torch.allclose(clipped["a"], torch.tensor([0.6, 0.8]))
    with pytest.raises(ValueError, match="clip_norm"):
        clip_update(big, 0.0)


def test_distributed_noise_gives_each_client_a_1_over_k_share_and_the_server_adds_none():
    k = 8
    alg = _algorithm(
        sampling="fixed",
        sampling_rate=None,
        cohort_size=k,
        noise="distributed",
        lr=1e-30,
        clip_norm=1.0,
        noise_multiplier=2.0,
    )
    params = _params()
    draws = []
    for seed in range(400):
        ctx, data = _client(seed)
        task = alg.plan(0, [seed], np.array([64]))[0]
        r = alg.local_update(ctx, {n: t.clone() for n, t in params.items()}, data, task)
        draws.append(torch.cat([t.flatten() for t in r.update.values()]).double().numpy())
    x = np.concatenate(draws)  # 400 clients × 21 entries; training moved nothing (lr ≈ 0)
    share = alg.noise_multiplier * alg.clip_norm / math.sqrt(k)
    lo, hi = _chi2_std_bounds(x.size, share, 1e-6)  # false failure 1e-6
    assert lo <= x.std(ddof=1) <= hi
    # K shares sum to σ²S²: the server adds nothing more (zero sum in, zero out).
    zero = WeightedUpdateSum()
    zero.add({n: torch.zeros_like(t) for n, t in params.items()}, 1.0)
    out = alg.aggregate_sum(params, [], zero)
    assert all(torch.count_nonzero(t) == 0 for t in out.values())


def test_distributed_noise_refuses_poisson_sampling():
    with pytest.raises(ValueError, match="distributed noise needs fixed-size client sampling"):
        _algorithm(noise="distributed")


def test_poisson_cohorts_have_rate_q_and_fixed_cohorts_have_size_k():
    alg = _algorithm(sampling_rate=0.25)
    sizes = [len(alg.select(r, 40, np.random.default_rng(r))) for r in range(2000)]
    # Binomial(40·2000, q): mean within 5 standard errors (false failure < 1e-6).
    n = 40 * 2000
    assert abs(sum(sizes) - 0.25 * n) <= 5 * math.sqrt(n * 0.25 * 0.75)
    assert min(sizes) < 10 < max(sizes)  # the size varies
    fixed = _algorithm(sampling="fixed", sampling_rate=None, cohort_size=7)
    cohort = fixed.select(0, 40, np.random.default_rng(0))
    assert len(set(cohort)) == 7 and cohort == sorted(cohort)
    secure = _algorithm(sampling="fixed", sampling_rate=None, cohort_size=7)
    secure.secure_noise = True
    assert len(set(secure.select(0, 40, np.random.default_rng(0)))) == 7


def test_the_round_cost_is_one_population_level_charge_and_tasks_declare_none():
    alg = _algorithm()
    cost = alg.round_privacy_cost(3)
    assert (
        cost.noise_multiplier,
        cost.sampling,
        cost.population,
        cost.sampling_rate,
        cost.steps,
    ) == (1.3, "poisson", 40, 0.25, 1)
    assert all(t.privacy_cost is None for t in alg.plan(3, [1, 2], np.array([5] * 40)))
    assert alg.privacy_unit == "client"
