"""ALI-DPFL's builder: config → algorithm (ALI-DPFL, its fixed-τ, PE-DPFL or Adap DP-FL
baseline), the per-client record-level ledger and the privacy metadata; the privacy
parameters come from the paper's plan (`privacy_plan`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raydpfl.algorithms.base import Algorithm
from raydpfl.config import as_config_error
from raydpfl.config.schema import Config
from raydpfl.data.federated import FederatedDataset
from raydpfl.papers.ali_dpfl.adap_dp_fl import AdapDpFl
from raydpfl.papers.ali_dpfl.algorithm import AliDpfl, DPFedAvgFixedTau
from raydpfl.papers.ali_dpfl.pe_dpfl import PeDpfl
from raydpfl.papers.ali_dpfl.privacy_plan import plan_privacy
from raydpfl.privacy.accounting.ledger import PrivacyLedger
from raydpfl.privacy.accounting.plan import Ladder, PlannedMechanism, PrivacyPlan
from raydpfl.privacy.mechanisms.kernel import GaussianRelease, SubsampledGaussian


def build(
    config: Config, dataset: FederatedDataset, model: torch.nn.Module
) -> tuple[Algorithm, PrivacyLedger, dict[str, Any]]:
    """The algorithm named by `config` (one of `options.NAMES`), its ledger and metadata,
    σ, C, q and R_c taken from the paper's privacy plan (`privacy_plan.plan_privacy`)."""
    sizes = dataset.train_sizes()
    plan = plan_privacy(config, sizes)
    num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if config.experiment.algorithm.name in ("pe_dpfl", "adap_dp_fl"):
        algorithm = _ali_baseline(config, plan, num_params)
        plan = plan.with_mechanisms(*_baseline_mechanisms(algorithm), replace=True)
        return algorithm, plan.ledger(), plan.summary()
    algorithm, meta = _ali(config, plan, sizes, num_params)
    return algorithm, plan.ledger(), meta


def _baseline_mechanisms(algorithm: Algorithm) -> tuple[PlannedMechanism, ...]:
    """What the plan lets PE-DPFL or Adap DP-FL declare, from the values it was built with:
    PE-DPFL's output perturbation GaussianRelease(z, 2S); Adap DP-FL's DP-SGD steps on its
    σ ladder σ_0·β^k (floored) at q, and its noisy loss query (σ_ℓ, L, q_ℓ)."""
    if isinstance(algorithm, PeDpfl):
        release = algorithm.release
        fixed = {"noise_multiplier": release.noise_multiplier, "sensitivity": release.sensitivity}
        return (PlannedMechanism(GaussianRelease, fixed),)
    assert isinstance(algorithm, AdapDpFl)
    ladder = Ladder(
        algorithm.noise_multiplier, algorithm.noise_decay, algorithm.min_noise_multiplier
    )
    steps = PlannedMechanism(
        SubsampledGaussian,
        {"noise_multiplier": ladder, "sampling_rate": algorithm.sampling_rate},
        free="clip_norm: C_k is adapted per client from released values (the charge does "
        "not depend on C)",
    )
    loss = algorithm.loss_query
    query = PlannedMechanism(
        SubsampledGaussian,
        {
            "noise_multiplier": loss.noise_multiplier,
            "clip_norm": loss.clip_norm,
            "sampling_rate": loss.sampling_rate,
        },
    )
    return steps, query


def _ali_baseline(config: Config, plan: PrivacyPlan, num_params: int) -> Algorithm:
    """PE-DPFL or Adap DP-FL (ALI-DPFL's baselines): each stops on its own accountant."""
    algo = config.experiment.algorithm
    options = algo.typed_options()
    common = dict(
        clients_per_round=algo.clients_per_round,
        rounds_budget=algo.rounds,
        local_steps=algo.local_steps,
        lr=algo.lr,
        sampling_rate=plan.sampling_rate,
        epsilon=plan.epsilon,
        delta=plan.delta,
        accountant=plan.accountant,
        noise_multiplier=plan.noise_multiplier,
    )
    with as_config_error(f"experiment.algorithm.{algo.name}"):
        if algo.name == "pe_dpfl":
            return PeDpfl(
                **common,
                update_clip_norm=options.update_clip_norm or plan.clip_norm,
                reg_weight=options.reg_weight,
                perturbation_std=options.perturbation_std,
                num_perturbations=options.num_perturbations,
            )
        return AdapDpFl(
            **common,
            clip_norm=plan.clip_norm,
            noise_decay=options.noise_decay,
            num_params=num_params,
            patience=options.patience,
            clip_factor=options.clip_factor,
            clip_estimator=options.clip_estimator,
            clip_min=options.clip_min,
            clip_max=options.clip_max,
            min_noise_multiplier=options.min_noise_multiplier,
            loss_clip=options.loss_clip,
        )


def _ali(
    config: Config, plan: PrivacyPlan, sizes: np.ndarray, num_params: int
) -> tuple[AliDpfl, dict[str, Any]]:
    """ALI-DPFL or its fixed-τ baseline, R_c = the plan's step budget."""
    algo, ali = config.experiment.algorithm, config.experiment.algorithm.typed_options()
    min_batch = max(1.0, float(plan.sampling_rate) * float(sizes.min()))
    common = dict(
        clients_per_round=algo.clients_per_round,
        rounds_budget=algo.rounds,
        iteration_budget=plan.step_budget,
        lr=algo.lr,
        clip_norm=plan.clip_norm,
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=plan.sampling_rate,
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
    meta = plan.summary()
    meta.update(
        min_batch_B_hat=min_batch, num_params_d=num_params, adaptive_tau=algorithm.adaptive
    )
    return algorithm, meta
