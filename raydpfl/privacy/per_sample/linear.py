"""A Linear map's per-sample norm and weighted sum from (A, G), for rules that form the
map themselves (nn.MultiheadAttention's projections): the book-keeping engine's own
Linear rule, restated on plain tensors.

A sample's inputs A_i (T, p) and output gradients G_i (T, q) give ∇W_i = G_iᵀA_i and
∇b_i = Σ_t G_i[t]. The norm is either the ghost norm ‖G_iᵀA_i‖² = ⟨A_iA_iᵀ, G_iG_iᵀ⟩
(cost T²(p+q)) or the squared entries of the materialised product (cost T·p·q),
whichever is cheaper; the weighted sum is one GEMM over all samples' positions, or a
matrix-vector product with the kept per-sample products.
"""

from __future__ import annotations

import torch

from raydpfl.privacy.per_sample.base import sq_norms, weighted_rows


def ghost_pays(positions: int, p: int, q: int) -> bool:
    """Whether the ghost norm (T²(p+q)) is cheaper than forming G_iᵀA_i (T·p·q)."""
    return positions * positions * (p + q) < positions * p * q


def norm_sq(a: torch.Tensor, g: torch.Tensor, bias: bool) -> tuple[torch.Tensor, dict]:
    """(‖∇W_i‖² + ‖∇b_i‖², cache for `weighted`) for A (B, T, p) and G (B, T, q)."""
    t, p, q = a.shape[1], a.shape[2], g.shape[2]
    cache: dict = {"a": a, "g": g, "bias": bias}
    if ghost_pays(t, p, q):
        out = (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
    else:
        cache["per_sample"] = torch.bmm(g.transpose(1, 2), a)  # (B, q, p)
        out = sq_norms(cache["per_sample"])
    if bias:
        cache["per_sample_bias"] = g.sum(1)
        out = out + cache["per_sample_bias"].pow(2).sum(1)
    return out, cache


def weighted(cache: dict, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(Σ_i w_i ∇W_i (q, p), Σ_i w_i ∇b_i (q,) or None) from `norm_sq`'s cache."""
    a, g = cache["a"], cache["g"]
    if "per_sample" in cache:
        w_sum = weighted_rows(cache["per_sample"], weights)
    else:
        gw = g * weights.to(g.dtype).view(-1, 1, 1)
        w_sum = gw.reshape(-1, g.shape[2]).t() @ a.reshape(-1, a.shape[2])
    b_sum = weighted_rows(cache["per_sample_bias"], weights) if cache["bias"] else None
    return w_sum, b_sum
