"""Model zoo (see `raydpfl.models.zoo`)."""

from raydpfl.models import dpfl_bcs as _dpfl_bcs  # noqa: F401  (registers its models)
from raydpfl.models import rc_dpfl as _rc_dpfl  # noqa: F401  (registers its models)
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
