"""The core algorithms: FedAvg and DP-FedAvg (`raydpfl.config.schema`'s own algorithm names)."""

from __future__ import annotations

from typing import Any

import torch

from raydpfl.algorithms import Algorithm, DPFedAvg, FedAvg
from raydpfl.config.schema import Config, ConfigError
from raydpfl.data.federated import FederatedDataset
from raydpfl.experiment.privacy_settings import check_delta, plan_dp_sgd
from raydpfl.privacy.accounting.ledger import PrivacyLedger


def build(
    config: Config, dataset: FederatedDataset, model: torch.nn.Module
) -> tuple[Algorithm, PrivacyLedger | None, dict[str, Any]]:
    """The algorithm named by `config`, its ledger (None if non-private) and metadata."""
    exp = config.experiment
    algo, privacy = exp.algorithm, exp.privacy
    sizes = dataset.train_sizes()
    if algo.name == "fedavg":
        fedavg = FedAvg(
            clients_per_round=algo.clients_per_round,
            local_steps=algo.local_steps,
            lr=algo.lr,
            batch_size=algo.batch_size,
            **server_optimizer_kwargs(config),
        )
        return fedavg, None, {"unit": "none: non-private run (epsilon is infinite)"}
    check_delta(privacy.delta, sizes)
    if algo.name == "dp_fedavg":
        plan = plan_dp_sgd(privacy, algo.rounds * algo.local_steps)
        algorithm: Algorithm = DPFedAvg(
            clients_per_round=algo.clients_per_round,
            local_steps=algo.local_steps,
            lr=algo.lr,
            clip_norm=plan.clip_norm,
            noise_multiplier=plan.noise_multiplier,
            sampling_rate=plan.sampling_rate,
            # Post-processing of the noised aggregate: no privacy cost, nothing charged.
            **server_optimizer_kwargs(config),
        )
        return algorithm, plan.ledger(), plan.summary()
    raise ConfigError("experiment.algorithm.name", f"{algo.name!r} is not a core algorithm")


def server_optimizer_kwargs(config: Config) -> dict[str, Any]:
    """``experiment.algorithm.server`` as FedAvg's and DP-FedAvg's keyword arguments."""
    server = config.experiment.algorithm.server
    return {
        "server_optimizer": server.optimizer,
        "server_lr": server.lr,
        "server_momentum": server.momentum,
        "server_beta2": server.beta2,
        "server_adam_eps": server.adam_eps,
        "aggregator": server.aggregator,
        "trim_fraction": server.trim_fraction,
    }
