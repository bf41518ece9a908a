"""The one DP-SGD local loop, and the one noisy loss query, that the DP algorithms share.

Every record-level DP algorithm whose client half is "τ DP-SGD steps from the broadcast
model" runs `dp_sgd_local_loop` (issue 17): DP-FedAvg, ALI-DPFL and its fixed-τ baseline,
Adap DP-FL, RC-DPFL and its clustered baselines (``rc_dpfl``, ``rc_dp_fedavg``,
``o_cdpfl``, ``rc_local``, ``km_cdpfl``, ``f_cdpfl``), MR-MTL, FedFDP and the ``dp_``
baselines of its paper (DP-FedProx, DP-SCAFFOLD, DP-FedDyn, DP q-FFL). One step is

    B ~ Poisson(q) from the client's stream          (`dpsgd.poisson_sample`)
    s = Σ_{i∈B} a_i ∇ℓ_i + N(0, σ²C²I)               (a_i from the weight rule, ‖a_i g_i‖ ≤ C)
    w ← w − η·(s / divisor + correction(w_step_start))

and what differs between the algorithms is a hook, never a copy of the loop:

- ``weight_rule`` — the per-sample weights a_i (`dpsgd.WeightRule`; default flat clipping
  at C). FedFDP's fair clipping is a `dpsgd.LossWeightRule` and so also sees each
  sample's loss at the step's parameters. Checked against C at every step
  (`dpsgd.BoundedWeightRule`).
- ``correction`` — a data-independent term added to the privatised gradient, evaluated at
  the step's start point: FedProx's μ(w − w_t), SCAFFOLD's c − c_i, FedDyn's
  −h_i + α(w − w_t), MR-MTL's λ(θ_i − θ̄). It reads only public or already released
  values (the start model, the task's payload), so it is post-processing and costs no
  privacy. ``fused_correction`` picks the float order of the update (see below).
- ``normalizer`` — the divisor of the noisy sum: ``expected`` q·|D| (the DP-SGD default,
  data-independent), ``fixed`` a constant (the papers' code, e.g. 64), ``actual`` the
  realised |B| (ALI-DPFL and Adap DP-FL's code; data-dependent, each algorithm lists it
  in its unaccounted releases). With ``actual`` an empty batch skips the step (it still
  counts for privacy; ALI-DPFL A8).
- ``track_last_loss`` — a loss query on the last step's batch: the batch loss before and
  after that step (ALI-DPFL's Γ estimate, ``last_step_loss_change``).
- metrics — ``mean_batch_size`` (skipped steps count as 0) and ``clipped_fraction``
  (steps taken only), both training diagnostics each algorithm lists as unaccounted.

Bit-for-bit reproducibility is part of the contract: the loop consumes the client's
stream in one order (Poisson draw, then the noise, per step; the hooks draw nothing) and
each algorithm keeps the float order of the update it was published with:
``fused_correction=False`` applies the step in place (`dpsgd.dp_sgd_step_`: noise drawn
first, the engine adds the clipped sum into it) and then w ← w − η·correction;
``fused_correction=True`` (MR-MTL) forms the privatised gradient g first
(`dpsgd.dp_sgd_gradient`) and applies w ← w − η·(g + correction) in one subtraction.
The two agree up to float rounding, not in their bits.

What stays outside on purpose: `raydpfl.privacy.per_sample.multi_client` (DP-FedAvg's loop
vectorised over clients, an engine with its own float order), PE-DPFL (non-private local
training, then one clipped and noised update: output perturbation), DPFL-BCS and its
baselines (one full-batch noisy gradient step with L1/Laplace or L2/Gaussian, the loss
reports coordinates of the same release) and FedFair (non-private). The non-private
minibatch loop of FedFDP's baselines is `raydpfl.papers.fedfdp.pfl_base.local_sgd`, which
hands its private branch to this loop.

The noisy loss query (`noisy_loss_query`, `private_mean_loss`) is likewise one function:
FedFDP's loss upload (and DP q-FFL's F_k, which reuses it) and Adap DP-FL's schedule loss
are the same mechanism, (Σ_{i∈B} clip(ℓ_i) + N(0, σ_l²C_l²)) / (q_l·|D|) on an independent
Poisson(q_l) batch, SGM(q_l, σ_l).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    privacy_session,
    trained_result,
)
from raydpfl.privacy.mechanisms.kernel import (
    LiveSubsampledGaussian,
    Mechanism,
    ReleasedStepStats,
    SampledBatch,
    SubsampledGaussian,
    per_sample_losses,
)
from raydpfl.privacy.mechanisms.loss_query import LossPrecision, clip_losses, private_mean_loss
from raydpfl.privacy.per_sample.dpsgd import WeightRule

__all__ = [
    "ACTUAL_DIVISOR_RELEASE",
    "DPSGD_METRICS_RELEASE",
    "Correction",
    "LastStepProbe",
    "LossPrecision",
    "Normalizer",
    "batch_loss",
    "clip_losses",
    "dp_sgd_local_loop",
    "dp_sgd_local_update",
    "noisy_loss_query",
    "per_sample_losses",
    "private_mean_loss",
    "step_divisor",
]

#: The divisor of one step's noisy clipped sum (see the module docstring).
Normalizer = Literal["expected", "actual", "fixed"]
#: Unaccounted releases (an algorithm's `unaccounted_releases`) common to the algorithms
#: that train with this module's loop: the step diagnostics averaged into rounds.parquet,
#: and with ``normalizer="actual"`` the realised batch size as each step's divisor.
DPSGD_METRICS_RELEASE = (
    "client_training_metrics (mean realised Poisson batch size and clipped fraction, "
    "averaged over the round's clients, in rounds.parquet)"
)
ACTUAL_DIVISOR_RELEASE = (
    "dpsgd_actual_batch_divisor (normalizer=actual divides each noisy step by the "
    "realised Poisson batch size, a data-dependent quantity the sampled Gaussian "
    "accounting does not cover)"
)
#: A client-side gradient correction: (current params, start params, payload) → term, or
#: None for no term this step. Evaluated at each step's start point; draws no randomness.
Correction = Callable[[Params, Params, Mapping[str, torch.Tensor]], Params | None]
#: Metrics of the last step: (params before it, params after it, its batch x, y) → metrics.
LastStepProbe = Callable[[Params, Params, torch.Tensor, torch.Tensor], dict[str, float]]


# --------------------------------------------------------------------------------------- #
# The DP-SGD local loop
# --------------------------------------------------------------------------------------- #
def dp_sgd_local_loop(
    ctx: ClientContext,
    params: Params,
    data: ClientData,
    task: ClientTask,
    *,
    weight_rule: WeightRule | None = None,
    correction: Correction | None = None,
    fused_correction: bool = False,
    normalizer: Normalizer = "expected",
    fixed_divisor: float = 64.0,
    track_last_loss: bool = False,
    mechanism: SubsampledGaussian | None = None,
    last_step_probe: LastStepProbe | None = None,
) -> tuple[Params, dict[str, float]]:
    """Runs τ = `task.local_steps` DP-SGD steps on `params` in place.

    Args:
        ctx: The worker's model, clipping engine and the client's RNG stream.
        params: The start model; trained in place.
        data: The client's training records.
        task: Supplies τ, η (`lr`) and the `payload` handed to `correction`; q, C and σ
            are those of the task's declared `SubsampledGaussian`, drawn through the
            worker's privacy session (`ClientContext.privacy`), which counts each step.
        weight_rule: Per-sample weights (default flat clipping at C); FedFDP's fair
            clipping. Must keep every ‖a_i g_i‖ ≤ C (checked each step).
        correction: The data-independent gradient term at the step's start point
            (FedProx, SCAFFOLD, FedDyn, MR-MTL); not charged.
        fused_correction: False: the in-place DP-SGD step, then w ← w − η·correction.
            True: w ← w − η·(g + correction) with g the privatised gradient (MR-MTL's
            published float order).
        normalizer: ``expected`` (q·|D|), ``fixed`` (`fixed_divisor`) or ``actual``
            (the realised batch size; an empty batch skips the step and its correction).
        fixed_divisor: The divisor of ``fixed``.
        track_last_loss: Adds ``last_step_loss_change``, the loss of the last step's
            batch after minus before that step (ALI-DPFL's Γ estimate; only when that
            batch is not empty).
        mechanism: Which declared `SubsampledGaussian` the steps use, when the task
            declares more than one (e.g. DP-SGD steps and a noisy loss query); default:
            the task's only one.
        last_step_probe: Called after the last step (when its batch is not empty) with
            the parameters before and after it and that step's batch; its metrics are
            added (ALI-DPFL's code μ estimators). Reads, never writes, the parameters.

    Returns:
        (a copy of the start params, metrics): ``last_step_loss_change`` (if tracked),
        ``mean_batch_size``, ``clipped_fraction``.
    """
    session = privacy_session(ctx, task, data)
    dp_sgd = session.dp_sgd() if mechanism is None else session.get(mechanism)
    start = {name: p.detach().clone() for name, p in params.items()}
    payload = task.payload or {}
    n = data.num_examples
    batch_sizes: list[int] = []
    clipped: list[float] = []
    metrics: dict[str, float] = {}
    for step in range(task.local_steps):
        # the correction at the step's start point (it draws no randomness)
        extra = correction(params, start, payload) if correction is not None else None
        batch = dp_sgd.sample()  # the platform's Poisson draw from the client's records
        if normalizer == "actual" and batch.is_empty:
            dp_sgd.skip_empty(batch)  # charged all the same
            batch_sizes.append(0)
            continue
        probes = step == task.local_steps - 1 and (track_last_loss or last_step_probe is not None)
        final = probes and not batch.is_empty
        last = track_last_loss and final
        if last:
            before = dp_sgd.batch_loss(params, batch)
        if final and last_step_probe is not None:
            params_before = {name: p.detach().clone() for name, p in params.items()}
        size = batch.size if normalizer == "actual" else 0
        divisor = step_divisor(normalizer, dp_sgd.sampling_rate, n, size, fixed_divisor)
        stats = _apply_dp_step(
            dp_sgd, batch, params, task.lr, divisor, weight_rule, extra, fused_correction
        )
        if last:
            metrics["last_step_loss_change"] = dp_sgd.batch_loss(params, batch) - before
        if final and last_step_probe is not None:
            probe = functools.partial(last_step_probe, params_before, params)
            metrics.update(dp_sgd.probe(batch, probe))
        batch_sizes.append(stats.batch_size)
        clipped.append(stats.clipped_fraction)
    metrics["mean_batch_size"] = float(np.mean(batch_sizes)) if batch_sizes else 0.0
    metrics["clipped_fraction"] = float(np.mean(clipped)) if clipped else 0.0
    return start, metrics


def _apply_dp_step(
    dp_sgd: LiveSubsampledGaussian,
    batch: SampledBatch,
    params: Params,
    lr: float,
    divisor: float,
    weight_rule: WeightRule | None,
    extra: Params | None,
    fused: bool,
) -> ReleasedStepStats:
    """One DP-SGD step of `dp_sgd_local_loop` on `params` in place, through the platform's
    private step on `batch`, with the correction `extra` (or none) in the float order
    `fused` picks; returns the step's statistics."""
    if fused:  # g first, then w ← w − η·(g + correction)
        grad, stats = dp_sgd.gradient(params, batch, divisor=divisor, weight_rule=weight_rule)
        with torch.no_grad():
            for name, p in params.items():
                term = grad[name] if extra is None else grad[name] + extra[name]
                p.sub_(term, alpha=lr)
        return stats
    stats = dp_sgd.step_(  # w ← w − η·g, g the privatised gradient
        params, batch, lr=lr, divisor=divisor, weight_rule=weight_rule
    )
    if extra is not None:  # w ← w − η·correction
        with torch.no_grad():
            for name, p in params.items():
                p.sub_(extra[name], alpha=lr)
    return stats


def step_divisor(
    normalizer: Normalizer,
    sampling_rate: float,
    num_examples: int,
    batch_size: int,
    fixed_divisor: float,
) -> float:
    """The divisor of one step's noisy sum: q·|D| (``expected``), the realised batch size
    (``actual``) or `fixed_divisor` (``fixed``)."""
    if normalizer == "expected":
        return sampling_rate * num_examples
    if normalizer == "fixed":
        return fixed_divisor
    if normalizer == "actual":
        return float(batch_size)
    raise ValueError(f"normalizer must be expected, actual or fixed, got {normalizer!r}")


def dp_sgd_local_update(
    ctx: ClientContext,
    params: Params,
    data: ClientData,
    task: ClientTask,
    *,
    normalizer: Normalizer = "expected",
    fixed_divisor: float = 64.0,
    track_last_loss: bool = False,
    mechanism: SubsampledGaussian | None = None,
    last_step_probe: LastStepProbe | None = None,
) -> ClientResult:
    """`dp_sgd_local_loop` with flat clipping and no correction, as a `ClientResult`:
    update = trained − start, weight |D|. The client half of DP-FedAvg, ALI-DPFL, Adap
    DP-FL and the RC-DPFL family."""
    start, metrics = dp_sgd_local_loop(
        ctx,
        params,
        data,
        task,
        normalizer=normalizer,
        fixed_divisor=fixed_divisor,
        track_last_loss=track_last_loss,
        mechanism=mechanism,
        last_step_probe=last_step_probe,
    )
    return trained_result(task, data, params, start, metrics)


def batch_loss(model: torch.nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean cross-entropy of a batch (no gradient)."""
    with torch.no_grad():
        return float(F.cross_entropy(functional_call(model, params, (x,)), y))


# --------------------------------------------------------------------------------------- #
# The noisy loss query
# --------------------------------------------------------------------------------------- #
def noisy_loss_query(
    ctx: ClientContext,
    model_params: Params,
    data: ClientData,
    task: ClientTask,
    *,
    mechanism: Mechanism | None = None,
    precision: LossPrecision = "float64",
    with_raw_losses: bool = False,
) -> tuple[float, torch.Tensor | None]:
    """The client half of a noisy loss query: a fresh Poisson(q_l) batch from the task's
    own stream (independent of any gradient batch, so the mechanisms compose), the
    per-sample losses of `model_params` on it, and `private_mean_loss` over them with
    clip bound C_l and denominator q_l·|D|. One invocation of the task's declared
    `SubsampledGaussian(σ_l, C_l, q_l)` (`mechanism`, or the task's only one).

    Returns:
        (the noisy mean loss, the raw per-sample losses if `with_raw_losses`, else None).
        The raw losses are un-noised: asking for them makes the platform list
        ``loss_query_raw_losses`` in the run's unaccounted releases.
    """
    session = privacy_session(ctx, task, data)
    query = session.get(mechanism) if mechanism is not None else session.get(SubsampledGaussian)
    if not with_raw_losses:
        return query.mean_loss(model_params, precision=precision), None
    noisy, losses = query.mean_loss(model_params, precision=precision, raw_losses=True)
    return noisy, losses
