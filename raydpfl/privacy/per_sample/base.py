"""The contract of a per-sample layer rule (see `raydpfl.privacy.per_sample`)."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn


class LayerRule(Protocol):
    """Per-sample norms and weighted sums of one layer type from its call's record.

    A record (`raydpfl.privacy.per_sample.bookkeeping._Record`) has ``module``, ``inputs`` (the
    call's first positional input, detached; or the tuple a rule's hook recorded),
    ``grad`` (∂Σℓ/∂output, detached) and ``rule_cache`` (a dict the rule may fill in
    `norm_sq` and read back in `weighted`)."""

    def refusal(self, module: nn.Module) -> str | None:
        """Why this configuration of the layer has no rule (None: it has one)."""
        ...

    def owned_children(self, module: nn.Module) -> list[nn.Module]:
        """Submodules whose parameters this rule computes (default: none)."""
        ...

    def norm_sq(self, rec: Any) -> torch.Tensor:
        """Σ over the layer's parameters of ‖∇θ ℓ_i‖², shape (B,)."""
        ...

    def weighted(self, rec: Any, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """Σ_i weights_i ∇θ ℓ_i per parameter, keyed by the parameter's name in the
        module (e.g. "weight", "out_proj.bias")."""
        ...


def sq_norms(t: torch.Tensor) -> torch.Tensor:
    """Σ of squares per leading index, without a squared temporary of t's size."""
    return torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1).square()


def weighted_rows(per_sample: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_i w_i per_sample[i] as one matrix-vector product, shaped like one row."""
    flat = per_sample.reshape(per_sample.shape[0], -1)
    return torch.mv(flat.t(), weights.to(flat.dtype)).reshape(per_sample.shape[1:])


def as_positions(t: torch.Tensor) -> torch.Tensor:
    """(B, T, last): every axis between the batch axis and the last one flattened into
    positions (T = 1 for a (B, last) tensor)."""
    return t.unsqueeze(1) if t.dim() == 2 else t.flatten(1, -2)


class CallNotClippable(ValueError):
    """One call of a layer that no rule can clip (seen only in the forward pass: a layer
    called twice, an input without the batch axis); the engine falls back to vmap."""
