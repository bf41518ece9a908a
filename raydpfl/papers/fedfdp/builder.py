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
from raydpfl.config.schema import Config, ConfigError, server_optimizer_algorithms
from raydpfl.data.federated import FederatedDataset
from raydpfl.experiment.builders.core import server_optimizer_kwargs
from raydpfl.experiment.privacy_settings import check_delta, privacy_metadata
from raydpfl.papers.fedfdp.accounting import fedfdp_history, max_rounds, max_rounds_paper
from raydpfl.papers.fedfdp.algorithm import FedFDP
from raydpfl.papers.fedfdp.convergence import BoundConstants
from raydpfl.papers.fedfdp.feddyn import DPFedDyn, FedDyn
from raydpfl.papers.fedfdp.fedfair import FedFair
from raydpfl.papers.fedfdp.fedprox import DPFedProx, FedProx
from raydpfl.papers.fedfdp.loss_upload import LossUpload
from raydpfl.papers.fedfdp.options import PRIVATE_NAMES
from raydpfl.papers.fedfdp.qffl import DPQFFL, QFFL
from raydpfl.papers.fedfdp.scaffold import DPScaffold, Scaffold
from raydpfl.privacy.accountants import compute_epsilon
from raydpfl.privacy.calibration import largest_feasible_steps
from raydpfl.privacy.ledger import PrivacyLedger

#: Private algorithms that also release a loss each round (a second mechanism).
LOSS_RELEASING = ("fedfdp", "dp_qffl")


def build(
    config: Config, dataset: FederatedDataset, model: nn.Module
) -> tuple[Algorithm, PrivacyLedger | None, dict[str, Any]]:
    """The algorithm named by `config`, its ledger (None if non-private) and metadata."""
    exp = config.experiment
    algo, privacy, opts = exp.algorithm, exp.privacy, exp.algorithm.typed_options()
    name = algo.name
    sizes = dataset.train_sizes()
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

    check_delta(privacy.delta, sizes)
    sigma = privacy.noise_multiplier
    if sigma is None:
        raise ConfigError(
            "experiment.privacy.noise_multiplier",
            f"{name} needs a fixed sigma (the budget sets the number of rounds; paper: 2.0)",
        )
    q, tau = privacy.sampling_rate, algo.local_steps
    q_l = opts.loss_sampling_rate if opts.loss_sampling_rate is not None else q
    sigma_l = opts.loss_noise_multiplier
    releases_loss = name in LOSS_RELEASING
    try:
        history_of = _history_fn(releases_loss, sigma, q, tau, sigma_l, q_l)
        t_full = (
            max_rounds(
                privacy.epsilon,
                privacy.delta,
                sampling_rate=q,
                noise_multiplier=sigma,
                loss_noise_multiplier=sigma_l,
                loss_sampling_rate=q_l,
                local_steps=tau,
                accountant=privacy.accountant,
            )
            if releases_loss
            else largest_feasible_steps(
                lambda t: (
                    compute_epsilon(history_of(t), privacy.delta, privacy.accountant)
                    <= privacy.epsilon
                )
            )
        )
        t_paper = max_rounds_paper(
            privacy.epsilon,
            privacy.delta,
            sampling_rate=q,
            noise_multiplier=sigma,
            local_steps=tau,
        )
    except ValueError as e:
        raise ConfigError("experiment.privacy", f"cannot derive the round budget: {e}") from None
    mode = opts.rounds_from_budget
    if mode == "full":
        if t_full < 1:
            raise ConfigError(
                "experiment.privacy.epsilon",
                f"the budget allows no round at sigma={sigma}, q={q}; raise epsilon",
            )
        max_r: int | None = t_full
        ledger = PrivacyLedger(privacy.accountant, privacy.delta, privacy.epsilon)
    elif mode == "paper_model_only":
        max_r = t_paper
        # The paper's T overshoots the budget when a loss is released: no cap, so the
        # ledger charges every release and reports the ε really spent.
        ledger = PrivacyLedger(privacy.accountant, privacy.delta, None)
    else:
        max_r = None
        ledger = PrivacyLedger(privacy.accountant, privacy.delta, privacy.epsilon)
    eps_paper_t = compute_epsilon(history_of(t_paper), privacy.delta, privacy.accountant)
    meta = privacy_metadata(privacy)
    meta.update(
        noise_multiplier=sigma,
        noise_calibrated=False,
        rounds_from_budget=mode,
        rounds_budget_full=t_full,
        rounds_budget_paper_model_only=t_paper,
        epsilon_at_paper_rounds=eps_paper_t,
        rounds_run_at_most=min(algo.rounds, max_r) if max_r is not None else algo.rounds,
        mechanisms=(
            ["gradient SGM(q, sigma) x local_steps per round", "loss SGM(q_l, sigma_l) per round"]
            if releases_loss
            else ["gradient SGM(q, sigma) x local_steps per round"]
        ),
    )
    if releases_loss:
        meta.update(
            covers="every model and every loss value the client released in every round "
            "(each charged before dispatch: the model as SGM(q, sigma) x local_steps, the "
            "loss as SGM(q_l, sigma_l))",
            loss_noise_multiplier=sigma_l,
            loss_sampling_rate=q_l,
            loss_batch="independent Poisson sample (composes additively with the gradient)",
        )
    if mode == "paper_model_only" and releases_loss:
        meta["budget_note"] = (
            f"rounds set by the paper's gradient-only count ({t_paper}); the loss upload is "
            f"charged too, so the delivered epsilon is {eps_paper_t:.3f}, not the "
            f"{privacy.epsilon} budget (the ledger is uncapped and reports it)"
        )
    common.update(
        clip_norm=privacy.clip_norm,
        noise_multiplier=sigma,
        max_rounds=max_r,
    )
    upload = LossUpload(
        noise_multiplier=sigma_l,
        sampling_rate=q_l,
        clip_init=opts.loss_clip_init,
        clip_floor=opts.loss_clip_floor,
        clip_multiplier=opts.loss_clip_multiplier,
    )
    try:
        algorithm = _private(name, opts, common, dataset, model, upload, sigma, q)
    except ValueError as e:
        raise ConfigError(f"experiment.algorithm.fedfdp ({name})", str(e)) from None
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
    return algorithm, ledger, meta


def _history_fn(releases_loss: bool, sigma: float, q: float, tau: int, sigma_l: float, q_l: float):
    def history(t: int) -> list[tuple[float, float, int]]:
        if releases_loss:
            return fedfdp_history(
                t,
                sampling_rate=q,
                noise_multiplier=sigma,
                loss_noise_multiplier=sigma_l,
                loss_sampling_rate=q_l,
                local_steps=tau,
            )
        return [(sigma, q, t * tau)]

    return history


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
        return FedFDP(
            lam=opts.lam,
            loss_upload=upload,
            clip_mode=opts.clip_mode,
            initial_global_loss=opts.initial_global_loss,
            lambda_mode=opts.lambda_mode,
            bound_constants=constants,
            drop_mu_sq=opts.bound.drop_mu_sq,
            **common,
        )
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
