"""ALI-DPFL's server half (τ schedule, caps, μ) and end-to-end runs on small real data."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from raydpfl.algorithms.base import ClientResult
from raydpfl.config import ConfigError
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.papers.ali_dpfl.algorithm import AliDpfl, DPFedAvgFixedTau, secant_mu
from raydpfl.papers.ali_dpfl.theory import iteration_budget, round_tau, tau_star
from raydpfl.simulation.outputs import prepare_run_dir
from tests.conftest import small_config

ROOT = Path(__file__).resolve().parents[3]

D = 1000  # a toy model dimension for the server-half tests


def _algo(rounds_budget: int, iteration_budget: int, **kw) -> AliDpfl:
    args = dict(
        clients_per_round=3,
        rounds_budget=rounds_budget,
        iteration_budget=iteration_budget,
        lr=0.5,
        clip_norm=0.1,
        noise_multiplier=1.1,
        sampling_rate=0.015,
        num_params=D,
        min_batch=46.0,
        gamma=10.0,
    )
    args.update(kw)
    return AliDpfl(**args)


def _round(algo: AliDpfl, round_idx: int, mu: float) -> dict[str, float]:
    """Drives one server round with 3 equal-size clients whose secant estimates all equal
    `mu`: each client reports ‖Δ∇‖ = μ·‖w^i − w‖ for its actual distance to the aggregate.
    """
    sizes = np.array([100, 100, 100])
    tasks = algo.plan(round_idx, [0, 1, 2], sizes)
    w = {"p": torch.zeros(4)}
    updates = [torch.tensor([1.0, 0, 0, 0]), torch.tensor([-1.0, 0, 0, 0]), torch.zeros(4)]
    updates[2][1] = 1.0
    results = [
        ClientResult(client_id=c, update={"p": u}, weight=100.0, num_examples=100)
        for c, u in enumerate(updates)
    ]
    new = algo.aggregate(w, tasks, results)
    follow = algo.followup_tasks(round_idx, tasks, results, new)
    replies = []
    for t in follow:
        dist = float((t.payload["p"] - new["p"]).norm())
        replies.append(
            ClientResult(
                client_id=t.client_id,
                update={},
                weight=0.0,
                num_examples=100,
                metrics={"mu_grad_diff": mu * dist},
            )
        )
    return algo.after_round(round_idx, {}, replies) | {"followups": float(len(follow))}


def test_secant_mu_is_the_weighted_mean_of_the_ratios():
    mu = secant_mu([2.0, 3.0], [1.0, 2.0], [1.0, 3.0])
    assert mu == pytest.approx(0.25 * 2.0 + 0.75 * 1.5, rel=1e-9)
    assert math.isnan(secant_mu([], [], []))


def test_lemma1_with_as_many_rounds_as_iterations_tau_is_one_and_no_mu_is_gathered():
    algo = _algo(rounds_budget=50, iteration_budget=20)
    assert not algo.adaptive
    taus = []
    k = 0
    while algo.stop_reason() is None:
        out = _round(algo, k, mu=1.0)
        assert out["followups"] == 0  # no raw-data statistics when τ is fixed
        taus.append(out["tau"])
        k += 1
    assert taus == [1.0] * 20  # stops on R_c, one iteration per round
    assert "R_c exhausted" in algo.stop_reason()


def test_adaptive_tau_follows_eq9_and_never_exceeds_the_iteration_budget():
    r_s, r_c = 10, 100
    algo = _algo(rounds_budget=r_s, iteration_budget=r_c)
    out = _round(algo, 0, mu=1.0)
    assert out["tau"] == 1.0  # τ_init
    expected = tau_star(
        mu=1.0,
        gamma=10.0,
        total_iterations=min(r_s * 1, r_c),
        clip_norm=0.1,
        noise_multiplier=1.1,
        num_params=D,
        min_batch=46.0,
    )
    assert out["mu"] == pytest.approx(1.0, rel=1e-6)
    assert out["tau_raw"] == pytest.approx(expected, rel=1e-6)
    assert out["tau_next"] == round_tau(expected)
    total, k = 1, 1
    while algo.stop_reason() is None:
        total += int(_round(algo, k, mu=1.0)["tau"])
        k += 1
    assert total <= r_c
    assert k <= r_s


def test_last_round_is_truncated_to_use_exactly_r_c():
    # A huge Γ drives τ* to the clamp; R_c = 25 with τ_max = 10: rounds of 10, 10, 5.
    algo = _algo(rounds_budget=5, iteration_budget=25, tau_init=10, tau_max=10, gamma=1e6)
    taus = []
    k = 0
    while algo.stop_reason() is None:
        taus.append(_round(algo, k, mu=1.0)["tau"])
        k += 1
    assert taus == [10.0, 10.0, 5.0]
    assert algo.iterations_done == 25


def test_last_round_skip_replays_the_code_and_leaves_iterations_unused():
    algo = _algo(
        rounds_budget=5, iteration_budget=25, tau_init=10, tau_max=10, gamma=1e6, last_round="skip"
    )
    k = 0
    while algo.stop_reason() is None:
        _round(algo, k, mu=1.0)
        k += 1
    assert algo.iterations_done == 20
    assert "does not fit" in algo.stop_reason()


def test_tau_star_grows_with_the_rounds_to_iterations_ratio_and_responds_to_mu():
    # Lemma 2: at fixed R_s, a larger R_c allows a larger T = min(R_s·τ, R_c), so a larger τ*.
    def next_tau_raw(r_s: int, r_c: int, mu: float) -> float:
        algo = _algo(rounds_budget=r_s, iteration_budget=r_c, tau_init=5, gamma=10.0)
        return _round(algo, 0, mu=mu)["tau_raw"]

    assert next_tau_raw(20, 40, 1.0) < next_tau_raw(20, 100, 1.0)  # T = 40 vs 100
    # τ* is not monotone in μ: large for tiny μ (4/μ²) and for large μ (2ΓTμ).
    small, mid = next_tau_raw(20, 100, 0.01), next_tau_raw(20, 100, 1.0)
    large = next_tau_raw(20, 100, 100.0)
    assert small > mid and large > mid


def test_noise_dominated_bound_gives_tau_one():
    # B̂ = 1 and a large d: N_dp dominates and τ* → sqrt(1.5) (§4.5), rounded to 1.
    algo = _algo(rounds_budget=20, iteration_budget=100, num_params=582_026, min_batch=1.0)
    out = _round(algo, 0, mu=1.0)
    assert out["tau_raw"] < 1.5
    assert out["tau_next"] == 1.0


def test_fixed_tau_baseline_runs_min_rs_and_rc_over_tau_rounds():
    for tau, r_s, r_c, rounds in [(3, 100, 20, 6), (5, 3, 100, 3), (10, 50, 9, 0)]:
        algo = DPFedAvgFixedTau(
            local_steps=tau,
            clients_per_round=3,
            rounds_budget=r_s,
            iteration_budget=r_c,
            lr=0.5,
            clip_norm=0.1,
            noise_multiplier=1.1,
            sampling_rate=0.015,
            num_params=D,
            min_batch=2.0,
        )
        k = 0
        while algo.stop_reason() is None:
            assert _round(algo, k, mu=1.0)["tau"] == tau
            k += 1
        assert k == min(r_s, r_c // tau) == rounds


# ---- end to end on real data ------------------------------------------------------------
def _ali_config(tmp_name: str = "ali", **algorithm):
    return small_config(
        experiment__name=tmp_name,
        experiment__data={
            "dataset": "digits",
            "num_clients": 5,
            "partition": {"kind": "dirichlet_capped", "alpha": 1.0, "min_samples_per_client": 10},
            "pool": "all",
            "client_test_fraction": 0.25,
            "split_rounding": "floor_train",
        },
        experiment__model={"name": "mlp", "hidden": 32},
        experiment__algorithm={
            "name": "ali_dpfl",
            "rounds": 6,
            "clients_per_round": 5,
            "lr": 0.5,
            "ali_dpfl": {"mu_probe_size": 64},
            **algorithm,
        },
        experiment__privacy={
            "epsilon": 4.0,
            "delta": 1e-4,
            "clip_norm": 1.0,
            "noise_multiplier": 1.1,
            "sampling_rate": 0.1,
        },
    )


def test_ali_dpfl_end_to_end_spends_exactly_r_c_and_logs_tau(tmp_path):
    config = _ali_config()
    exp = build_experiment(config)
    r_c = iteration_budget(4.0, 1e-4, 0.1, 1.1)
    assert exp.metadata["privacy"]["iteration_budget_R_c"] == r_c
    assert r_c > 6  # R_s < R_c: the adaptive regime

    summary = run_experiment(exp, prepare_run_dir(tmp_path / "run"))

    rounds = pd.read_parquet(tmp_path / "run" / "rounds.parquet")
    assert rounds["tau"].sum() <= r_c
    assert len(rounds) <= 6
    assert rounds["mu"].iloc[:-1].gt(0).all()  # μ gathered after every non-final round
    steps = [exp.ledger.steps(c) for c in range(5)]
    assert steps == [int(rounds["tau"].sum())] * 5  # every client ran the same schedule
    assert summary["epsilon_max"] <= 4.0
    assert any("mu_statistics" in u for u in summary["unaccounted_releases"])
    assert np.isfinite(rounds["test_accuracy"].iloc[-1])  # the last round is scored
    assert summary["final_test_accuracy"] > 0.3  # 10 classes; chance is 0.1


def test_ali_dpfl_with_more_rounds_than_iterations_stops_on_r_c():
    config = _ali_config(rounds=400, eval_every=100)
    exp = build_experiment(config)
    r_c = exp.metadata["privacy"]["iteration_budget_R_c"]
    summary = run_experiment(exp, None)
    assert summary["rounds_completed"] == r_c
    assert "R_c exhausted" in summary["stop_reason"]
    assert all(exp.ledger.steps(c) == r_c for c in range(5))


def test_ali_dpfl_needs_a_fixed_sigma():
    config = small_config(
        experiment__algorithm={"name": "ali_dpfl"},
        experiment__privacy={"noise_multiplier": None},
    )
    with pytest.raises(ConfigError, match="noise_multiplier"):
        build_experiment(config)


def test_fixed_divisor_rescales_one_noisy_step_by_expected_batch_over_divisor():
    from raydpfl.simulation.worker import ClientWorker

    exp = build_experiment(_ali_config())
    updates = {}
    for normalizer in ("expected", "fixed"):
        exp.algorithm.normalizer = normalizer
        exp.algorithm.fixed_divisor = 7.0
        worker = ClientWorker(exp.algorithm, exp.model_spec, exp.dataset, run_seed=0)
        task = exp.algorithm.plan(0, [2], exp.dataset.train_sizes())[0]
        updates[normalizer] = worker.run_task(exp.init_params, task).update
        exp.algorithm.iterations_done = exp.algorithm.rounds_done = 0
    expected_batch = 0.1 * exp.dataset.train_sizes()[2]
    for name, u in updates["expected"].items():
        torch.testing.assert_close(updates["fixed"][name], u * expected_batch / 7.0)


# ---- the authors' μ estimators (spec §4.6.1, A9) ------------------------------------------
def test_secant_mu_takes_the_code_denominator_epsilon():
    from raydpfl.papers.ali_dpfl.algorithm import CODE_MU_EPS, secant_mu

    assert secant_mu([2.0, 4.0], [1.0, 3.0], [1.0, 3.0], CODE_MU_EPS) == pytest.approx(
        0.25 * 2.0 / (1.0 + 1e-6) + 0.75 * 4.0 / (3.0 + 1e-6), rel=1e-15
    )


def test_the_torch_probe_is_the_last_steps_displacement():
    from raydpfl.papers.ali_dpfl.algorithm import _torch_mu_probe

    before = {"w": torch.zeros(3), "b": torch.ones(1)}
    after = {"w": torch.tensor([3.0, 0.0, 4.0]), "b": torch.ones(1)}
    assert _torch_mu_probe(before, after, None, None) == {"mu_numerator": 5.0}


@pytest.mark.parametrize("estimator", ["code_torch", "code_mindspore"])
def test_code_estimators_feed_tau_without_a_follow_up(estimator):
    """Adaptive ALI-DPFL with a code estimator: no μ follow-up task, μ from the training
    results' numerators over ‖w^i − w(k+1)‖ + 1e-6; the PyTorch form releases nothing
    beyond the charged DP-SGD steps (no μ statistics listed as unaccounted)."""
    import raydpfl

    result = raydpfl.run_simulation(
        str(ROOT / "configs/ali_dpfl/fashion_mnist/tableii_rc_5.yaml"),
        overrides=[
            "runtime.backend=local",
            "experiment.data.dataset=digits",
            "experiment.model.name=mlp",
            "experiment.algorithm.rounds=3",
            f"experiment.algorithm.ali_dpfl.mu_estimator={estimator}",
        ],
    )
    table = result.history.to_pandas()
    assert table["mu"].notna().any() and (table["mu"].dropna() > 0).all()
    listed = " ".join(result.summary["unaccounted_releases"])
    assert ("mu_statistics" in listed) == (estimator == "code_mindspore")
