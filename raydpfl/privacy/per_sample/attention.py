"""nn.MultiheadAttention: per-sample norms of its projections by a local recomputation.

The layer's forward is one fused call (its ``out_proj`` weight is read, never called), so
no hook sees its projections. From the recorded call — query, key, value, masks — and
the output gradient g (∂Σℓ/∂attn_output), the rule recomputes the layer in parts,

    Q = X_q W_qᵀ + b_q,  K = X_k W_kᵀ + b_k,  V = X_v W_vᵀ + b_v      (in-projection)
    O = softmax(Q_h K_hᵀ/√d + mask) V_h  per head h,   y = O W_oᵀ + b_o   (out_proj)

and one backward pass through the attention core alone (from ∂ℓ/∂O = g W_o to Q, K, V;
no weight gradients) gives each projection's output gradient. Each projection is then a
Linear map with known inputs and output gradients (`per_sample.linear`: ghost norm or
materialised product, by cost). Self-attention (query, key and value the same tensor)
is one in-projection of 3E outputs; otherwise three, one per slice of ``in_proj_weight``
(or ``q/k/v_proj_weight`` when kdim/vdim differ). The recomputation costs about one more
forward and backward of the layer (activation recomputation, as gradient checkpointing
pays), far less than per-sample gradients of its 4E² weights.

No rule (the engine falls back to vmap): dropout > 0 (a random mask per call),
``add_bias_kv``, ``add_zero_attn``, and unbatched (2-D) inputs.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from raydpfl.privacy.per_sample import linear
from raydpfl.privacy.per_sample.base import CallNotClippable

_SIGNATURE = inspect.signature(nn.MultiheadAttention.forward)


class MultiheadAttentionRule:
    """The `raydpfl.privacy.per_sample.base.LayerRule` of nn.MultiheadAttention."""

    def refusal(self, module: nn.Module) -> str | None:
        assert isinstance(module, nn.MultiheadAttention)
        if module.dropout > 0:
            return "dropout > 0 draws a random mask per call"
        if module.bias_k is not None:
            return "add_bias_kv has no rule here"
        if module.add_zero_attn:
            return "add_zero_attn has no rule here"
        return None

    def owned_children(self, module: nn.Module) -> list[nn.Module]:
        return [module.out_proj]  # read by the fused forward, never called

    def record_call(
        self, module: nn.Module, args: tuple, kwargs: dict, output: Any
    ) -> tuple[dict, torch.Tensor]:
        """(what `norm_sq` needs, the output tensor to take the gradient at)."""
        bound = _SIGNATURE.bind(module, *args, **kwargs)
        bound.apply_defaults()
        call = dict(bound.arguments)
        query, key, value = call["query"], call["key"], call["value"]
        if query.dim() != 3:
            raise CallNotClippable(
                "nn.MultiheadAttention on unbatched (2-D) inputs has no per-sample rule"
            )
        same = query is key and key is value
        batch_first = module.batch_first

        def bf(t: torch.Tensor) -> torch.Tensor:
            return (t if batch_first else t.transpose(0, 1)).detach()

        inputs = {
            "q": bf(query),
            "k": None if same else bf(key),
            "v": None if same else bf(value),
            "key_padding_mask": call["key_padding_mask"],
            "attn_mask": call["attn_mask"],
            "is_causal": bool(call["is_causal"]),
            # the parameters this call used (the engine binds the caller's for the pass)
            "w": tuple(w.detach() for w in _projection_weights(module)),
            "b": tuple(_d(b) for b in _projection_biases(module)),
            "w_out": module.out_proj.weight.detach(),
        }
        out = output[0] if isinstance(output, tuple) else output
        return inputs, out

    def norm_sq(self, rec: Any) -> torch.Tensor:
        m, rec_in = rec.module, rec.inputs
        g = rec.grad if m.batch_first else rec.grad.transpose(0, 1)  # (B, L, E)
        xq = rec_in["q"]
        xk = xq if rec_in["k"] is None else rec_in["k"]
        xv = xq if rec_in["v"] is None else rec_in["v"]
        (w_q, w_k, w_v), (b_q, b_k, b_v) = rec_in["w"], rec_in["b"]
        with torch.enable_grad():
            q = F.linear(xq, w_q, b_q).requires_grad_(True)
            k = F.linear(xk, w_k, b_k).requires_grad_(True)
            v = F.linear(xv, w_v, b_v).requires_grad_(True)
            attended = _attend(m, q, k, v, rec_in)
            g_attended = g @ rec_in["w_out"]
            g_q, g_k, g_v = torch.autograd.grad(attended, (q, k, v), g_attended)
        has_bias = m.in_proj_bias is not None
        caches: dict[str, dict] = {}
        out_sq, caches["out"] = linear.norm_sq(attended.detach(), g, m.out_proj.bias is not None)
        if rec_in["k"] is None and m._qkv_same_embed_dim:  # self-attention: one projection
            in_sq, caches["in"] = linear.norm_sq(xq, torch.cat((g_q, g_k, g_v), 2), has_bias)
        else:
            in_sq = out_sq.new_zeros(out_sq.shape)
            for name, x, gp in (("q", xq, g_q), ("k", xk, g_k), ("v", xv, g_v)):
                part, caches[name] = linear.norm_sq(x, gp, has_bias)
                in_sq = in_sq + part
        rec.rule_cache = caches
        return out_sq + in_sq

    def weighted(self, rec: Any, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        m, caches = rec.module, rec.rule_cache
        out: dict[str, torch.Tensor] = {}
        out["out_proj.weight"], out_bias = linear.weighted(caches["out"], weights)
        if out_bias is not None:
            out["out_proj.bias"] = out_bias
        if "in" in caches:
            out["in_proj_weight"], in_bias = linear.weighted(caches["in"], weights)
            if in_bias is not None:
                out["in_proj_bias"] = in_bias
            return out
        parts = {name: linear.weighted(caches[name], weights) for name in ("q", "k", "v")}
        if m._qkv_same_embed_dim:
            out["in_proj_weight"] = torch.cat([parts[n][0] for n in ("q", "k", "v")])
        else:
            for name in ("q", "k", "v"):
                out[f"{name}_proj_weight"] = parts[name][0]
        if m.in_proj_bias is not None:
            out["in_proj_bias"] = torch.cat([parts[n][1] for n in ("q", "k", "v")])  # type: ignore[misc]
        return out


def _d(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _projection_weights(m: nn.MultiheadAttention) -> tuple[torch.Tensor, ...]:
    if m._qkv_same_embed_dim:
        return tuple(m.in_proj_weight.chunk(3))
    return m.q_proj_weight, m.k_proj_weight, m.v_proj_weight


def _projection_biases(m: nn.MultiheadAttention) -> tuple[torch.Tensor | None, ...]:
    if m.in_proj_bias is None:
        return None, None, None
    return tuple(m.in_proj_bias.chunk(3))


def _attend(
    m: nn.MultiheadAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: dict
) -> torch.Tensor:
    """The attention core of `m` on batch-first projections (B, L, E), (B, S, E):
    F.multi_head_attention_forward's arithmetic (scaled scores, masks merged into one
    additive mask with −inf where a bool mask is True, softmax, weighted values)."""
    b, length, e = q.shape
    s, h = k.shape[1], m.num_heads
    d = e // h
    qh = q.reshape(b, length, h, d).transpose(1, 2)
    kh = k.reshape(b, s, h, d).transpose(1, 2)
    vh = v.reshape(b, s, h, d).transpose(1, 2)
    scores = (qh * (1.0 / math.sqrt(d))) @ kh.transpose(-2, -1)  # (B, H, L, S)
    attn_mask = call["attn_mask"]
    if attn_mask is None and call["is_causal"]:
        attn_mask = torch.ones(length, s, dtype=torch.bool, device=q.device).triu(1)
    if attn_mask is not None:
        mask = attn_mask if attn_mask.dim() == 2 else attn_mask.view(b, h, length, s)
        scores = _masked(scores, mask)
    padding = call["key_padding_mask"]
    if padding is not None:
        scores = _masked(scores, padding.view(b, 1, 1, s))
    out = scores.softmax(-1) @ vh  # (B, H, L, d)
    return out.transpose(1, 2).reshape(b, length, e)


def _masked(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return scores.masked_fill(mask, float("-inf"))
    return scores + mask.to(scores.dtype)
