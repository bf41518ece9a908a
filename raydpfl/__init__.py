"""raydpfl: a Ray-based, scalable simulator for differentially-private federated learning.

From Python (the docs: docs/tutorial/own-algorithm.md, docs/reference/api.md):

    import raydpfl
    result = raydpfl.run_simulation("configs/quickstart.yaml", model=MyNet, algorithm=...)
    sweep = raydpfl.run_sweep("configs/quickstart.yaml", {"algorithm.lr": {"grid": [0.1, 0.5]}})

A new algorithm, model or dataset is registered by name (`register_algorithm`,
`register_model`, `register_dataset`; see `raydpfl.registry`) and then named in a config
like a built-in. These names are loaded on first use,
so importing the package stays cheap and never imports Ray. The command line
(`raydpfl run CONFIG`) is a thin user of the same functions.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

#: Public names and the modules they live in (imported on first access).
_EXPORTS = {
    "run_simulation": "raydpfl.api",
    "SimulationResult": "raydpfl.api",
    "to_config": "raydpfl.api",
    "run_sweep": "raydpfl.api",
    "resume_sweep": "raydpfl.api",
    "SweepResult": "raydpfl.api",
    "SweepFailedError": "raydpfl.api",
    "Config": "raydpfl.config",
    "ConfigError": "raydpfl.config",
    "load_config": "raydpfl.config",
    "register_algorithm": "raydpfl.registry",
    "register_model": "raydpfl.registry",
    "register_dataset": "raydpfl.registry",
    "Callback": "raydpfl.callbacks",
    "run_audit": "raydpfl.audit",
    "AuditResult": "raydpfl.audit",
    # Writing an algorithm: the contract (raydpfl/algorithms/base.py) ...
    "Algorithm": "raydpfl.algorithms.base",
    "ClientTask": "raydpfl.algorithms.base",
    "ClientResult": "raydpfl.algorithms.base",
    "ClientContext": "raydpfl.algorithms.base",
    "ClientData": "raydpfl.algorithms.base",
    "WeightedUpdateSum": "raydpfl.algorithms.base",
    "ServerRound": "raydpfl.algorithms.base",
    "privacy_session": "raydpfl.algorithms.base",
    "dp_sgd_local_update": "raydpfl.algorithms.local_dp_sgd",
    "noisy_loss_query": "raydpfl.algorithms.local_dp_sgd",
    # ... and the privacy kernel its tasks declare (docs/architecture.md).
    "SubsampledGaussian": "raydpfl.privacy.mechanisms.kernel",
    "GaussianRelease": "raydpfl.privacy.mechanisms.kernel",
    "CertifiedGaussianRelease": "raydpfl.privacy.mechanisms.kernel",
    "LaplaceRelease": "raydpfl.privacy.mechanisms.kernel",
    "ExponentialSelection": "raydpfl.privacy.mechanisms.kernel",
    "MechanismUse": "raydpfl.privacy.mechanisms.kernel",
    "uses": "raydpfl.privacy.mechanisms.kernel",
    "PrivacyContractError": "raydpfl.privacy.mechanisms.kernel",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'raydpfl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
