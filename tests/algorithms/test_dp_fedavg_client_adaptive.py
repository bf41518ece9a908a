"""Adaptive clipping (Andrew et al. 2021) and server optimizers of client-level DP-FedAvg.

- the noise split: the update and count releases compose to the charged Gaussian, checked
  against dp-accounting's RDP accountant (an independent computation);
- the count noise and the update noise have their claimed std (statistical bounds with a
  stated false-failure probability);
- S converges to the target quantile of the update norms, and the round's S reaches the
  clients in their tasks;
- momentum and FedAdam against hand-computed steps; checkpointed state round-trips;
- bad input refused in one line naming the field, before any training.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from scipy import stats

from raydpfl.algorithms.base import ClientTask, WeightedUpdateSum
from raydpfl.algorithms.dp_fedavg_client import (
    DPFedAvgClientLevel,
    geometric_clip_update,
    noisy_unclipped_fraction,
    server_step,
    update_noise_multiplier,
)
from raydpfl.config import ConfigError
from raydpfl.experiment.build import build_experiment, run_experiment
from tests.algorithms.test_dp_fedavg_client import _client
from tests.conftest import small_config


def _algorithm(**kw) -> DPFedAvgClientLevel:
    args = dict(
        num_clients=200,
        sampling="poisson",
        sampling_rate=0.1,
        local_steps=2,
        lr=0.5,
        batch_size=16,
        clip_norm=1.0,
        noise_multiplier=1.0,
        seed=5,
    )
    args.update(kw)
    return DPFedAvgClientLevel(**args)


def _rdp_epsilon(events: list[dp_accounting.DpEvent], delta: float = 1e-5) -> float:
    acc = dp_accounting.rdp.RdpAccountant()
    for e in events:
        acc.compose(e)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("z,count_std", [(1.0, 1.0), (0.8, 2.5), (2.0, 1.01)])
def test_the_update_and_count_releases_compose_to_the_charged_gaussian(z, count_std):
    z_update = update_noise_multiplier(z, count_std)
    assert z_update > z  # the update pays for the count's share
    assert z_update**-2 + (2 * count_std) ** -2 == pytest.approx(z**-2, rel=1e-12)
    # Independent check: dp-accounting composes the two Gaussians (count: sensitivity 1/2,
    # noise std count_std, so multiplier 2*count_std) to the same epsilon as one with z.
    two = _rdp_epsilon(
        [dp_accounting.GaussianDpEvent(z_update)] * 50
        + [dp_accounting.GaussianDpEvent(2 * count_std)] * 50
    )
    one = _rdp_epsilon([dp_accounting.GaussianDpEvent(z)] * 50)
    assert two == pytest.approx(one, rel=1e-6)


def test_a_count_noise_too_small_for_the_budget_is_refused():
    with pytest.raises(ValueError, match="clip_count_stddev"):
        update_noise_multiplier(1.0, 0.5)
    assert update_noise_multiplier(0.0, 0.1) == 0.0  # no noise at all: nothing to split


def test_the_geometric_update_moves_s_toward_the_target_quantile():
    # Andrew et al.'s update: more unclipped than gamma -> S shrinks, fewer -> S grows.
    assert geometric_clip_update(2.0, 0.9, 0.5, 0.2) == pytest.approx(2.0 * math.exp(-0.08))
    assert geometric_clip_update(2.0, 0.1, 0.5, 0.2) == pytest.approx(2.0 * math.exp(0.08))
    assert geometric_clip_update(2.0, 0.5, 0.5, 0.2) == 2.0
    # With no noise, S tracks the gamma-quantile of fixed client norms.
    norms = np.linspace(0.5, 10.0, 100)
    for gamma in (0.3, 0.5, 0.8):
        s = 1.0
        for _ in range(400):
            within = float((norms <= s).sum())
            s = geometric_clip_update(
                s, noisy_unclipped_fraction(within, norms.size, 0.0, norms.size), gamma, 0.2
            )
        assert abs((norms <= s).mean() - gamma) <= 0.02


def test_noisy_fraction_centres_the_bits():
    # (sum(b - 1/2) + noise) / E + 1/2: with E equal to the count and no noise, the fraction.
    assert noisy_unclipped_fraction(7.0, 10, 0.0, 10.0) == pytest.approx(0.7)
    assert noisy_unclipped_fraction(0.0, 0, 2.0, 10.0) == pytest.approx(0.7)


def test_count_and_update_noise_have_their_claimed_std():
    """Empty cohorts: the update is pure noise z_update*S/E and S moves by the count noise
    alone, log(S_{t+1}/S_t) = -clip_lr * (noise / E + 1/2 - gamma) (gamma = 1/2)."""
    alg = _algorithm(adaptive_clipping=True, clip_count_stddev=3.0, clip_lr=0.01)
    e = alg.expected_cohort
    params = {"w": torch.zeros(32)}
    update_draws, count_draws = [], []
    for r in range(1500):
        alg.plan(r, [], np.array([]))
        s = alg.current_clip_norm
        new = alg.aggregate_sum(params, [], WeightedUpdateSum())
        update_draws.append(new["w"].double().numpy() / (alg.update_noise_multiplier * s / e))
        count_draws.append(-math.log(alg.current_clip_norm / s) / alg.clip_lr * e / 3.0)
        row = alg.after_round(r, {})
        assert row["update_clip_norm"] == s
        assert row["next_update_clip_norm"] == alg.current_clip_norm
    for draws in (np.concatenate(update_draws), np.array(count_draws)):
        n = draws.size
        # (n-1)s^2 ~ chi2(n-1): two-sided bounds, false failure 1e-6; KS p-value > 1e-6.
        lo, hi = stats.chi2.ppf([0.5e-6, 1 - 0.5e-6], n - 1)
        assert math.sqrt(lo / (n - 1)) <= draws.std(ddof=1) <= math.sqrt(hi / (n - 1))
        assert stats.kstest(draws, "norm").pvalue > 1e-6
    # the count noise and the update noise come from different streams
    assert not np.allclose(np.array(count_draws[:32]), update_draws[0][:32])


def test_the_rounds_s_reaches_the_clients_and_bounds_their_updates():
    alg = _algorithm(adaptive_clipping=True, clip_norm=5.0)
    alg.current_clip_norm = 0.05
    task = alg.plan(0, [3], np.array([64] * 200))[0]
    assert task.extras["update_clip_norm"] == 0.05
    ctx, data = _client(3)
    result = alg.local_update(
        ctx, {"weight": torch.zeros(3, 6), "bias": torch.zeros(3)}, data, task
    )
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in result.update.values()))
    assert norm <= 0.05 * (1 + 1e-6)
    assert result.metrics["update_within_clip"] == 0.0
    assert result.metrics["update_clipped"] == 1.0


def _one_client_sum(update: dict[str, torch.Tensor]) -> WeightedUpdateSum:
    total = WeightedUpdateSum()
    total.add(update, 1.0, {"update_within_clip": 1.0})
    return total


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adagrad", "adam", "yogi"])
def test_server_optimizers_match_hand_computed_steps(optimizer):
    alg = _algorithm(
        noise_multiplier=0.0,
        server_optimizer=optimizer,
        server_lr=0.5,
        server_momentum=0.8,
        server_beta2=0.9,
        server_adam_eps=0.01,
    )
    params = {"w": torch.tensor([1.0, -2.0], dtype=torch.float64)}
    deltas = [
        torch.tensor([0.3, 0.1], dtype=torch.float64),
        torch.tensor([-0.2, 0.4], dtype=torch.float64),
    ]
    theta, m, v = (
        params["w"].clone(),
        torch.zeros(2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.float64),
    )
    for r, d in enumerate(deltas):
        alg.plan(r, [0], np.array([10] * 200))
        params = alg.aggregate_sum(params, [], _one_client_sum({"w": d}))
        mean = d / alg.expected_cohort
        if optimizer == "sgd":
            theta = theta + 0.5 * mean
        elif optimizer == "momentum":
            m = 0.8 * m + mean
            theta = theta + 0.5 * m
        else:
            m = 0.8 * m + 0.2 * mean
            sq = mean * mean
            if optimizer == "adagrad":
                v = v + sq
            elif optimizer == "adam":
                v = 0.9 * v + 0.1 * sq
            else:  # yogi: v - (1 - beta2) sq sign(v - sq)
                v = v - 0.1 * sq * torch.sign(v - sq)
            theta = theta + 0.5 * m / (v.sqrt() + 0.01)
        torch.testing.assert_close(params["w"], theta, rtol=1e-12, atol=1e-15)


def test_plain_sgd_at_rate_one_is_the_unchanged_dp_fedavg_step():
    g = {"w": torch.randn(5, dtype=torch.float64)}
    d = {"w": torch.randn(5, dtype=torch.float64)}
    assert torch.equal(server_step(g, d, {}, optimizer="sgd", lr=1.0)["w"], g["w"] + d["w"])


def test_server_momentum_and_the_adaptive_s_survive_a_checkpoint():
    def run(alg, rounds, params):
        for r in rounds:
            alg.plan(r, [0], np.array([10] * 200))
            params = alg.aggregate_sum(params, [], _one_client_sum({"w": torch.ones(3) * (r + 1)}))
        return params

    kw = dict(adaptive_clipping=True, server_optimizer="adam", server_lr=0.1)
    start = {"w": torch.zeros(3)}
    straight = run(_algorithm(**kw), range(4), start)
    first = _algorithm(**kw)
    half = run(first, range(2), start)
    state, tensors = first.state_dict(), first.tensor_state()
    assert set(tensors) == {"server_m/w", "server_v/w"}
    second = _algorithm(**kw)
    second.load_state_dict(state)
    second.load_tensor_state(tensors)
    assert second.current_clip_norm == first.current_clip_norm != 1.0
    assert torch.equal(run(second, range(2, 4), half)["w"], straight["w"])


@pytest.mark.parametrize(
    "options,privacy,field",
    [
        (
            {"adaptive_clipping": True, "sampling": "fixed", "noise": "distributed"},
            {},
            "experiment.algorithm.options.adaptive_clipping",
        ),
        ({"target_quantile": 1.0}, {}, "experiment.algorithm.options.target_quantile"),
        ({"clip_lr": 0.0}, {}, "experiment.algorithm.options.clip_lr"),
        ({"clip_count_stddev": -1.0}, {}, "experiment.algorithm.options.clip_count_stddev"),
        # sigma 4 needs a count noise std above 2: 0.05 * E = 0.25 is far too small
        (
            {"adaptive_clipping": True},
            {"noise_multiplier": 4.0},
            "experiment.algorithm.options.clip_count_stddev",
        ),
        ({"server_optimizer": "lamb"}, {}, "experiment.algorithm.options.server_optimizer"),
        ({"server_lr": 0.0}, {}, "experiment.algorithm.options.server_lr"),
        ({"server_momentum": 1.0}, {}, "experiment.algorithm.options.server_momentum"),
    ],
)
def test_bad_adaptive_or_server_options_are_one_error_naming_the_field(options, privacy, field):
    with pytest.raises(ConfigError) as err:
        build_experiment(
            small_config(
                experiment__algorithm={"name": "dp_fedavg_client", "options": options},
                experiment__privacy={"delta": 1e-3, **privacy},
            )
        )
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_an_adaptive_momentum_run_spends_what_the_fixed_one_does_and_says_how():
    def config(**opts):
        return small_config(
            experiment__algorithm={
                "name": "dp_fedavg_client",
                "rounds": 4,
                "options": {"sampling": "poisson", "client_sampling_rate": 0.5, **opts},
            },
            experiment__privacy={"epsilon": 50.0, "delta": 1e-3, "noise_multiplier": 0.5},
        )

    fixed = run_experiment(build_experiment(config()), None)
    adaptive = run_experiment(
        build_experiment(
            config(adaptive_clipping=True, clip_count_stddev=2.0, server_optimizer="momentum")
        ),
        None,
    )
    # the same charged Gaussian per round: the same epsilon, a different model
    assert adaptive["epsilon_max"] == fixed["epsilon_max"]
    assert adaptive["model_sha256"] != fixed["model_sha256"]
    statement = adaptive["privacy"]["adaptive_clipping"]
    assert statement["clip_count_stddev"] == 2.0
    assert statement["update_noise_multiplier"] == pytest.approx(update_noise_multiplier(0.5, 2.0))
    assert adaptive["privacy"]["server_optimizer"] == "momentum"
    assert fixed["privacy"]["adaptive_clipping"] is None


def test_a_task_without_a_clip_norm_uses_the_built_one():
    alg = _algorithm(clip_norm=0.01)
    ctx, data = _client(1)
    task = ClientTask(client_id=1, round_idx=0, local_steps=2, lr=0.5, batch_size=16)
    result = alg.local_update(
        ctx, {"weight": torch.zeros(3, 6), "bias": torch.zeros(3)}, data, task
    )
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in result.update.values()))
    assert norm <= 0.01 * (1 + 1e-6)
