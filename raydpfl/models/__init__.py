"""Model zoo (see `raydpfl.models.zoo`)."""

from raydpfl.models.zoo import (
    MLP,
    MODELS,
    FedAvgCNN,
    LogisticRegression,
    assert_dp_compatible,
    build_model,
    num_parameters,
    register_model,
)

__all__ = [
    "MLP",
    "MODELS",
    "FedAvgCNN",
    "LogisticRegression",
    "assert_dp_compatible",
    "build_model",
    "num_parameters",
    "register_model",
]
