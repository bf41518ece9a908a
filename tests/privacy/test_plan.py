"""The privacy plan: one object decides σ, C, q and the budget; the mechanisms and the
ledger a builder makes come from it."""

from pathlib import Path

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
SMALL_IMAGES = ["experiment.data.dataset=digits", "experiment.model.name=mlp"]
RUN = ["runtime.backend=local", "runtime.threads=1", "experiment.algorithm.rounds=2"]


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


# ---- declarations are checked against the plan -----------------------------------------------
def test_planned_values_ladders_ranges_and_per_client_values():
    from raydpfl.privacy.accounting.plan import Ladder, PerClient, PlannedMechanism, Within

    ladder = Ladder(2.0, 0.5, 0.3)
    assert all(ladder.allows(v, 0) for v in (2.0, 1.0, 0.5, 0.3))  # 0.25 floored at 0.3
    assert not ladder.allows(0.75, 0) and not ladder.allows(0.25, 0)
    sigma = 1.3
    for _ in range(7):  # the same products Adap DP-FL computes, round after round
        sigma = max(sigma * 0.9, 0.4)
    assert Ladder(1.3, 0.9, 0.4).allows(sigma, 3)
    assert Within(0.1, 2.0).allows(2.0, 0) and not Within(0.1, 2.0).allows(2.1, 0)
    per = PerClient((1.0, 2.0))
    assert per.allows(2.0, 1) and not per.allows(2.0, 0) and not per.allows(1.0, 5)
    planned = PlannedMechanism(
        SubsampledGaussian, {"noise_multiplier": ladder, "sampling_rate": 0.1}
    )
    assert planned.allows(SubsampledGaussian(0.5, 123.0, 0.1), 0)  # C free
    assert not planned.allows(SubsampledGaussian(0.5, 1.0, 0.2), 0)
    assert "max(2·0.5^k, 0.3)" in planned.describe()


def test_a_declaration_off_the_plan_is_refused_in_one_line():
    from raydpfl.privacy.accounting.plan import check_planned
    from raydpfl.privacy.mechanisms.kernel import PrivacyContractError, uses

    plan = plan_dp_sgd(small_config().experiment.privacy, 10)
    ok = uses(plan.subsampled_gaussian(), 3)
    check_planned(plan.mechanisms, 2, 0, (ok,), "dp_fedavg")
    tiny_q = uses(SubsampledGaussian(plan.noise_multiplier, plan.clip_norm, 1e-6), 3)
    with pytest.raises(PrivacyContractError) as e:
        check_planned(plan.mechanisms, 2, 4, (tiny_q,), "sneaky")
    message = str(e.value)
    assert "\n" not in message and "'sneaky', client 2, round 5" in message
    assert "sampling_rate=1e-06" in message and "privacy plan does not allow" in message
    check_planned(None, 2, 4, (tiny_q,))  # a plan that states no mechanisms checks nothing


def test_every_papers_builder_hands_the_server_the_plans_mechanisms():
    """The ledger each paper's builder makes carries its plan's mechanisms (the server
    checks every declaration against them; the papers' end-to-end tests run with it)."""
    import raydpfl
    from raydpfl.experiment.build import build_experiment

    root = Path(__file__).resolve().parents[2]
    ali = "configs/ali_dpfl/fashion_mnist/tableii_rc.yaml"
    cases = [
        ("configs/quickstart.yaml", []),
        (ali, SMALL_IMAGES),
        (ali, [*SMALL_IMAGES, "experiment.algorithm.name=pe_dpfl"]),
        (ali, [*SMALL_IMAGES, "experiment.algorithm.name=adap_dp_fl"]),
        (
            "configs/dpfl_bcs/fashion_mnist_dpfl_bcs_gaussian.yaml",
            [
                *SMALL_IMAGES,
                "experiment.algorithm.dpfl_bcs.stage1_rounds=2",
                "experiment.algorithm.rounds=3",
            ],
        ),
        ("configs/rc_dpfl/fmnist_rotation/rc_dpfl_eps5.yaml", SMALL_IMAGES),
        ("configs/fedfdp/table2_mnist.yaml", [*SMALL_IMAGES, "experiment.algorithm.name=fedfdp"]),
    ]
    kinds = []
    for config, extra in cases:
        exp = build_experiment(raydpfl.load_config(str(root / config), [*RUN, *extra]))
        assert exp.ledger.planned, config
        kinds.append({p.kind.__name__ for p in exp.ledger.planned})
    assert kinds[2] == {"GaussianRelease"} and kinds[4] == {"GaussianRelease"}
    assert kinds[5] == {"SubsampledGaussian"} or "ExponentialSelection" in kinds[5]
