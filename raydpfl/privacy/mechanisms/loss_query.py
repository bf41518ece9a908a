"""The noisy loss query's release: Σ clip(ℓ_j) + N(0, σ_l²C_l²) over a Poisson batch,
divided by a data-independent denominator (FedFDP Eq. 14–15; Adap DP-FL's noisy loss).

Drawn through `raydpfl.privacy.mechanisms.kernel.LiveSubsampledGaussian.mean_loss`, which supplies
σ_l and C_l from the task's declared mechanism.
"""

from __future__ import annotations

from typing import Literal

import torch

from raydpfl.privacy.accounting._checks import _non_negative, _positive
from raydpfl.privacy.per_sample.dpsgd import add_gaussian_noise, standard_normal_like

#: Arithmetic of the noisy loss query: ``float64`` sums the clipped losses and adds the
#: noise in double precision (FedFDP); ``native`` keeps the losses' dtype (Adap DP-FL).
LossPrecision = Literal["float64", "native"]


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
    as `raydpfl.privacy.per_sample.dpsgd` does for gradients) or a fixed constant; an empty batch
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
