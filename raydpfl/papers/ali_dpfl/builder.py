"""ALI-DPFL's builder: config → algorithm (ALI-DPFL, its fixed-τ, PE-DPFL or Adap DP-FL
baseline), the per-client record-level ledger and the privacy metadata."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raydpfl.algorithms.base import Algorithm
from raydpfl.config.schema import Config, ConfigError
from raydpfl.data.federated import FederatedDataset
from raydpfl.experiment.privacy_settings import check_delta, privacy_metadata
from raydpfl.papers.ali_dpfl.adap_dp_fl import AdapDpFl
from raydpfl.papers.ali_dpfl.algorithm import AliDpfl, DPFedAvgFixedTau
from raydpfl.papers.ali_dpfl.pe_dpfl import PeDpfl
from raydpfl.papers.ali_dpfl.pe_dpfl import calibrate_noise_multiplier as calibrate_pe_noise
from raydpfl.papers.ali_dpfl.theory import classic_epsilon, iteration_budget
from raydpfl.privacy.calibration import epsilon_for
from raydpfl.privacy.ledger import PrivacyLedger


def build(
    config: Config, dataset: FederatedDataset, model: torch.nn.Module
) -> tuple[Algorithm, PrivacyLedger, dict[str, Any]]:
    """The algorithm named by `config` (one of `options.NAMES`), its ledger and metadata."""
    privacy = config.experiment.privacy
    sizes = dataset.train_sizes()
    check_delta(privacy.delta, sizes)
    ledger = PrivacyLedger(privacy.accountant, privacy.delta, privacy.epsilon)
    meta = privacy_metadata(privacy)
    if config.experiment.algorithm.name in ("pe_dpfl", "adap_dp_fl"):
        return _ali_baseline(config, sizes, model, ledger, meta)
    return _ali(config, sizes, model, ledger, meta)


def _ali_baseline(
    config: Config,
    sizes: np.ndarray,
    model: torch.nn.Module,
    ledger: PrivacyLedger,
    meta: dict[str, Any],
) -> tuple[Algorithm, PrivacyLedger, dict[str, Any]]:
    """PE-DPFL or Adap DP-FL (ALI-DPFL's baselines): each stops on its own accountant."""
    exp = config.experiment
    algo, privacy = exp.algorithm, exp.privacy
    common = dict(
        clients_per_round=algo.clients_per_round,
        rounds_budget=algo.rounds,
        local_steps=algo.local_steps,
        lr=algo.lr,
        sampling_rate=privacy.sampling_rate,
        epsilon=privacy.epsilon,
        delta=privacy.delta,
        accountant=privacy.accountant,
    )
    try:
        if algo.name == "pe_dpfl":
            pe = algo.typed_options()
            sigma = privacy.noise_multiplier
            calibrated = sigma is None
            if sigma is None:
                sigma = calibrate_pe_noise(
                    privacy.epsilon, privacy.delta, algo.rounds, privacy.accountant
                )
            algorithm: Algorithm = PeDpfl(
                **common,
                update_clip_norm=pe.update_clip_norm or privacy.clip_norm,
                noise_multiplier=sigma,
                reg_weight=pe.reg_weight,
                perturbation_std=pe.perturbation_std,
                num_perturbations=pe.num_perturbations,
            )
        else:
            ad = algo.typed_options()
            if privacy.noise_multiplier is None:
                raise ConfigError(
                    "experiment.privacy.noise_multiplier",
                    "adap_dp_fl needs the initial sigma (it decays it adaptively)",
                )
            sigma, calibrated = privacy.noise_multiplier, False
            num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
            algorithm = AdapDpFl(
                **common,
                clip_norm=privacy.clip_norm,
                noise_multiplier=sigma,
                noise_decay=ad.noise_decay,
                num_params=num_params,
                patience=ad.patience,
                clip_factor=ad.clip_factor,
                clip_estimator=ad.clip_estimator,
                clip_min=ad.clip_min,
                clip_max=ad.clip_max,
                min_noise_multiplier=ad.min_noise_multiplier,
                loss_clip=ad.loss_clip,
            )
    except ValueError as e:
        raise ConfigError(f"experiment.algorithm.{algo.name}", str(e)) from None
    meta.update(noise_multiplier=sigma, noise_calibrated=calibrated)
    return algorithm, ledger, meta


def _ali(
    config: Config,
    sizes: np.ndarray,
    model: torch.nn.Module,
    ledger: PrivacyLedger,
    meta: dict[str, Any],
) -> tuple[Algorithm, PrivacyLedger, dict[str, Any]]:
    """ALI-DPFL or its fixed-τ baseline: σ fixed, the budget sets R_c (Algorithm 3)."""
    exp = config.experiment
    algo, privacy, ali = exp.algorithm, exp.privacy, exp.algorithm.typed_options()
    if privacy.noise_multiplier is None:
        raise ConfigError(
            "experiment.privacy.noise_multiplier",
            f"{algo.name} needs a fixed sigma (the budget sets the iteration cap R_c, "
            "not sigma); the paper's is 1.1",
        )
    sigma, q = privacy.noise_multiplier, privacy.sampling_rate
    try:
        r_c = iteration_budget(
            privacy.epsilon,
            privacy.delta,
            q,
            sigma,
            mode=ali.rc_mode,
            conversion=ali.rc_conversion,
            accountant=privacy.accountant,
        )
    except ValueError as e:
        raise ConfigError("experiment.privacy", f"cannot derive R_c: {e}") from None
    if r_c < 1:
        raise ConfigError(
            "experiment.privacy.epsilon",
            f"the budget allows no DP-SGD iteration at sigma={sigma}, q={q}; raise epsilon",
        )
    num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    min_batch = max(1.0, q * float(sizes.min()))
    common = dict(
        clients_per_round=algo.clients_per_round,
        rounds_budget=algo.rounds,
        iteration_budget=r_c,
        lr=algo.lr,
        clip_norm=privacy.clip_norm,
        noise_multiplier=sigma,
        sampling_rate=q,
        num_params=num_params,
        min_batch=min_batch,
        normalizer=ali.normalizer,
        fixed_divisor=ali.fixed_divisor,
    )
    algorithm: AliDpfl
    if algo.name == "dp_fedavg_fixed_tau":
        algorithm = DPFedAvgFixedTau(local_steps=algo.local_steps, **common)
    else:
        algorithm = AliDpfl(
            **common,
            gamma=ali.gamma,
            gamma_mode=ali.gamma_mode,
            mu_probe_size=ali.mu_probe_size,
            mu_estimator=ali.mu_estimator,
            tau_formula=ali.tau_formula,
            tau_init=ali.tau_init,
            tau_max=ali.tau_max,
            last_round=ali.last_round,
        )
    meta.update(
        noise_multiplier=sigma,
        noise_calibrated=False,
        iteration_budget_R_c=r_c,
        rounds_budget_R_s=algo.rounds,
        rc_mode=ali.rc_mode,
        rc_conversion="classic" if ali.rc_mode == "paper_compat" else ali.rc_conversion,
        classic_epsilon_at_R_c=classic_epsilon(q, sigma, r_c, privacy.delta),
        ledger_epsilon_at_R_c=epsilon_for(sigma, q, r_c, privacy.delta, privacy.accountant),
        min_batch_B_hat=min_batch,
        num_params_d=num_params,
        adaptive_tau=algorithm.adaptive,
    )
    return algorithm, ledger, meta
