"""nn.LayerNorm and nn.RMSNorm: per-sample gradients of the elementwise affine.

Both normalise over the trailing ``normalized_shape`` dims and then scale (and for
LayerNorm shift): y = x̂ ⊙ γ (+ β). With g = ∂ℓ_i/∂y the per-sample gradients are
∇γ_i = Σ_positions g ⊙ x̂ and ∇β_i = Σ_positions g (positions: every axis between the
batch axis and the normalised ones), each of the size of γ itself: they are formed
(B × |γ| values, smaller than the layer's activations), so the norm is their sum of
squares and the weighted sum one matrix-vector product. x̂ is recomputed from the
recorded input by the functional norm without affine (the same kernel the layer ran).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from raydpfl.privacy.per_sample.base import sq_norms, weighted_rows


def _affine_per_sample(
    g: torch.Tensor, x_hat: torch.Tensor, trailing: int, with_bias: bool
) -> dict[str, torch.Tensor]:
    """{"weight": (B, *γ), "bias": (B, *γ)}: g ⊙ x̂ and g summed over the positions."""
    dims = tuple(range(1, g.dim() - trailing))
    out = {"weight": (g * x_hat).sum(dims) if dims else g * x_hat}
    if with_bias:
        out["bias"] = g.sum(dims) if dims else g
    return out


class _AffineNormRule:
    """Shared by LayerNorm and RMSNorm: only `x_hat` and the bias differ."""

    def refusal(self, module: nn.Module) -> str | None:
        return None  # without an affine there are no parameters, so no record is needed

    def owned_children(self, module: nn.Module) -> list[nn.Module]:
        return []

    def x_hat(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def norm_sq(self, rec: Any) -> torch.Tensor:
        m = rec.module
        trailing = len(m.normalized_shape)
        with_bias = getattr(m, "bias", None) is not None
        per_sample = _affine_per_sample(rec.grad, self.x_hat(m, rec.inputs), trailing, with_bias)
        rec.rule_cache = per_sample
        return sum(sq_norms(t) for t in per_sample.values())  # type: ignore[return-value]

    def weighted(self, rec: Any, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: weighted_rows(t, weights) for name, t in rec.rule_cache.items()}


class LayerNormRule(_AffineNormRule):
    """The `raydpfl.privacy.per_sample.base.LayerRule` of nn.LayerNorm (x̂ = (x − μ)/σ)."""

    def x_hat(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, module.normalized_shape, eps=module.eps)


class RMSNormRule(_AffineNormRule):
    """The `raydpfl.privacy.per_sample.base.LayerRule` of nn.RMSNorm (x̂ = x / rms(x))."""

    def x_hat(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, list(module.normalized_shape), eps=module.eps)
