"""ALI-DPFL's privacy plan: σ, C, q of DP-SGD and, for ALI-DPFL and its fixed-τ baseline,
R_c, the DP-SGD iterations the budget affords each client (Algorithm 3;
shared/specs/ali-dpfl.md §4.7). PE-DPFL's σ is calibrated here from the budget when not
given; Adap DP-FL's is its initial σ (it decays it adaptively).
"""

from __future__ import annotations

import numpy as np

from raydpfl.config import as_config_error
from raydpfl.config.schema import Config, ConfigError
from raydpfl.experiment.privacy_settings import check_delta, record_plan
from raydpfl.papers.ali_dpfl.pe_dpfl import calibrate_noise_multiplier as calibrate_pe_noise
from raydpfl.papers.ali_dpfl.theory import classic_epsilon, iteration_budget
from raydpfl.privacy.accounting.calibration import epsilon_for
from raydpfl.privacy.accounting.plan import PrivacyPlan


def plan_privacy(config: Config, sizes: np.ndarray) -> PrivacyPlan:
    """The plan of an ``ali_dpfl``, ``dp_fedavg_fixed_tau``, ``pe_dpfl`` or ``adap_dp_fl``
    run (record-level, one budget per client, the config's accountant)."""
    privacy, name = config.experiment.privacy, config.experiment.algorithm.name
    check_delta(privacy.delta, sizes)
    if name == "pe_dpfl":
        return _plan(config, *_pe_sigma(config))
    if name == "adap_dp_fl":
        if privacy.noise_multiplier is None:
            raise ConfigError(
                "experiment.privacy.noise_multiplier",
                "adap_dp_fl needs the initial sigma (it decays it adaptively)",
            )
        return _plan(config, privacy.noise_multiplier, False)
    return _plan_iterations(config)


def _pe_sigma(config: Config) -> tuple[float, bool]:
    """PE-DPFL's σ: given, or calibrated so that its rounds of releases spend ε."""
    privacy, algo = config.experiment.privacy, config.experiment.algorithm
    if privacy.noise_multiplier is not None:
        return privacy.noise_multiplier, False
    with as_config_error("experiment.algorithm.pe_dpfl"):
        sigma = calibrate_pe_noise(privacy.epsilon, privacy.delta, algo.rounds, privacy.accountant)
    return sigma, True


def _plan(
    config: Config,
    sigma: float,
    calibrated: bool,
    step_budget: int | None = None,
    **derived: object,
) -> PrivacyPlan:
    return record_plan(
        config.experiment.privacy,
        sigma,
        calibrated,
        metadata=derived,
        step_budget=step_budget,
        step_unit="iterations" if step_budget is not None else "",
    )


def _plan_iterations(config: Config) -> PrivacyPlan:
    """ALI-DPFL and its fixed-τ baseline: σ fixed, the budget sets R_c (Algorithm 3)."""
    exp = config.experiment
    algo, privacy, ali = exp.algorithm, exp.privacy, exp.algorithm.typed_options()
    if privacy.noise_multiplier is None:
        raise ConfigError(
            "experiment.privacy.noise_multiplier",
            f"{algo.name} needs a fixed sigma (the budget sets the iteration cap R_c, "
            "not sigma); the paper's is 1.1",
        )
    sigma, q = privacy.noise_multiplier, privacy.sampling_rate
    with as_config_error("experiment.privacy", "cannot derive R_c: "):
        r_c = iteration_budget(
            privacy.epsilon,
            privacy.delta,
            q,
            sigma,
            mode=ali.rc_mode,
            conversion=ali.rc_conversion,
            accountant=privacy.accountant,
        )
    if r_c < 1:
        raise ConfigError(
            "experiment.privacy.epsilon",
            f"the budget allows no DP-SGD iteration at sigma={sigma}, q={q}; raise epsilon",
        )
    return _plan(
        config,
        sigma,
        False,
        step_budget=r_c,
        iteration_budget_R_c=r_c,
        rounds_budget_R_s=algo.rounds,
        rc_mode=ali.rc_mode,
        rc_conversion="classic" if ali.rc_mode == "paper_compat" else ali.rc_conversion,
        classic_epsilon_at_R_c=classic_epsilon(q, sigma, r_c, privacy.delta),
        ledger_epsilon_at_R_c=epsilon_for(sigma, q, r_c, privacy.delta, privacy.accountant),
    )
