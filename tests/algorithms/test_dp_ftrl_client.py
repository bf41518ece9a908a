"""Client-level DP-FTRL (`raydpfl.algorithms.dp_ftrl_client`): the tree, the prefix noise
against the variance and covariance the tree predicts, the epoch schedule, the accounting
against dp-accounting and a closed form, and end-to-end runs (resume, bad input).

Statistical checks use bounds whose false-failure probability is stated beside them.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from scipy import stats

from raydpfl.algorithms.base import WeightedUpdateSum
from raydpfl.algorithms.dp_ftrl_client import (
    DPFTRLClientLevel,
    prefix_nodes,
    prefix_noise_variance,
    tree_node_for,
)
from raydpfl.config import ConfigError
from raydpfl.config.load import dump_config
from raydpfl.experiment.build import build_experiment, make_local_backend, run_experiment
from raydpfl.privacy.accounting.client_level import (
    ClientLevelCost,
    ClientLevelLedger,
    client_level_epsilon,
    rounds_history,
    tree_schedule,
)
from raydpfl.simulation.experiment import make_server
from raydpfl.simulation.outputs import RunWriter
from tests.conftest import small_config


def _algorithm(**kw) -> DPFTRLClientLevel:
    args = dict(
        num_clients=64,
        cohort_size=4,
        rounds=48,
        local_steps=2,
        lr=0.5,
        batch_size=16,
        clip_norm=0.5,
        noise_multiplier=1.5,
        seed=3,
    )
    args.update(kw)
    return DPFTRLClientLevel(**args)


# ---- the tree ---------------------------------------------------------------------------------
@pytest.mark.parametrize("t", range(1, 70))
def test_the_prefix_nodes_tile_the_prefix_and_end_with_the_node_completing_now(t):
    nodes = prefix_nodes(t)
    covered, start = [], 0
    for level, index in nodes:
        a = index * 2**level + 1  # node (level, index) covers [a, a + 2^level - 1]
        assert a == start + 1
        covered.extend(range(a, a + 2**level))
        start = a + 2**level - 1
    assert covered == list(range(1, t + 1))
    assert nodes[-1] == tree_node_for(t)
    assert len({lv for lv, _ in nodes}) == len(nodes) == bin(t).count("1")


def _prefix_noise(alg: DPFTRLClientLevel, epochs: int) -> np.ndarray:
    """(epochs, T, dim): K/η_s·(θ_t − θ_start), with no client (pure tree noise)."""
    t_max = alg.tree_rounds
    out = np.zeros((epochs, t_max, 64))
    params = {"w": torch.zeros(64, dtype=torch.float64)}
    for e in range(epochs):
        for t in range(t_max):
            r = e * t_max + t
            alg.plan(r, alg.select(r, alg.num_clients, np.random.default_rng(0)), np.array([]))
            new = alg.aggregate_sum(params, [], WeightedUpdateSum())
            out[e, t] = new["w"].numpy() * alg.cohort_size / alg.server_lr
    return out


def test_the_prefix_noise_has_the_variance_and_covariance_the_tree_predicts():
    alg = _algorithm(rounds=16 * 200)
    noise = _prefix_noise(alg, 200)  # 200 trees of 16 rounds, 64 coordinates
    std = alg.noise_multiplier * alg.clip_norm
    n = 200 * 64
    for t in range(1, 17):
        draws = noise[:, t - 1].ravel()
        want = math.sqrt(prefix_noise_variance(t, std))
        # (n-1)s^2/var ~ chi2(n-1): two-sided, false failure 1e-6 per t; KS p-value > 1e-6
        lo, hi = stats.chi2.ppf([0.5e-6, 1 - 0.5e-6], n - 1)
        assert (
            want * math.sqrt(lo / (n - 1)) <= draws.std(ddof=1) <= want * math.sqrt(hi / (n - 1))
        )
        assert stats.kstest(draws / want, "norm").pvalue > 1e-6
    # Prefixes 2 and 3 share the node [1, 2] (cov = std^2); prefixes 1 and 2 share none.
    a, b, c = (noise[:, i].ravel() for i in range(3))
    bound = stats.norm.ppf(1 - 0.5e-6) / math.sqrt(n)  # z bound on a sample correlation
    assert abs(np.corrcoef(a, b)[0, 1]) <= bound
    rho = std**2 / math.sqrt(prefix_noise_variance(2, std) * prefix_noise_variance(3, std))
    assert abs(np.corrcoef(b, c)[0, 1] - rho) <= 2 * bound


def test_without_noise_the_model_is_the_epoch_start_plus_the_scaled_prefix_sum():
    alg = _algorithm(noise_multiplier=0.0, server_lr=0.5, num_clients=12, cohort_size=4)
    assert alg.tree_rounds == 3
    theta = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    start, total = theta["w"].clone(), torch.zeros(2, dtype=torch.float64)
    for r in range(6):
        g = torch.tensor([r + 1.0, -1.0], dtype=torch.float64)
        acc = WeightedUpdateSum()
        acc.add({"w": g}, 1.0)
        alg.plan(r, alg.select(r, 12, np.random.default_rng(0)), np.array([]))
        if r % 3 == 0:  # the tree restarts from the released model
            start, total = theta["w"].clone(), torch.zeros(2, dtype=torch.float64)
        total += g
        theta = alg.aggregate_sum(theta, [], acc)
        torch.testing.assert_close(theta["w"], start + 0.5 * total / 4, rtol=0, atol=1e-12)


def test_every_client_joins_at_most_one_round_per_epoch():
    alg = _algorithm(num_clients=30, cohort_size=4, rounds=21)
    assert alg.tree_rounds == 7
    for epoch in range(3):
        cohorts = [alg.select(epoch * 7 + t, 30, np.random.default_rng(0)) for t in range(7)]
        joined = [c for cohort in cohorts for c in cohort]
        assert all(len(c) == 4 for c in cohorts)
        assert len(joined) == len(set(joined)) == 28  # two clients sit each epoch out


def test_each_epoch_is_charged_once_before_its_first_round_and_the_last_tree_is_shorter():
    alg = _algorithm(rounds=40)  # T = 16: trees of 16, 16 and 8 rounds
    costs = {r: alg.round_privacy_cost(r) for r in range(40)}
    charged = {r: c for r, c in costs.items() if c is not None}
    assert sorted(charged) == [0, 16, 32]
    assert [c.tree_rounds for c in charged.values()] == [16, 16, 8] == tree_schedule(40, 16)
    ledger = ClientLevelLedger("rdp", 1e-5, None, 64)
    for c in charged.values():
        ledger.charge(-1, c)
    assert ledger.rounds() == 40


# ---- accounting -------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma,rounds,tree", [(1.0, 500, 100), (2.5, 37, 16), (0.7, 3, 8)])
def test_tree_epsilon_matches_dp_accounting_and_stays_under_the_zcdp_bound(sigma, rounds, tree):
    k = 10
    cost = ClientLevelCost(sigma, "tree", tree * k, None, k, 1, tree)
    ours = client_level_epsilon(rounds_history(cost, rounds), 1e-5, "rdp")
    # zero-out adjacency: dp-accounting's REPLACE_SPECIAL (the only one it accepts here)
    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL
    )
    for t in tree_schedule(rounds, tree):
        acc.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(sigma, t))
    assert ours == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    # Closed form: each tree of T rounds is rho = ceil(log2(T+1)) / (2 sigma^2) zCDP, and
    # rho-zCDP implies (rho + 2 sqrt(rho ln(1/delta)), delta)-DP.
    rho = sum(math.ceil(math.log2(t + 1)) for t in tree_schedule(rounds, tree)) / (2 * sigma**2)
    assert ours <= rho + 2 * math.sqrt(rho * math.log(1e5)) + 1e-9


def test_tree_aggregation_refuses_pld_and_trees_longer_than_an_epoch():
    with pytest.raises(ValueError, match="RDP-only"):
        client_level_epsilon([ClientLevelCost(1.0, "tree", 100, None, 10, 1, 10)], 1e-5, "pld")
    with pytest.raises(ValueError, match="tree_rounds"):
        ClientLevelCost(1.0, "tree", 100, None, 10, 1, 11)


# ---- end to end -------------------------------------------------------------------------------
def _config(rounds=7, **runtime):
    return small_config(
        experiment__algorithm={"name": "dp_ftrl_client", "rounds": rounds, "clients_per_round": 4},
        experiment__privacy={"epsilon": 50.0, "delta": 1e-3, "noise_multiplier": None},
        runtime=runtime or {},
    )


def test_a_dp_ftrl_run_spends_its_calibrated_budget_and_states_the_mechanism():
    summary = run_experiment(build_experiment(_config()), None)
    assert summary["rounds_completed"] == 7
    assert summary["epsilon_unit"] == "client"
    assert 49.0 < summary["epsilon_max"] <= 50.0
    assert summary["privacy"]["noise_calibrated"] is True
    assert "SingleEpochTreeAggregationDpEvent" in summary["privacy"]["sampling"]
    assert "zero-out" in summary["privacy"]["adjacency"]


def test_an_interrupted_dp_ftrl_run_resumes_mid_epoch_to_the_same_model(tmp_path):
    config = _config(backend="local", seed=0, progress=False, checkpoint_every=2)
    reference = run_experiment(build_experiment(config), None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    exp = build_experiment(config)
    writer = RunWriter(run_dir)
    writer.write_config(dump_config(config))
    server = make_server(exp, writer)
    server.checkpoint_start()
    with make_local_backend(exp) as backend:
        for r in range(5):  # checkpoint after round 4 (epoch 2, round 1 of its tree)
            assert server.run_round(backend, r)
    resumed = run_experiment(build_experiment(config), run_dir, resume=True)
    assert resumed["resumed_from_round"] == 4
    assert resumed["model_sha256"] == reference["model_sha256"]
    assert resumed["ledger_sha256"] == reference["ledger_sha256"]


@pytest.mark.ray
def test_ray_gives_the_local_backends_dp_ftrl_model_bit_for_bit():
    ray = pytest.importorskip("ray")
    local = run_experiment(build_experiment(_config()), None)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        on_ray = run_experiment(
            build_experiment(_config(backend="ray", workers=2, progress=False)), None
        )
    finally:
        if started:
            ray.shutdown()
    assert on_ray["model_sha256"] == local["model_sha256"]
    assert on_ray["epsilon_max"] == local["epsilon_max"]


@pytest.mark.parametrize(
    "algorithm,privacy,field",
    [
        ({"clients_per_round": 13}, {}, "experiment.algorithm.clients_per_round"),
        ({}, {"accountant": "pld"}, "experiment.privacy.accountant"),
        ({"options": {"server_lr": 0.0}}, {}, "experiment.algorithm.options.server_lr"),
        (
            {"options": {"update_clip_norm": -1.0}},
            {},
            "experiment.algorithm.options.update_clip_norm",
        ),
        ({}, {"delta": 0.1}, "experiment.privacy.delta"),
    ],
)
def test_bad_dp_ftrl_input_is_one_error_naming_the_field(algorithm, privacy, field):
    with pytest.raises(ConfigError) as err:
        build_experiment(
            small_config(
                experiment__algorithm={"name": "dp_ftrl_client", **algorithm},
                experiment__privacy={"delta": 1e-3, **privacy},
            )
        )
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_secure_noise_mode_draws_the_tree_noise_from_the_os():
    config = small_config(
        experiment__algorithm={"name": "dp_ftrl_client", "rounds": 3, "clients_per_round": 4},
        experiment__privacy={
            "epsilon": 50.0,
            "delta": 1e-3,
            "noise_multiplier": 1.0,
            "secure_noise": True,
        },
    )
    a = run_experiment(build_experiment(config), None)
    b = run_experiment(build_experiment(config), None)
    assert a["privacy"]["noise_source"].startswith("os.urandom") or "urandom" in str(
        a["privacy"]["noise_source"]
    )
    assert a["model_sha256"] != b["model_sha256"]  # fresh OS noise each run
    assert a["epsilon_max"] == b["epsilon_max"]
