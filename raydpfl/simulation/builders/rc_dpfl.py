"""Builds the rc_dpfl algorithms from `experiment.algorithm.rc_dpfl` and the
cluster-structured data of `experiment.data.cluster_shift` (see `raydpfl.config.rc_dpfl`)."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from raydpfl.algorithms.base import Algorithm
from raydpfl.config.schema import Config, ConfigError, DataConfig
from raydpfl.data.federated import FederatedDataset
from raydpfl.privacy.ledger import PrivacyLedger


def build(
    config: Config, dataset: FederatedDataset, model: nn.Module
) -> tuple[Algorithm, PrivacyLedger | None, dict[str, Any]]:
    """The algorithm named by `config`, its ledger (None if non-private) and metadata."""
    raise ConfigError(
        "experiment.algorithm.name", f"{config.experiment.algorithm.name!r} is not built yet"
    )


def load_clustered(data: DataConfig, rng: np.random.Generator) -> FederatedDataset:
    """The federated dataset with cluster structure (`data.cluster_shift.kind != none`)."""
    raise ConfigError("experiment.data.cluster_shift.kind", "not built yet")
