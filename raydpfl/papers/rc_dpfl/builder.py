"""Builds the rc_dpfl algorithms from `experiment.algorithm.rc_dpfl` and the
cluster-structured data of `experiment.data.cluster_shift` (see `raydpfl.papers.rc_dpfl.options`).

Privacy calibration (per client i, N_i = |D_i|, q_i = b/N_i, T_i = K·⌈N_i/b⌉ steps/round):

- ``rc_dpfl``: z_i = `two_stage_noise_multiplier` on the history (z, 1, K) + (z, q_i,
  (E−1)·T_i) [+ the private selections], bisection to the budget ε (§5.2);
- the baselines: z_i = `noise_multiplier_for(ε, δ, q_i, E·T_i)` (single stage).

Both use the ledger's accountant, so the ε the ledger reports is ε(z_i) ≤ budget. A fixed
`experiment.privacy.noise_multiplier` is used as is, if its planned ε fits the budget.
`experiment.privacy.sampling_rate` and `experiment.algorithm.local_steps` are not used
(the rate is b/N_i and a round is K epochs).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from raydpfl.algorithms.base import Algorithm
from raydpfl.config import as_config_error
from raydpfl.config.schema import Config, ConfigError
from raydpfl.data.cluster_shift import true_clusters
from raydpfl.data.federated import FederatedDataset
from raydpfl.papers.rc_dpfl.algorithm import RcDpfl
from raydpfl.papers.rc_dpfl.baselines import (
    ClusteredDPFedAvg,
    IfcaCDPFL,
    KMeansCDPFL,
    LocalDPSGD,
    MrMtl,
    OracleCDPFL,
)
from raydpfl.papers.rc_dpfl.privacy_plan import plan_privacy
from raydpfl.privacy.accounting.ledger import PrivacyLedger
from raydpfl.simulation.seeding import NO_ROUND, SERVER, derive_seed

_CLUSTERED = ("rc_dpfl", "km_cdpfl", "f_cdpfl", "o_cdpfl", "rc_local", "mr_mtl")


def build(
    config: Config, dataset: FederatedDataset, model: nn.Module
) -> tuple[Algorithm, PrivacyLedger | None, dict[str, Any]]:
    """The algorithm named by `config`, its ledger (None if non-private) and metadata."""

    exp, rt = config.experiment, config.runtime
    algo, rc = exp.algorithm, exp.algorithm.typed_options()
    sizes = dataset.train_sizes()
    n = len(sizes)
    if algo.clients_per_round != n:
        raise ConfigError(
            "experiment.algorithm.clients_per_round",
            f"{algo.name} trains every client every round: set it to num_clients ({n})",
        )
    if algo.name in _CLUSTERED and exp.data.client_test_fraction <= 0:
        raise ConfigError(
            "experiment.data.client_test_fraction",
            f"{algo.name} scores each client with its own model: needs client test splits",
        )
    clusters = true_clusters(dataset)
    if algo.name == "o_cdpfl" and clusters is None:
        raise ConfigError(
            "experiment.data.cluster_shift.kind", "o_cdpfl needs cluster-structured data"
        )
    m = rc.num_clusters
    if algo.name in ("rc_dpfl", "km_cdpfl", "f_cdpfl") and m > n:
        raise ConfigError(
            "experiment.algorithm.rc_dpfl.num_clusters", f"must be <= num_clients ({n})"
        )
    if algo.name == "rc_dpfl":
        _check_gmm_options(rc, n)
    plan = plan_privacy(config, sizes)
    sel_eps, sel_rounds = plan.extra["selection_epsilon"], plan.extra["selection_rounds"]
    common: dict[str, Any] = dict(
        num_clients=n,
        lr=algo.lr,
        clip_norm=plan.clip_norm,
        noise_multipliers=plan.extra["noise_multipliers"],
        batch_size=rc.batch_size,
        local_epochs=rc.local_epochs,
        seed=rt.seed,
        true_clusters=None if clusters is None else clusters.tolist(),
    )
    with as_config_error(f"experiment.algorithm.{algo.name}"):
        algorithm = _make(config, model, common, sel_eps, sel_rounds, clusters)
    meta = plan.summary()
    meta.update(true_clusters=None if clusters is None else clusters.tolist())
    return algorithm, plan.ledger(), meta


def _check_gmm_options(rc: Any, n: int) -> None:
    if rc.gmm_feature_space == "pca" and rc.d_pca > n - 1:
        raise ConfigError(
            "experiment.algorithm.rc_dpfl.d_pca", f"must be <= num_clients - 1 ({n - 1})"
        )
    if rc.select_num_clusters == "mss" and n < 3:
        raise ConfigError(
            "experiment.algorithm.rc_dpfl.select_num_clusters", "mss needs at least 3 clients"
        )


def _make(
    config: Config,
    model: nn.Module,
    common: dict[str, Any],
    sel_eps: float | None,
    sel_rounds: int,
    clusters: np.ndarray | None,
) -> Algorithm:
    exp, rt = config.experiment, config.runtime
    algo, rc = exp.algorithm, exp.algorithm.typed_options()
    name = algo.name
    if name == "rc_dpfl":
        return RcDpfl(
            num_models=rc.num_clusters,
            rounds=algo.rounds,
            gmm_stage_rounds=rc.gmm_stage_rounds,
            select_num_clusters=rc.select_num_clusters,
            feature_space=rc.gmm_feature_space,
            d_pca=rc.d_pca,
            scaler=rc.scaler,
            round1_init=rc.round1_init,
            selection_epsilon=sel_eps,
            selection_rounds=sel_rounds,
            **common,
        )
    if name == "rc_dp_fedavg":
        return ClusteredDPFedAvg(**common)
    if name == "o_cdpfl":
        assert clusters is not None
        return OracleCDPFL(clusters=clusters.tolist(), **common)
    if name == "rc_local":
        return LocalDPSGD(**common)
    if name == "mr_mtl":
        return MrMtl(reg_weight=rc.mr_mtl_lambda, **common)
    if name == "km_cdpfl":
        return KMeansCDPFL(num_models=rc.num_clusters, features=rc.kmeans_features, **common)
    if name == "f_cdpfl":
        return IfcaCDPFL(init_models=_random_inits(model, rc.num_clusters, rt.seed), **common)
    raise ConfigError("experiment.algorithm.name", f"{name!r} is not an rc_dpfl algorithm")


def _random_inits(model: nn.Module, count: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """M independent initialisations of `model`'s architecture (f-CDPFL, §6.14): model 0 is
    the run's θ^init, model m > 0 re-initialised on its own seeded stream."""
    import copy

    out = [{n: p.detach().clone() for n, p in model.named_parameters()}]
    for m in range(1, count):
        fresh = copy.deepcopy(model)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, NO_ROUND, SERVER, f"f_cdpfl_init_{m}"))
            for module in fresh.modules():
                if hasattr(module, "reset_parameters") and module is not fresh:
                    module.reset_parameters()
        out.append({n: p.detach().clone() for n, p in fresh.named_parameters()})
    return out
