"""Per-sample rules for the book-keeping engine beyond Linear, Conv2d and GroupNorm.

A rule turns one layer call's record — the layer's input ``a`` and the gradient of the
summed loss at its output ``g`` (each row a sample's own, since no layer mixes samples)
— into

- ``norm_sq(rec)``: ‖∇θ ℓ_i‖² over the layer's parameters, one value per sample, and
- ``weighted(rec, w)``: Σ_i w_i ∇θ ℓ_i for each parameter (keyed by its local name),

without forming the per-sample gradients where a cheaper identity exists (the ghost norm
of Goodfellow 2015 / Li et al. 2022, chosen per layer by cost, as the engine does for
Linear). `raydpfl.privacy.bookkeeping` dispatches to `rule_for(module)` and keeps its own
Linear/Conv2d/GroupNorm rules; `repeated` merges the records of a Linear layer called
several times in one pass (a recurrent cell) into one record of stacked positions.

Rules: `embedding.EmbeddingRule` (nn.Embedding), `norms.LayerNormRule` (nn.LayerNorm),
`norms.RMSNormRule` (nn.RMSNorm), `attention.MultiheadAttentionRule`
(nn.MultiheadAttention).
"""

from __future__ import annotations

from torch import nn

from raydpfl.privacy.per_sample.attention import MultiheadAttentionRule
from raydpfl.privacy.per_sample.base import CallNotClippable, LayerRule
from raydpfl.privacy.per_sample.embedding import EmbeddingRule
from raydpfl.privacy.per_sample.norms import LayerNormRule, RMSNormRule

#: One rule object per layer type (rules keep no state between calls).
RULES: dict[type[nn.Module], LayerRule] = {
    nn.Embedding: EmbeddingRule(),
    nn.LayerNorm: LayerNormRule(),
    nn.RMSNorm: RMSNormRule(),
    nn.MultiheadAttention: MultiheadAttentionRule(),
}
#: The layer types with a rule here.
RULE_TYPES: tuple[type[nn.Module], ...] = tuple(RULES)


def rule_for(module: nn.Module) -> LayerRule | None:
    """The rule for `module`'s exact type or a subclass's parent (None: no rule here)."""
    for kind, rule in RULES.items():
        if isinstance(module, kind):
            return rule
    return None


def owned_children(module: nn.Module) -> list[nn.Module]:
    """Submodules whose parameters `module`'s rule covers (nn.MultiheadAttention's
    out_proj: its forward reads the weight without calling the child)."""
    rule = rule_for(module)
    return rule.owned_children(module) if rule is not None else []


__all__ = [
    "RULES",
    "RULE_TYPES",
    "CallNotClippable",
    "LayerRule",
    "owned_children",
    "rule_for",
]
