"""Per-sample clipping: the DP-SGD step (`dpsgd`), its engines (`engines` chooses between
`dpsgd.PerSampleGradients` and `bookkeeping.BookkeepingClipping`; `param_binding` binds
the parameters per step; `multi_client` vectorises over clients), and, in this package's
namespace, the per-sample rules for the book-keeping engine beyond Linear, Conv2d and
GroupNorm.

A rule turns one layer call's record — the layer's input ``a`` and the gradient of the
summed loss at its output ``g`` (each row a sample's own, since no layer mixes samples)
— into

- ``norm_sq(rec)``: ‖∇θ ℓ_i‖² over the layer's parameters, one value per sample, and
- ``weighted(rec, w)``: Σ_i w_i ∇θ ℓ_i for each parameter (keyed by its local name),

without forming the per-sample gradients where a cheaper identity exists (the ghost norm
of Goodfellow 2015 / Li et al. 2022, chosen per layer by cost, as the engine does for
Linear). `raydpfl.privacy.per_sample.bookkeeping` dispatches to `rule_for(module)` and keeps
its own Linear/Conv2d/GroupNorm rules; `repeated` merges the records of a Linear layer called
several times in one pass (a recurrent cell) into one record of stacked positions.

Rules: `embedding.EmbeddingRule` (nn.Embedding: ghost norm or materialised, by cost),
`norms.LayerNormRule` (nn.LayerNorm), `norms.RMSNormRule` (nn.RMSNorm),
`attention.MultiheadAttentionRule` (nn.MultiheadAttention: its projections' output
gradients by a local recomputation, then `linear`'s ghost-or-materialised Linear rule).

Ghost clipping (Li et al. 2022) takes the norms from activations and output gradients,
then runs a second, weighted backward pass. Here the norms are taken the same way,
layer by layer with whichever of the ghost norm and the materialised product is
cheaper, but the weighted sum is formed from the same records (one weight-gradient
product per layer, the book-keeping of Bu et al. 2023): the weight-gradient half of the
second backward without its input-gradient half, so it is never dearer.
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


_BY_TYPE: dict[type, LayerRule | None] = {}


def rule_for(module: nn.Module) -> LayerRule | None:
    """The rule for `module`'s type or the first of its bases with one (None: no rule
    here). Looked up once per type (it runs for every record of every step)."""
    kind = type(module)
    try:
        return _BY_TYPE[kind]
    except KeyError:
        rule = next((r for k, r in RULES.items() if issubclass(kind, k)), None)
        _BY_TYPE[kind] = rule
        return rule


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
