"""The typed config tree, loaded strictly from YAML (see `schema` and `load`)."""

from raydpfl.config import client_level as _client_level  # noqa: F401 (registers it)
from raydpfl.config._base import as_config_error, did_you_mean
from raydpfl.config.load import apply_override, config_from_dict, dump_config, load_config
from raydpfl.config.schema import (
    AlgorithmConfig,
    Config,
    ConfigError,
    DataConfig,
    ExperimentConfig,
    ModelConfig,
    PartitionConfig,
    PrivacyConfig,
    RuntimeConfig,
    SyntheticConfig,
)

__all__ = [
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "ExperimentConfig",
    "ModelConfig",
    "PartitionConfig",
    "PrivacyConfig",
    "RuntimeConfig",
    "SyntheticConfig",
    "apply_override",
    "as_config_error",
    "config_from_dict",
    "did_you_mean",
    "dump_config",
    "load_config",
]
