"""RC-DPFL's privacy plan: each client's σ_i (z_i) over its own Poisson rate b/|D_i| and the
rounds of the run, under the two-stage accounting of ``rc_dpfl`` (a full-batch round 1,
then DP-SGD rounds) or the single-stage one of its baselines, plus the private cluster
selection's share of ε under ``selection_privacy: gumbel`` (shared/specs/robust-clustering.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from raydpfl.config import as_config_error
from raydpfl.config.schema import Config, ConfigError
from raydpfl.experiment.privacy_settings import check_delta, record_plan
from raydpfl.papers.rc_dpfl.accounting import (
    steps_per_round,
    two_stage_epsilon,
    two_stage_noise_multiplier,
)
from raydpfl.privacy.accounting.accountants import compute_epsilon
from raydpfl.privacy.accounting.calibration import noise_multiplier_for
from raydpfl.privacy.accounting.plan import PerClient, PlannedMechanism, PrivacyPlan
from raydpfl.privacy.mechanisms.kernel import ExponentialSelection, SubsampledGaussian


def plan_privacy(config: Config, sizes: np.ndarray) -> PrivacyPlan:
    """The plan: per-client σ (``extra["noise_multipliers"]``; `noise_multiplier` is their
    largest), C, the selection's ε and rounds (``extra``), the ledger's budget and the
    statement (sampling at q_i = b/|D_i|; `experiment.privacy.sampling_rate` unused)."""
    exp = config.experiment
    algo, privacy, rc = exp.algorithm, exp.privacy, exp.algorithm.typed_options()
    check_delta(privacy.delta, sizes)
    gumbel = algo.name == "rc_dpfl" and rc.selection_privacy == "gumbel"
    if gumbel and privacy.accountant not in ("rdp", "dp_rdp"):
        raise ConfigError(
            "experiment.algorithm.rc_dpfl.selection_privacy",
            f"gumbel selection composes in RDP only; accountant is {privacy.accountant!r}",
        )
    sel_rounds = (rc.selection_rounds or math.ceil(0.1 * algo.rounds)) if gumbel else 0
    sel_eps = rc.selection_epsilon_fraction * privacy.epsilon if gumbel else None
    zs, planned = _noise_multipliers(
        config,
        sizes,
        two_stage=algo.name == "rc_dpfl",
        selection_rounds=sel_rounds,
        selection_epsilon=sel_eps,
    )
    return record_plan(
        privacy,
        float(max(zs)),
        privacy.noise_multiplier is None,
        metadata=dict(
            sampling_rate=None,
            sampling="Poisson at q_i = b/|D_i| (experiment.privacy.sampling_rate is not used)",
            batch_size=rc.batch_size,
            local_epochs=rc.local_epochs,
            noise_multipliers_per_client=[float(z) for z in zs],
            planned_epsilon_max=float(max(planned)),
            accounting="two_stage (full-batch round 1 + Poisson rounds)"
            if algo.name == "rc_dpfl"
            else "single_stage",
            selection_privacy=rc.selection_privacy if algo.name == "rc_dpfl" else None,
            selection_epsilon=sel_eps,
            selection_rounds=sel_rounds,
        ),
        sampling_rate=None,
        mechanisms=_planned(zs, privacy.clip_norm, sel_eps),
        extra={
            "noise_multipliers": zs,
            "selection_epsilon": sel_eps,
            "selection_rounds": sel_rounds,
        },
    )


def _planned(
    zs: Sequence[float], clip: float, selection_epsilon: float | None
) -> tuple[PlannedMechanism, ...]:
    """DP-SGD at each client's own z_i and the config's C (q_i = b/|D_i|, or 1 in a
    full-batch round, from the public dataset sizes), and the private cluster choice."""
    steps = PlannedMechanism(
        SubsampledGaussian,
        {"noise_multiplier": PerClient(tuple(float(z) for z in zs)), "clip_norm": float(clip)},
        free="sampling_rate: q_i = b/|D_i| (or 1 in a full-batch round) from the public "
        "dataset sizes",
    )
    if selection_epsilon is None:
        return (steps,)
    return steps, PlannedMechanism(ExponentialSelection, {"epsilon": float(selection_epsilon)})


def _noise_multipliers(
    config: Config,
    sizes: np.ndarray,
    *,
    two_stage: bool,
    selection_rounds: int,
    selection_epsilon: float | None,
) -> tuple[list[float], list[float]]:
    """z_i per client and the ε each would have spent after all rounds."""
    exp = config.experiment
    privacy, rc, rounds = exp.privacy, exp.algorithm.typed_options(), exp.algorithm.rounds
    cache: dict[int, tuple[float, float]] = {}
    for size in sorted({int(s) for s in sizes}):
        b = min(rc.batch_size, size)
        kw: dict[str, Any] = dict(
            local_epochs=rc.local_epochs, total_rounds=rounds, accountant=privacy.accountant
        )
        if selection_rounds:
            kw.update(selection_rounds=selection_rounds, selection_epsilon=selection_epsilon)
        with as_config_error("experiment.privacy", "cannot calibrate sigma: "):
            if two_stage:
                z = privacy.noise_multiplier
                if z is None:
                    z = two_stage_noise_multiplier(privacy.epsilon, privacy.delta, size, b, **kw)
                eps = two_stage_epsilon(z, privacy.delta, size, b, **kw)
            else:
                steps = rounds * steps_per_round(size, b, rc.local_epochs)
                z = privacy.noise_multiplier
                if z is None:
                    z = noise_multiplier_for(
                        privacy.epsilon, privacy.delta, b / size, steps, privacy.accountant
                    )
                eps = compute_epsilon([(z, b / size, steps)], privacy.delta, privacy.accountant)
        if eps > privacy.epsilon * (1 + 1e-9):
            raise ConfigError(
                "experiment.privacy.noise_multiplier",
                f"sigma={z} spends epsilon={eps:.4g} > budget {privacy.epsilon} over "
                f"{rounds} rounds for a client with {size} records; use null to calibrate",
            )
        cache[size] = (float(z), float(eps))
    return [cache[int(s)][0] for s in sizes], [cache[int(s)][1] for s in sizes]
