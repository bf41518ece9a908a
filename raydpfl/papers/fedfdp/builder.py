"""Builds the fedfdp algorithms from `experiment.algorithm.fedfdp` (shared/specs/fedfdp.md).

Non-private: fedfair, fedprox, scaffold, feddyn, qffl. Private (record-level DP-SGD on
every client, one ledger per client): fedfdp, dp_fedprox, dp_scaffold, dp_feddyn, dp_qffl.

Rounds of a private run (`fedfdp.rounds_from_budget`):
- ``full`` (default): the largest T whose ε — every mechanism the algorithm releases
  (gradient steps, and for fedfdp / dp_qffl the loss upload) — stays within the budget;
  the run stops after min(T, algorithm.rounds) rounds.
- ``paper_model_only``: the paper's count (gradient mechanism only, the authors'
  bisection, §6.2–6.3). It overshoots the budget when a loss is released, so the ledger
  is built without a cap and reports the ε actually spent (e.g. 3.76 at T = 778).
- ``none``: algorithm.rounds; the ledger refuses any task that would exceed the budget.
Both round counts are always written to the metadata (`rounds_budget_full`,
`rounds_budget_paper_model_only`, and the true ε at the paper's count).
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from raydpfl.algorithms.base import Algorithm
from raydpfl.config import as_config_error
from raydpfl.config.schema import Config, ConfigError, server_optimizer_algorithms
from raydpfl.data.federated import FederatedDataset
from raydpfl.experiment.builders.core import server_optimizer_kwargs
from raydpfl.papers.fedfdp.algorithm import FedFDP
from raydpfl.papers.fedfdp.convergence import BoundConstants
from raydpfl.papers.fedfdp.feddyn import DPFedDyn, FedDyn
from raydpfl.papers.fedfdp.fedfair import FedFair
from raydpfl.papers.fedfdp.fedprox import DPFedProx, FedProx
from raydpfl.papers.fedfdp.loss_upload import LossUpload
from raydpfl.papers.fedfdp.options import PRIVATE_NAMES
from raydpfl.papers.fedfdp.privacy_plan import plan_privacy
from raydpfl.papers.fedfdp.qffl import DPQFFL, QFFL
from raydpfl.papers.fedfdp.scaffold import DPScaffold, Scaffold
from raydpfl.privacy.accounting.ledger import PrivacyLedger
from raydpfl.privacy.accounting.plan import PlannedMechanism
from raydpfl.privacy.mechanisms.kernel import UNBOUNDED_WEIGHT_RULES, SubsampledGaussian


def build(
    config: Config, dataset: FederatedDataset, model: nn.Module
) -> tuple[Algorithm, PrivacyLedger | None, dict[str, Any]]:
    """The algorithm named by `config`, its ledger (None if non-private) and metadata."""
    exp = config.experiment
    algo, privacy, opts = exp.algorithm, exp.privacy, exp.algorithm.typed_options()
    name = algo.name
    common: dict[str, Any] = dict(
        clients_per_round=algo.clients_per_round,
        lr=algo.lr,
        local_steps=algo.local_steps,
        batch_size=algo.batch_size,
        local_mode=opts.local_mode,
        sampling_rate=privacy.sampling_rate,
        normalizer=opts.normalizer,
        fixed_divisor=opts.fixed_divisor,
    )
    if name in server_optimizer_algorithms():  # fedprox, dp_fedprox: one averaged update
        # The server optimizer steps on the (noised) mean: post-processing, no privacy cost.
        common.update(server_optimizer_kwargs(config))
    if algo.clients_per_round > dataset.num_clients:
        raise ConfigError(
            "experiment.algorithm.clients_per_round",
            f"{algo.clients_per_round} > {dataset.num_clients} clients",
        )
    if name not in PRIVATE_NAMES:
        return (
            _nonprivate(name, opts, common, dataset.num_clients),
            None,
            {"unit": "none: non-private run (epsilon is infinite)"},
        )
    plan = plan_privacy(config, dataset.train_sizes())
    if plan.extra.get("loss_noise_multiplier") is not None:  # FedFDP's, DP q-FFL's loss upload
        plan = plan.with_mechanisms(
            PlannedMechanism(
                SubsampledGaussian,
                {
                    "noise_multiplier": plan.extra["loss_noise_multiplier"],
                    "sampling_rate": plan.extra["loss_sampling_rate"],
                },
                free="clip_norm: C_l is adapted per client from released losses (the charge "
                "does not depend on C)",
            )
        )
    meta = plan.summary()
    common.update(
        clip_norm=plan.clip_norm,
        noise_multiplier=plan.noise_multiplier,
        max_rounds=plan.step_budget,
    )
    upload = LossUpload(
        noise_multiplier=plan.extra["loss_noise_multiplier"],
        sampling_rate=plan.extra["loss_sampling_rate"],
        clip_init=opts.loss_clip_init,
        clip_floor=opts.loss_clip_floor,
        clip_multiplier=opts.loss_clip_multiplier,
    )
    sigma, q = plan.noise_multiplier, plan.sampling_rate
    with as_config_error(f"experiment.algorithm.fedfdp ({name})"):
        algorithm = _private(name, opts, common, dataset, model, upload, sigma, q)
    if name == "fedfdp":
        meta.update(
            fair_clip_mode=opts.clip_mode,
            lambda_mode=opts.lambda_mode,
            lam=opts.lam,
            dp_guarantee=(
                "holds for every lambda (sign-safe fair clipping, every contribution <= C)"
                if opts.clip_mode != "paper"
                else "NOT GUARANTEED: clip_mode=paper (Eq. 13 verbatim) has unbounded "
                "sensitivity whenever 1+lambda*Delta < 0; see unaccounted_releases"
            ),
        )
    return algorithm, plan.ledger(), meta


def _nonprivate(name: str, opts: Any, common: dict[str, Any], num_clients: int) -> Algorithm:
    if name == "fedfair":
        return FedFair(
            lam=opts.lam,
            initial_global_loss=opts.initial_global_loss,
            loss_eval=opts.fedfair_loss_eval,
            min_factor=opts.fedfair_min_factor,
            **common,
        )
    if name == "fedprox":
        return FedProx(mu=opts.prox_mu, **common)
    if name == "scaffold":
        return Scaffold(global_lr=opts.scaffold_global_lr, num_clients=num_clients, **common)
    if name == "feddyn":
        return FedDyn(alpha=opts.feddyn_alpha, num_clients=num_clients, **common)
    if name == "qffl":
        return QFFL(qffl_q=opts.qffl_q, **common)
    raise ConfigError("experiment.algorithm.name", f"unknown fedfdp algorithm {name!r}")


def _private(
    name: str,
    opts: Any,
    common: dict[str, Any],
    dataset: FederatedDataset,
    model: nn.Module,
    upload: LossUpload,
    sigma: float,
    q: float,
) -> Algorithm:
    n = dataset.num_clients
    if name == "fedfdp":
        constants = None
        if opts.lambda_mode != "fixed":
            b = opts.bound
            clip = common["clip_norm"]
            constants = BoundConstants(
                L=b.L,
                mu=b.mu,
                G=clip,
                Gamma=b.Gamma,
                Q0=-opts.initial_global_loss,
                Q1=max(opts.loss_clip_init - opts.initial_global_loss, 1e-6),
                dist0_sq=b.dist0_sq,
                sigma=sigma,
                C=clip,
                d=sum(p.numel() for p in model.parameters() if p.requires_grad),
                B_hat=max(1.0, q * float(dataset.train_sizes().min())),
            )
        fedfdp = FedFDP(
            lam=opts.lam,
            loss_upload=upload,
            clip_mode=opts.clip_mode,
            initial_global_loss=opts.initial_global_loss,
            lambda_mode=opts.lambda_mode,
            bound_constants=constants,
            drop_mu_sq=opts.bound.drop_mu_sq,
            **common,
        )
        if opts.clip_mode == "paper":  # the run-level opt-out (allow_not_dp, checked above)
            setattr(fedfdp, UNBOUNDED_WEIGHT_RULES, True)
        return fedfdp
    if name == "dp_fedprox":
        return DPFedProx(mu=opts.prox_mu, **common)
    if name == "dp_scaffold":
        return DPScaffold(global_lr=opts.scaffold_global_lr, num_clients=n, **common)
    if name == "dp_feddyn":
        return DPFedDyn(alpha=opts.feddyn_alpha, num_clients=n, **common)
    if name == "dp_qffl":
        init = opts.qffl_init_loss
        return DPQFFL(
            qffl_q=opts.qffl_q,
            loss_upload=upload,
            init_loss=init if init is not None else math.log(dataset.num_classes),
            **common,
        )
    raise ConfigError("experiment.algorithm.name", f"unknown fedfdp algorithm {name!r}")
