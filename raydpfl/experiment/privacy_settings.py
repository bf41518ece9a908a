"""What a run's ε means and the config-level privacy settings every builder shares.

The generic calibration (σ for a target ε under an accountant) lives in
`raydpfl.privacy.accounting.calibration`; this module turns a `PrivacyConfig` into its
arguments and into the privacy statement of summary.json.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from raydpfl.config import as_config_error
from raydpfl.config.schema import MIN_NOISE_MULTIPLIER, ConfigError, PrivacyConfig
from raydpfl.privacy.accounting.accountants import describe_accountant
from raydpfl.privacy.accounting.calibration import noise_multiplier_for
from raydpfl.privacy.accounting.plan import PrivacyPlan

#: What a reported ε means; copied into every private run's summary.json.
PRIVACY_STATEMENT = {
    "unit": "record: one training example of one client (per-client record-level DP)",
    "adjacency": "add or remove one training record of the client",
    "mechanism": "Poisson-subsampled Gaussian (DP-SGD), composed over every local step "
    "the client ran",
    "sampling": "Poisson sampling of each client's records in every DP-SGD step; cohorts are "
    "drawn uniformly without replacement and treated as public: no amplification from client "
    "sampling is claimed and a client is charged only for the rounds it trains in",
    "covers": "every model the client released in every round (charged before dispatch)",
    "noise_source": "research mode: seeded PyTorch PRNG (reproducible; not floating-point secure)",
    "tuning": "not included: epsilon is per run, excluding any hyperparameter search",
}


#: The summary's ``noise_source`` under ``privacy.secure_noise: true``.
SECURE_NOISE_SOURCE = (
    "secure mode: Poisson sampling and the DP noise of every mechanism that draws through "
    "raydpfl.privacy.per_sample.dpsgd (DP-SGD in every engine and the vectorised path, DPFL-BCS's "
    "Gaussian and Laplace noise, FedFDP's and Adap DP-FL's loss noise, PE-DPFL's update "
    "noise, client-level DP-FedAvg's aggregate noise, noise shares and client sampling) "
    "from os.urandom (Gaussians: Box-Muller in float64, each value the sum of 4 draws "
    "scaled to the std, as Opacus' secure_mode); any other draw from a client's stream (e.g. "
    "RC-DPFL's GMM-stage noise, shuffles) comes from a PRNG seeded from the OS, not hardened "
    "against floating-point attacks; not reproducible"
)


def _counter_noise_source(label: str, method: str, module: str) -> str:
    return (
        f"research mode, {label} sampler: the Gaussian noise drawn through "
        f"raydpfl.privacy.per_sample.dpsgd from a client's seeded stream comes from {method} over "
        "counter-based SplitMix64 words keyed by one draw of that stream per noise tensor "
        f"(raydpfl/privacy/noise/{module}.py); everything else from the seeded PyTorch PRNG "
        "(reproducible; not floating-point secure)"
    )


#: The summary's ``noise_source`` under ``privacy.noise_sampler: ziggurat`` or ``boxmuller``.
COUNTER_NOISE_SOURCES = {
    "ziggurat": _counter_noise_source("ziggurat", "a 256-layer ziggurat", "ziggurat"),
    "boxmuller": _counter_noise_source(
        "Box-Muller",
        "a vectorised Box-Muller transform (53-bit uniforms, |z| < 8.65)",
        "boxmuller",
    ),
}


def apply_noise_mode(
    algorithm: Any, privacy_meta: dict[str, Any], secure: bool, sampler: str = "torch"
) -> None:
    """Sets the run's noise source: on the algorithm, which every worker process receives
    (`ClientWorker` reads ``algorithm.secure_noise`` and ``algorithm.noise_sampler``), and
    in the summary's privacy statement, so that it says which source was used."""
    algorithm.secure_noise = bool(secure)
    algorithm.noise_sampler = sampler
    if secure:
        privacy_meta["noise_source"] = SECURE_NOISE_SOURCE
    elif sampler in COUNTER_NOISE_SOURCES:
        privacy_meta["noise_source"] = COUNTER_NOISE_SOURCES[sampler]


#: The summary's ``sampling`` under ``privacy.batch_shape: fixed`` ({cap}: B).
TRUNCATED_SAMPLING = (
    "Poisson sampling of each client's records in every DP-SGD step, truncated at "
    "max_batch_size = {cap} records (a uniformly random subset of a larger sample), charged "
    "as the truncated Poisson event (raydpfl/privacy/accounting/truncation.py); cohorts are "
    "drawn uniformly without replacement and treated as public: no amplification from client "
    "sampling is claimed and a client is charged only for the rounds it trains in"
)


def privacy_metadata(privacy: PrivacyConfig) -> dict[str, Any]:
    """The privacy statement and the run's privacy settings (summary.json)."""
    out = {
        **PRIVACY_STATEMENT,
        "accountant": describe_accountant(privacy.accountant),
        "epsilon_budget": privacy.epsilon,
        "delta": privacy.delta,
        "sampling_rate": privacy.sampling_rate,
        "clip_norm": privacy.clip_norm,
    }
    if privacy.batch_shape == "fixed":
        out["sampling"] = TRUNCATED_SAMPLING.format(cap=privacy.max_batch_size)
        out.update(batch_shape="fixed", max_batch_size=privacy.max_batch_size)
    return out


def noise_multiplier(privacy: PrivacyConfig, max_steps: int) -> tuple[float, bool]:
    """σ from the config, or calibrated so that `max_steps` steps spend at most ε."""
    if privacy.noise_multiplier is not None:
        return privacy.noise_multiplier, False
    with as_config_error("experiment.privacy.noise_multiplier", "cannot calibrate: "):
        sigma = noise_multiplier_for(
            privacy.epsilon, privacy.delta, privacy.sampling_rate, max_steps, privacy.accountant
        )
    check_calibrated_floor(sigma, f"epsilon={privacy.epsilon:g} over {max_steps} steps")
    return sigma, True


def check_calibrated_floor(sigma: float, what: str) -> None:
    """A calibrated σ must respect the floor a configured one does (`MIN_NOISE_MULTIPLIER`):
    a budget so large that σ < 0.01 spends it is refused, not run with near-zero noise."""
    if 0 < sigma < MIN_NOISE_MULTIPLIER:
        raise ConfigError(
            "experiment.privacy.noise_multiplier",
            f"calibrated to {sigma:.3g} for {what}, below the floor {MIN_NOISE_MULTIPLIER:g} "
            "a configured sigma must respect (no useful privacy); lower the epsilon budget, "
            f"or set noise_multiplier >= {MIN_NOISE_MULTIPLIER:g}",
        )


def check_delta(delta: float, sizes: np.ndarray) -> None:
    largest = int(sizes.max())
    if delta >= 1.0 / largest:
        raise ConfigError(
            "experiment.privacy.delta",
            f"must be < 1/|D_i| = {1.0 / largest:.3g} for the largest client ({largest} records); "
            f"got {delta}",
        )


def record_plan(
    privacy: PrivacyConfig,
    noise_multiplier: float,
    calibrated: bool,
    *,
    metadata: dict[str, Any] | None = None,
    **fields: Any,
) -> PrivacyPlan:
    """A record-level plan on the config's accountant, δ, ε budget, C and q with the
    decided σ; `metadata` adds to the statement (after σ), `fields` override the plan's
    own (e.g. ``epsilon=None`` for an uncapped ledger, ``step_budget``)."""
    meta = privacy_metadata(privacy)
    meta.update(noise_multiplier=noise_multiplier, noise_calibrated=calibrated)
    meta.update(metadata or {})
    plan: dict[str, Any] = dict(
        unit="record",
        accountant=privacy.accountant,
        delta=privacy.delta,
        epsilon=privacy.epsilon,
        clip_norm=privacy.clip_norm,
        noise_multiplier=noise_multiplier,
        sampling_rate=privacy.sampling_rate,
        noise_calibrated=calibrated,
        metadata=meta,
    )
    plan.update(fields)
    made = PrivacyPlan(**plan)
    if "mechanisms" in fields:
        return made
    return made.with_mechanisms(made.dp_sgd_planned())  # DP-SGD at the plan's σ, C, q


def plan_dp_sgd(privacy: PrivacyConfig, max_steps: int) -> PrivacyPlan:
    """DP-FedAvg's privacy plan: σ from the config or calibrated so that `max_steps` DP-SGD
    steps spend ε, with the config's C, q, δ and accountant (record-level, per client)."""
    return record_plan(privacy, *noise_multiplier(privacy, max_steps))
