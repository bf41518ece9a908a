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
from raydpfl.papers.dpfl_bcs import models as _dpfl_bcs  # noqa: F401  (registers its models)
from raydpfl.papers.rc_dpfl import models as _rc_dpfl  # noqa: F401  (registers its models)

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
