"""DPFL-BCS's server and client halves, its baselines and its builder (issue 6)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq

from raydpfl.algorithms.base import ClientContext, ClientData, ClientResult
from raydpfl.config import ConfigError, config_from_dict
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.models import build_model
from raydpfl.papers.dpfl_bcs.algorithm import DpflBcs, laplace_noise
from raydpfl.papers.dpfl_bcs.estimation import TABLE_III
from raydpfl.papers.dpfl_bcs.sampling import inclusion_probabilities
from tests.conftest import release_scale, with_release_scale
from tests.papers.dpfl_bcs.dpfl_bcs_helpers import BCS_CLIENTS, bcs_args, bcs_config

N = BCS_CLIENTS


def _algo(**kw) -> DpflBcs:
    return DpflBcs(**bcs_args(**kw))


def _independent_rho(eps: float, delta: float) -> float:
    # Solve ε = ρ + 2√(ρ ln 1/δ) numerically (not the closed form the code uses).
    return brentq(lambda r: r + 2 * math.sqrt(r * math.log(1 / delta)) - eps, 1e-12, eps)


def test_zcdp_calibration_matches_an_independent_computation():
    a = _algo()
    for c in np.flatnonzero(a.tplan > 0):
        rho = _independent_rho(a.eps[c], a.deltas[c])
        expected = math.sqrt(a.tplan[c] / (2 * rho))  # σ/Δ = √(T_n/(2ρ_n))
        assert a.multiplier[c] == pytest.approx(expected, rel=1e-6)


def test_paper_alg2_and_laplace_calibration_match_the_closed_forms():
    a = _algo(calibration="paper_alg2")
    for c in np.flatnonzero(a.tplan > 0):
        t_n, eps, delta = a.tplan[c], a.eps[c], a.deltas[c]
        if eps / t_n < 1:  # Theorem 1 with (ε/T_n, δ/T_n)
            expected = math.sqrt(2 * math.log(1.25 * t_n / delta)) * t_n / eps
            assert a.multiplier[c] == pytest.approx(expected, rel=1e-6)
        cost = a.cost_of(int(c))
        assert cost.mechanism == "approx_dp"
        assert cost.epsilon == pytest.approx(eps / t_n, rel=1e-6)
    lap = _algo(mechanism="laplace")
    for c in np.flatnonzero(lap.tplan > 0):
        assert lap.multiplier[c] == pytest.approx(lap.tplan[c] / lap.eps[c], rel=1e-6)
        assert lap.cost_of(int(c)).mechanism == "laplace"


def test_task_noise_uses_the_stage_sensitivity():
    a = _algo()
    sizes = a.sizes
    cohort = [int(c) for c in np.flatnonzero(a.tplan > 0)[:2]]
    lr = a.lr_at(0)
    assert lr == pytest.approx(0.1 / (1 + 1 / 200))
    for task in a.plan(0, cohort, sizes):  # stage 1: Δg' = 2η(B + Θ)/D_n (Eq. 13)
        delta_g = 2 * lr * (2.0 + math.log(10)) / sizes[task.client_id]
        assert release_scale(task) == pytest.approx(a.multiplier[task.client_id] * delta_g)
        assert task.extras["stage1"] == 1.0
    for task in a.plan(5, cohort, sizes):  # stage 2: Δg = 2ηB/D_n
        delta_g = 2 * a.lr_at(5) * 2.0 / sizes[task.client_id]
        assert release_scale(task) == pytest.approx(a.multiplier[task.client_id] * delta_g)
        assert task.extras["stage1"] == 0.0


def _client(algo: DpflBcs, n: int | None = None, scale: float = 5.0, features: int = 20):
    """Client 0's records (as many as the algorithm planned for it, unless `n`)."""
    n = int(algo.sizes[0]) if n is None else n
    torch.manual_seed(0)
    model = build_model("bcs_linear", (features,), 3)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x = torch.randn(n, features) * scale
    y = torch.randint(0, 3, (n,))
    data = ClientData(0, x, y, torch.arange(n))
    return model, params, data


def _ctx(model, seed: int = 1) -> ClientContext:
    return ClientContext(model, None, torch.Generator().manual_seed(seed), torch.device("cpu"))


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_client_clips_per_sample_in_the_mechanisms_norm(mechanism):
    a = _algo(mechanism=mechanism, clip_norm=0.5)

    planned = a.plan(5, [0], a.sizes)[0]
    for n, exact in ((40, False), (1, True)):
        # the release declared for n records: the platform checks Δ = 2ηB/n
        task = with_release_scale(planned, 0.0, sensitivity=2 * planned.lr * 0.5 / n)
        model, params, data = _client(a, n=n, scale=50.0)
        res = a.local_update(_ctx(model), dict(params), data, task)
        flat = torch.cat([-t.reshape(-1) for t in res.update.values()])
        norm = float(flat.abs().sum() if mechanism == "laplace" else flat.norm())
        assert norm <= task.lr * 0.5 * (1 + 1e-5)  # ‖η·mean clip(g)‖ ≤ ηB
        if exact:  # one large-gradient record: clipped to exactly B in the mechanism's norm
            assert norm == pytest.approx(task.lr * 0.5, rel=1e-5)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_client_noise_has_the_calibrated_law(mechanism):
    a = _algo(mechanism=mechanism)
    model, params, data = _client(a, features=1000)

    base = a.plan(0, [0], a.sizes)[0]
    clean = a.local_update(_ctx(model), dict(params), data, with_release_scale(base, 0.0))
    scale = 0.3
    noisy = a.local_update(
        _ctx(model),
        dict(params),
        data,
        with_release_scale(base, scale),
    )
    z = torch.cat([(noisy.update[k] - clean.update[k]).reshape(-1) for k in clean.update])
    z = z.double()
    assert z.numel() == 3003
    if mechanism == "laplace":  # Laplace(b): mean |z| = b, variance 2b²
        gen = torch.Generator().manual_seed(3)
        big = laplace_noise(torch.Size([200_000]), scale, gen, "cpu").double()
        assert float(big.abs().mean()) == pytest.approx(scale, rel=0.01)
        assert float(big.var()) == pytest.approx(2 * scale**2, rel=0.02)
        assert float(z.abs().mean()) == pytest.approx(scale, rel=0.06)
    else:
        assert float(z.std()) == pytest.approx(scale, rel=0.05)
        assert abs(float(((z / scale) ** 4).mean()) - 3.0) < 0.5  # Gaussian kurtosis
    # The stage-1 loss reports carry the same coordinate noise divided by η (§4.5).
    assert "loss_before" in noisy.metrics and "loss_after" in clean.metrics
    assert clean.metrics["loss_before"] <= math.log(10) + 1e-9


def test_selection_frequencies_follow_the_plan():
    a = _algo(rounds=40, stage1_rounds=3)
    a.k = 3
    rng = np.random.default_rng(1)
    draws = 4000
    counts = np.zeros(N)
    for _ in range(draws):
        a.stage_counts[:] = 0  # keep every client available: measure π_n = K·p_n alone
        chosen = a.select(0, N, rng)
        assert len(chosen) == len(set(chosen)) == min(3, int((a.tplan > 0).sum()))
        counts[chosen] += 1
    target = inclusion_probabilities(a.probs, 3)
    se = np.sqrt(target * (1 - target) / draws)
    assert np.all(np.abs(counts / draws - target) <= 5 * se + 1e-12)
    assert np.all(counts[a.tplan == 0] == 0)


def test_exhausted_or_refused_clients_are_never_selected_again():
    a = _algo()
    a.excluded[:] = True
    a.excluded[np.flatnonzero(a.tplan > 0)[0]] = False
    rng = np.random.default_rng(0)
    keep = int(np.flatnonzero(~a.excluded)[0])
    assert a.select(0, N, rng) == [keep]
    # A planned client whose task the server refused is excluded for good.
    b = _algo()
    cohort = [int(c) for c in np.flatnonzero(b.tplan > 0)[:2]]
    tasks = b.plan(0, cohort, b.sizes)
    b.aggregate({"w": torch.zeros(1)}, tasks[:1], [])
    assert b.excluded[cohort[1]] and not b.excluded[cohort[0]]


def test_state_dict_round_trip():
    a = _algo()
    a.loss_before[0, 1] = 0.5
    a.total_counts[2] = 3
    b = _algo()
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(b.total_counts, a.total_counts)
    np.testing.assert_array_equal(np.isnan(b.loss_before), np.isnan(a.loss_before))
    np.testing.assert_allclose(b.multiplier, a.multiplier)


# ---- end to end -----------------------------------------------------------------------
def _config(name: str = "dpfl_bcs", **bcs) -> dict:
    return bcs_config(name, experiment__algorithm__dpfl_bcs=bcs)


def test_aggregation_rules():
    a = _algo(aggregation="weiavg")
    results = [ClientResult(c, {"w": torch.full((4,), float(c + 1))}, 1.0, 10) for c in (0, 1)]
    w = a.eps[[0, 1]] / a.eps[[0, 1]].sum()
    out = a._combine(results)["w"]
    torch.testing.assert_close(out, torch.full((4,), float(w[0] * 1 + w[1] * 2)))
    mean = _algo()._combine(results)["w"]
    torch.testing.assert_close(mean, torch.full((4,), 1.5))  # equal 1/|S_t| weights
    pfa = _algo(aggregation="pfa")
    pub, priv = [int(np.flatnonzero(pfa.pfa_public)[0]), int(np.flatnonzero(~pfa.pfa_public)[0])]
    res = [
        ClientResult(pub, {"w": torch.tensor([1.0, 0.0, 0.0])}, 1.0, 10),
        ClientResult(priv, {"w": torch.tensor([2.0, 3.0, 0.0])}, 1.0, 10),
    ]
    out = pfa._combine(res)["w"]
    wp = pfa.eps[[pub, priv]] / pfa.eps[[pub, priv]].sum()
    # The private update is projected onto the public span (the first axis): [2, 0, 0].
    expected = torch.tensor([wp[0] + 2 * wp[1], 0.0, 0.0], dtype=torch.float32)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    ("mechanism", "calibration"),
    [("gaussian", "zcdp"), ("gaussian", "paper_alg2"), ("laplace", "zcdp")],
)
def test_no_client_ever_exceeds_its_budget_end_to_end(mechanism, calibration):
    exp = build_experiment(
        config_from_dict(_config(mechanism=mechanism, gm_calibration=calibration))
    )
    summary = run_experiment(exp, None)
    a, ledger = exp.algorithm, exp.ledger
    assert summary["rounds_completed"] == 8
    assert a.estimates and a.plan_history.keys() == {"stage1", "stage2"}
    json.dumps(a.state_dict(), allow_nan=False)  # checkpoints are strict JSON
    for c in range(a.n):
        assert ledger.epsilon(c) <= a.eps[c]
        assert ledger.delta_of(c) == (a.deltas[c] if mechanism == "gaussian" else 0.0)
        # Every participation (stage-1 loss uploads included) was charged exactly once.
        assert ledger.steps(c) == a.total_counts[c]
    # Stage 2 follows its plan: nobody exceeds T_n.
    assert np.all(a.stage_counts <= a.tplan)
    # A client that spent its whole budget is out of the candidate set, and its ledger
    # would refuse one more participation.
    spent = [c for c in range(a.n) if ledger.epsilon(c) >= a.eps[c] * (1 - 1e-6)]
    assert spent
    for c in spent:
        assert not a.available()[c]
        assert ledger.would_exceed(c, ledger.history(c)[-1])


def test_thm2_c2_with_too_small_c2_is_refused_by_the_ledger():
    # c2 = 0.5 under-noises: one participation already costs more than ε_n (zCDP), so the
    # ledger refuses every task and the run stops without any release.
    exp = build_experiment(config_from_dict(_config(gm_calibration="thm2_c2", c2=0.5)))
    summary = run_experiment(exp, None)
    a, ledger = exp.algorithm, exp.ledger
    assert summary["stop_reason"] == "privacy budget exhausted for every client"
    assert ledger.num_charges == 0 and a.total_counts.sum() == 0


@pytest.mark.parametrize("name", ["bcs_pfa", "bcs_fedsgd"])
def test_baselines_run_with_uniform_plans(name):
    exp = build_experiment(config_from_dict(_config(name)))
    summary = run_experiment(exp, None)
    a = exp.algorithm
    assert summary["rounds_completed"] == 8
    if name != "bcs_fedsgd":
        assert set(a.tplan.tolist()) <= {3, 4}  # K·T/N = 3.2, largest remainder
        assert all(exp.ledger.epsilon(c) <= a.eps[c] for c in range(a.n))
    else:
        assert exp.ledger is None


def test_baseline_names_pin_their_mechanism_and_aggregation():
    dmldp = build_experiment(config_from_dict(_config("bcs_dmldp", mechanism="laplace")))
    assert dmldp.algorithm.mechanism == "laplace" and dmldp.algorithm.selection == "uniform"
    wei = build_experiment(config_from_dict(_config("bcs_weiavg"))).algorithm
    assert wei.aggregation == "weiavg" and wei.mechanism == "gaussian"


def test_given_budgets_are_used_and_shared_across_algorithms():
    budgets = ",".join(f"{1 + i}:{1e-5 * (1 + i / 10)}" for i in range(10))
    exp = build_experiment(config_from_dict(_config(budgets=budgets)))
    np.testing.assert_allclose(exp.algorithm.eps, np.arange(1, 11))
    a = build_experiment(config_from_dict(_config("dpfl_bcs"))).algorithm
    b = build_experiment(config_from_dict(_config("bcs_dpsgd"))).algorithm
    np.testing.assert_array_equal(a.eps, b.eps)


@pytest.mark.parametrize(
    ("name", "bcs", "field"),
    [
        ("bcs_dpsgd", {"mechanism": "laplace"}, "dpfl_bcs.mechanism"),
        ("dpfl_bcs", {"stage1_rounds": 8}, "dpfl_bcs.stage1_rounds"),
        ("dpfl_bcs", {"budgets": "1:1e-5,2:1e-5"}, "dpfl_bcs.budgets"),
        ("dpfl_bcs", {"constants": "table3"}, "dpfl_bcs.table3_dataset"),
        ("dpfl_bcs", {"delta_max": 0.5}, "dpfl_bcs.delta_max"),
        ("bcs_dmldp", {"mechanism": "laplace", "accountant": "prv"}, "dpfl_bcs.accountant"),
    ],
)
def test_bad_config_names_the_field(name, bcs, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_experiment(config_from_dict(_config(name, **bcs)))


def test_config_section_checks():
    with pytest.raises(ConfigError, match="epsilon_max"):
        config_from_dict(_config(epsilon_min=3.0, epsilon_max=1.0))
    with pytest.raises(ConfigError, match="stage1_rounds"):
        config_from_dict(_config(stage1_rounds=1))


def test_table3_constants_reach_p1():
    exp = build_experiment(
        config_from_dict(_config(constants="table3", table3_dataset="fashion_mnist"))
    )
    run_experiment(exp, None)
    est = exp.algorithm.estimates
    row = TABLE_III[("fashion_mnist", "gaussian")]
    assert (est["smoothness"], est["strong_convexity"], est["lr_offset"]) == (
        row.smoothness,
        row.strong_convexity,
        row.lr_offset,
    )


def test_client_result_type():
    a = _algo()
    model, params, data = _client(a)
    res = a.local_update(_ctx(model), dict(params), data, a.plan(0, [0], a.sizes)[0])
    assert isinstance(res, ClientResult) and res.weight == 1.0
