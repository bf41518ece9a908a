"""nn.Embedding: per-sample norms from token ids and output gradients.

A sample's tokens k_1..k_T (any index shape after the batch axis) and output gradients
g_1..g_T ∈ R^q give the per-sample weight gradient ∇E_i = Σ_t e_{k_t} g_tᵀ (V×q, rows
only at the sample's tokens). Two exact ways to its norm, chosen per call by cost:

- materialised: scatter-add the g_t into a (B, V, q) tensor (cost B·V·q memory and
  reads), kept for the weighted sum (one matrix-vector product);
- ghost (Li et al. 2022, "Large language models can be strong differentially private
  learners", App. on embeddings): ‖∇E_i‖² = Σ_{t,t'} [k_t = k_t'] ⟨g_t, g_t'⟩, cost
  B·T²·q, no V-sized per-sample tensor; the weighted sum is then one index-add of the
  weighted g_t.

Ghost pays when T² < V (long vocabularies, short windows: Sent140's 10,000 words over
25 tokens); LEAF's 80 characters over 80-token windows are materialised. The row of
``padding_idx`` gets no gradient (as in torch). ``max_norm`` (renormalises the weight in
the forward pass) and ``scale_grad_by_freq`` (scales by counts over the whole batch,
which mixes samples) have no rule.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from raydpfl.privacy.per_sample.base import as_positions, sq_norms, weighted_rows


class EmbeddingRule:
    """The `raydpfl.privacy.per_sample.base.LayerRule` of nn.Embedding."""

    def refusal(self, module: nn.Module) -> str | None:
        assert isinstance(module, nn.Embedding)
        if module.max_norm is not None:
            return "max_norm renormalises the weight inside the forward pass"
        if module.scale_grad_by_freq:
            return "scale_grad_by_freq scales by counts over the whole batch (mixes samples)"
        return None

    def owned_children(self, module: nn.Module) -> list[nn.Module]:
        return []

    @staticmethod
    def ghost_pays(module: nn.Embedding, positions: int) -> bool:
        """Whether the ghost norm (T² per sample) is cheaper than a (V, q) scatter."""
        return positions * positions < module.num_embeddings

    def norm_sq(self, rec: Any) -> torch.Tensor:
        m, ids, g = rec.module, rec.inputs, rec.grad
        b, q = ids.shape[0], g.shape[-1]
        ids = ids.unsqueeze(1) if ids.dim() == 1 else ids.flatten(1)
        g = as_positions(g)
        if m.padding_idx is not None:  # no gradient reaches the padding row
            g = g * (ids != m.padding_idx).unsqueeze(-1).to(g.dtype)
        if self.ghost_pays(m, ids.shape[1]):
            same = ids.unsqueeze(2) == ids.unsqueeze(1)  # (B, T, T)
            gram = torch.bmm(g, g.transpose(1, 2))
            rec.rule_cache = {"ids": ids, "grad": g}
            return (gram * same.to(gram.dtype)).sum((1, 2))
        v = m.num_embeddings
        per_sample = torch.zeros(b * v, q, dtype=g.dtype, device=g.device)
        rows = (ids + torch.arange(b, device=ids.device).unsqueeze(1) * v).reshape(-1)
        per_sample.index_add_(0, rows, g.reshape(-1, q))
        per_sample = per_sample.view(b, v, q)
        rec.rule_cache = {"per_sample": per_sample}
        return sq_norms(per_sample)

    def weighted(self, rec: Any, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        m, cache = rec.module, rec.rule_cache
        if "per_sample" in cache:
            return {"weight": weighted_rows(cache["per_sample"], weights)}
        ids, g = cache["ids"], cache["grad"]
        gw = g * weights.to(g.dtype).view(-1, 1, 1)
        out = torch.zeros(m.num_embeddings, g.shape[-1], dtype=g.dtype, device=g.device)
        out.index_add_(0, ids.reshape(-1), gw.reshape(-1, g.shape[-1]))
        return {"weight": out}
