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

What stays outside on purpose: `raydpfl.privacy.multi_client` (DP-FedAvg's loop
vectorised over clients, an engine with its own float order), PE-DPFL (non-private local
training, then one clipped and noised update: output perturbation), DPFL-BCS and its
baselines (one full-batch noisy gradient step with L1/Laplace or L2/Gaussian, the loss
reports coordinates of the same release) and FedFair (non-private). The non-private
minibatch loop of FedFDP's baselines is `fedfdp_baselines.local_sgd`, which hands its
private branch to this loop.

The noisy loss query (`noisy_loss_query`, `private_mean_loss`) is likewise one function:
FedFDP's loss upload (and DP q-FFL's F_k, which reuses it) and Adap DP-FL's schedule loss
are the same mechanism, (Σ_{i∈B} clip(ℓ_i) + N(0, σ_l²C_l²)) / (q_l·|D|) on an independent
Poisson(q_l) batch, SGM(q_l, σ_l).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from raydpfl.algorithms._checks import _non_negative, _positive
from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    parameter_delta,
)
from raydpfl.privacy.dpsgd import (
    WeightRule,
    add_gaussian_noise,
    dp_sgd_gradient,
    dp_sgd_step_,
    poisson_sample,
    standard_normal_like,
)

#: The divisor of one step's noisy clipped sum (see the module docstring).
Normalizer = Literal["expected", "actual", "fixed"]
#: A client-side gradient correction: (current params, start params, payload) → term, or
#: None for no term this step. Evaluated at each step's start point; draws no randomness.
Correction = Callable[[Params, Params, Mapping[str, torch.Tensor]], Params | None]
#: Arithmetic of the noisy loss query: ``float64`` sums the clipped losses and adds the
#: noise in double precision (FedFDP); ``native`` keeps the losses' dtype (Adap DP-FL).
LossPrecision = Literal["float64", "native"]


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
) -> tuple[Params, dict[str, float]]:
    """Runs τ = `task.local_steps` DP-SGD steps on `params` in place.

    Args:
        ctx: The worker's model, clipping engine and the client's RNG stream.
        params: The start model; trained in place.
        data: The client's training records.
        task: Supplies τ, η (`lr`), q (`sampling_rate`), C (`clip_norm`), σ
            (`noise_multiplier`) and the `payload` handed to `correction`.
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

    Returns:
        (a copy of the start params, metrics): ``last_step_loss_change`` (if tracked),
        ``mean_batch_size``, ``clipped_fraction``.
    """
    assert task.sampling_rate is not None and task.clip_norm is not None
    start = {name: p.detach().clone() for name, p in params.items()}
    payload = task.payload or {}
    n = data.num_examples
    batch_sizes: list[int] = []
    clipped: list[float] = []
    metrics: dict[str, float] = {}
    for step in range(task.local_steps):
        # the correction at the step's start point (it draws no randomness)
        extra = correction(params, start, payload) if correction is not None else None
        positions = poisson_sample(n, task.sampling_rate, ctx.generator)
        if normalizer == "actual" and positions.numel() == 0:
            batch_sizes.append(0)
            continue
        x, y = data.batch(positions)
        last = track_last_loss and step == task.local_steps - 1 and positions.numel() > 0
        if last:
            before = batch_loss(ctx.model, params, x, y)
        divisor = step_divisor(
            normalizer, task.sampling_rate, n, int(positions.numel()), fixed_divisor
        )
        if fused_correction:  # g first, then w ← w − η·(g + correction)
            grad, stats = dp_sgd_gradient(
                ctx.clipping,
                params,
                x,
                y,
                clip_norm=task.clip_norm,
                noise_multiplier=task.noise_multiplier,
                expected_batch_size=divisor,
                generator=ctx.generator,
                weight_rule=weight_rule,
            )
            with torch.no_grad():
                for name, p in params.items():
                    term = grad[name] if extra is None else grad[name] + extra[name]
                    p.sub_(term, alpha=task.lr)
        else:
            stats = dp_sgd_step_(  # w ← w − η·g, g the privatised gradient
                ctx.clipping,
                params,
                x,
                y,
                lr=task.lr,
                clip_norm=task.clip_norm,
                noise_multiplier=task.noise_multiplier,
                expected_batch_size=divisor,
                generator=ctx.generator,
                weight_rule=weight_rule,
            )
            if extra is not None:  # w ← w − η·correction
                with torch.no_grad():
                    for name, p in params.items():
                        p.sub_(extra[name], alpha=task.lr)
        if last:
            metrics["last_step_loss_change"] = batch_loss(ctx.model, params, x, y) - before
        batch_sizes.append(stats.batch_size)
        clipped.append(stats.clipped_fraction)
    metrics["mean_batch_size"] = float(np.mean(batch_sizes)) if batch_sizes else 0.0
    metrics["clipped_fraction"] = float(np.mean(clipped)) if clipped else 0.0
    return start, metrics


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
    )
    n = data.num_examples
    return ClientResult(
        client_id=task.client_id,
        update=parameter_delta(params, start),
        weight=float(n),
        num_examples=n,
        metrics=metrics,
    )


def batch_loss(model: torch.nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean cross-entropy of a batch (no gradient)."""
    with torch.no_grad():
        return float(F.cross_entropy(functional_call(model, params, (x,)), y))


# --------------------------------------------------------------------------------------- #
# The noisy loss query
# --------------------------------------------------------------------------------------- #
def per_sample_losses(
    model: torch.nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """Per-sample cross-entropy losses (no gradient); an empty float32 tensor for an
    empty batch."""
    if x.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float32, device=x.device)
    with torch.no_grad():
        return F.cross_entropy(functional_call(model, params, (x,)), y, reduction="none")


def clip_losses(losses: torch.Tensor, bound: float) -> torch.Tensor:
    """clip(ℓ) = min(C_l, max(0, ℓ)) per sample (FedFDP Eq. 15).

    The map is total and bounded: +inf → C_l, −inf → 0, and NaN → C_l (a NaN loss is
    treated as the largest possible one). Passing a NaN through would make the release
    NaN, which depends on a single record and has no sensitivity bound.

    Args:
        losses: Tensor of per-sample losses.
        bound: C_l ≥ 0.
    """
    bound = _non_negative(bound, "bound")
    if not isinstance(losses, torch.Tensor):
        raise ValueError("losses must be a torch.Tensor")
    return torch.nan_to_num(losses, nan=bound, posinf=bound, neginf=0.0).clamp(0.0, bound)


def private_mean_loss(
    losses: torch.Tensor,
    *,
    clip_bound: float,
    noise_multiplier: float,
    denominator: float,
    generator: torch.Generator,
    precision: LossPrecision = "float64",
) -> float:
    """(Σ_j clip(ℓ_j) + N(0, (σ_l·C_l)²)) / denominator (FedFDP Eq. 14, Alg. 2 L9–L11;
    Adap DP-FL's noisy loss).

    The clipped sum has sensitivity C_l under add/remove-one-record, so with a Poisson(q_l)
    batch this is SGM(q_l, σ_l) whatever C_l is (the noise scales with C_l).

    FedFDP's paper divides by the realised |B_i|; that count is data-dependent and is not
    covered by the SGM analysis. Pass the expected batch q_l·|D_i| (FedFDP §11 A4 [REC],
    as `raydpfl.privacy.dpsgd` does for gradients) or a fixed constant; an empty batch
    then still releases pure noise, as it must.

    Args:
        losses: 1-D tensor of per-sample losses on the query batch (may be empty).
        clip_bound: C_l ≥ 0 (0 releases exactly 0).
        noise_multiplier: σ_l ≥ 0.
        denominator: > 0, data-independent.
        generator: The client's RNG stream; one standard normal is drawn from it.
        precision: ``float64`` (FedFDP, DP q-FFL): sum and noise in double precision,
            the draw a float64 normal (always drawn). ``native`` (Adap DP-FL): sum and
            noise in the losses' dtype, no draw when σ_l·C_l = 0 (`dpsgd.add_gaussian_noise`).
            The same mechanism; the two differ only in float rounding.

    Returns:
        The noisy mean loss (a Python float, may be negative).
    """
    clip_bound = _non_negative(clip_bound, "clip_bound")
    noise_multiplier = _non_negative(noise_multiplier, "noise_multiplier")
    denominator = _positive(denominator, "denominator")
    if not isinstance(losses, torch.Tensor) or losses.ndim != 1:
        raise ValueError("losses must be a 1-D torch.Tensor (one value per sample)")
    if precision == "native":
        total = clip_losses(losses, clip_bound).sum()
        noisy = add_gaussian_noise({"loss": total}, noise_multiplier * clip_bound, generator)
        return float(noisy["loss"]) / denominator
    if precision != "float64":
        raise ValueError(f"precision must be float64 or native, got {precision!r}")
    total64 = float(clip_losses(losses, clip_bound).double().sum())
    # torch.randn((), generator, dtype=float64) in research mode; os.urandom when secure.
    z = float(
        standard_normal_like(
            torch.empty((), device=generator.device, dtype=torch.float64), generator
        )
    )
    return (total64 + noise_multiplier * clip_bound * z) / denominator


def noisy_loss_query(
    ctx: ClientContext,
    model_params: Params,
    data: ClientData,
    *,
    sampling_rate: float,
    clip_bound: float,
    noise_multiplier: float,
    precision: LossPrecision = "float64",
) -> tuple[float, torch.Tensor]:
    """The client half of a noisy loss query: a fresh Poisson(q_l) batch from the task's
    own stream (independent of any gradient batch, so the mechanisms compose), the
    per-sample losses of `model_params` on it, and `private_mean_loss` over them with
    denominator q_l·|D|. One SGM(q_l, σ_l) release, `PrivacyCost(σ_l, q_l, 1)`.

    Returns:
        (the noisy mean loss, the raw per-sample losses: a diagnostic, not a release).
    """
    n = data.num_examples
    positions = poisson_sample(n, sampling_rate, ctx.generator)
    x, y = data.batch(positions)
    losses = per_sample_losses(ctx.model, model_params, x, y)
    noisy = private_mean_loss(
        losses,
        clip_bound=clip_bound,
        noise_multiplier=noise_multiplier,
        denominator=sampling_rate * n,
        generator=ctx.generator,
        precision=precision,
    )
    return noisy, losses
