"""The privacy plan: one object decides σ, C, q and the budget; the mechanisms and the
ledger a builder makes come from it."""

import numpy as np
import pytest

from raydpfl.config import ConfigError, config_from_dict
from raydpfl.experiment.privacy_settings import plan_dp_sgd
from raydpfl.papers.ali_dpfl.privacy_plan import plan_privacy as ali_plan
from raydpfl.papers.fedfdp.privacy_plan import plan_privacy as fedfdp_plan
from raydpfl.papers.rc_dpfl.privacy_plan import plan_privacy as rc_plan
from raydpfl.privacy.accounting.plan import PrivacyPlan
from raydpfl.privacy.mechanisms.kernel import SubsampledGaussian
from tests.conftest import small_config

SIZES = np.full(10, 600)


def _config(algorithm: dict, privacy: dict):
    return config_from_dict({"experiment": {"algorithm": algorithm, "privacy": privacy}})


def test_the_plans_mechanism_and_ledger_carry_its_parameters():
    plan = PrivacyPlan(
        unit="record", accountant="rdp", delta=1e-5, epsilon=2.0,
        clip_norm=0.5, noise_multiplier=1.1, sampling_rate=0.01,
    )  # fmt: skip
    assert plan.subsampled_gaussian() == SubsampledGaussian(1.1, 0.5, 0.01)
    ledger = plan.ledger()
    assert ledger.epsilon_budget == 2.0 and ledger.delta == 1e-5
    with pytest.raises(ValueError, match="no DP-SGD"):
        PrivacyPlan(unit="record", accountant="rdp", delta=1e-5, epsilon=1.0).subsampled_gaussian()


def test_ali_dpfls_plan_gives_the_papers_r_c_at_its_settings():
    # Table II, R_c/2 column: eps = 2, sigma = 1.1, q = 0.015, delta = 1e-5 -> R_c = 317 with
    # the authors' bisection (spec ali-dpfl.md §4.7; REPRODUCTION.md's II:Rc/2 row).
    config = _config(
        {"name": "ali_dpfl", "ali_dpfl": {"rc_mode": "paper_compat"}},
        {"epsilon": 2.0, "delta": 1e-5, "noise_multiplier": 1.1, "sampling_rate": 0.015},
    )
    plan = ali_plan(config, SIZES)

    assert (plan.step_budget, plan.step_unit) == (317, "iterations")
    assert plan.noise_multiplier == 1.1 and not plan.noise_calibrated
    assert plan.metadata["iteration_budget_R_c"] == 317


def test_pe_dpfls_plan_calibrates_sigma_once_when_not_given():
    config = _config(
        {"name": "pe_dpfl", "rounds": 20},
        {"epsilon": 2.0, "delta": 1e-5, "noise_multiplier": None},
    )
    plan = ali_plan(config, SIZES)
    assert plan.noise_calibrated and plan.noise_multiplier > 0
    assert plan.metadata["noise_multiplier"] == plan.noise_multiplier


def test_fedfdps_plan_caps_rounds_within_the_budget_and_uncaps_the_papers_count():
    privacy = {"epsilon": 2.0, "delta": 1e-5, "noise_multiplier": 2.0, "sampling_rate": 0.05}
    full = fedfdp_plan(_config({"name": "fedfdp", "local_steps": 2}, privacy), SIZES)
    paper = fedfdp_plan(
        _config(
            {
                "name": "fedfdp",
                "local_steps": 2,
                "fedfdp": {"rounds_from_budget": "paper_model_only"},
            },
            privacy,
        ),
        SIZES,
    )

    assert full.step_budget == full.metadata["rounds_budget_full"] >= 1
    assert full.epsilon == 2.0 and paper.epsilon is None  # the paper's T overshoots: uncapped
    assert paper.step_budget == paper.metadata["rounds_budget_paper_model_only"]
    assert full.extra["loss_noise_multiplier"] == full.metadata["loss_noise_multiplier"]


def test_rc_dpfls_plan_gives_each_client_a_sigma_that_fits_the_budget():
    config = _config(
        {"name": "rc_dp_fedavg", "rounds": 5, "clients_per_round": 10},
        {"epsilon": 3.0, "delta": 1e-5, "noise_multiplier": None},
    )
    sizes = np.array([300] * 5 + [900] * 5)
    plan = rc_plan(config, sizes)

    zs = plan.extra["noise_multipliers"]
    assert len(zs) == 10 and zs[0] != zs[-1]  # a smaller client samples at a higher rate
    assert plan.noise_multiplier == max(zs) and plan.metadata["planned_epsilon_max"] <= 3.0


def test_dp_fedavgs_plan_is_what_its_builder_runs_with():
    config = small_config(
        experiment__algorithm__rounds=4,
        experiment__algorithm__local_steps=2,
        experiment__privacy__noise_multiplier=None,
    )
    plan = plan_dp_sgd(config.experiment.privacy, 8)
    assert plan.noise_calibrated

    from raydpfl.experiment.build import build_experiment

    exp = build_experiment(config)
    assert exp.algorithm.noise_multiplier == plan.noise_multiplier
    assert exp.ledger.epsilon_budget == plan.epsilon


def test_a_plan_without_a_fixed_sigma_is_refused_where_the_budget_sets_the_steps():
    config = _config({"name": "ali_dpfl"}, {"noise_multiplier": None})
    with pytest.raises(ConfigError, match="fixed sigma"):
        ali_plan(config, SIZES)


def test_the_client_level_builders_take_sigma_and_s_from_one_client_level_plan():
    from raydpfl.config import client_level  # noqa: F401  (registers dp_fedavg_client)
    from raydpfl.experiment.build import build_experiment

    config = small_config(
        experiment__algorithm__name="dp_fedavg_client",
        experiment__algorithm__options={"update_clip_norm": 0.7},
        experiment__privacy__noise_multiplier=None,
        experiment__privacy__delta=1e-3,
    )
    exp = build_experiment(config)
    assert exp.algorithm.noise_calibrated and exp.algorithm.clip_norm == 0.7
    plan = PrivacyPlan(unit="client", accountant="rdp", delta=1e-3, epsilon=1.0)
    with pytest.raises(ValueError, match="ClientLevelLedger"):
        plan.ledger()
