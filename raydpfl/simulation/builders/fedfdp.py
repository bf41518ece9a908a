"""Builds the fedfdp algorithms from `experiment.algorithm.fedfdp`."""

from __future__ import annotations

from typing import Any

from torch import nn

from raydpfl.algorithms.base import Algorithm
from raydpfl.config.schema import Config, ConfigError
from raydpfl.data.federated import FederatedDataset
from raydpfl.privacy.ledger import PrivacyLedger


def build(
    config: Config, dataset: FederatedDataset, model: nn.Module
) -> tuple[Algorithm, PrivacyLedger | None, dict[str, Any]]:
    """The algorithm named by `config`, its ledger (None if non-private) and metadata."""
    raise ConfigError(
        "experiment.algorithm.name", f"{config.experiment.algorithm.name!r} is not built yet"
    )
