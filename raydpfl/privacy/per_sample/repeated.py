"""Layers called more than once in one forward pass, and inputs without a batch axis.

A layer called K times contributes the *sum* of its calls' gradients to a sample's
gradient, so its per-sample norm is not the root of the calls' summed squared norms. For
a Linear layer the sum is still one Linear gradient: calls k with inputs A_k (B, T_k, p)
and output gradients G_k (B, T_k, q) give ∇W_i = Σ_k G_k,iᵀ A_k,i = Gᵢᵀ Aᵢ with the
calls' positions stacked, A = [A_1 … A_K] (B, ΣT_k, p). `merge_repeated` therefore
merges a Linear layer's records into one of stacked positions, and the engine's Linear
rule (ghost norm or materialised, by cost) clips it exactly. That is what makes a
recurrent cell built from Linear layers (`raydpfl.models.recurrent.DPLSTM`: the
hidden-to-hidden Linear runs once per time step) cheap to clip: one record of T
positions instead of T per-sample gradients. Any other layer called twice still has no
rule (`SharedLayerError`, and the engine falls back to vmap for that model).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from raydpfl.privacy.per_sample.base import as_positions


def first_unclippable(records: list[Any], batch: int) -> tuple[str, Any] | None:
    """("repeat", record) for the first non-Linear layer called a second time,
    ("batch", record) for the first input whose leading size is not `batch`
    (`without_batch_axis`), whichever comes first; None when every call can be
    clipped. One pass (it runs every step)."""
    seen: set[int] = set()
    for rec in records:
        key = id(rec.module)
        if key in seen and not isinstance(rec.module, nn.Linear):
            return "repeat", rec
        seen.add(key)
        x = rec.inputs
        size = (x.shape[0] if x.dim() else None) if type(x) is torch.Tensor else leading_size(rec)
        if size != batch:
            return "batch", rec
    return None


def repeated_unmergeable(records: list[Any]) -> Any | None:
    """The first record of a non-Linear layer that appears twice (None: none)."""
    seen: set[int] = set()
    for rec in records:
        if id(rec.module) in seen and not _mergeable(rec.module):
            return rec
        seen.add(id(rec.module))
    return None


def leading_size(rec: Any) -> int | None:
    """The size of a record's leading (batch) axis: its input's first dimension, or a
    rule's recorded batch-first query (nn.MultiheadAttention); None for a 0-d input."""
    x = rec.inputs
    if isinstance(x, dict):
        x = x.get("q")
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return None
    return int(x.shape[0])


def without_batch_axis(records: list[Any], batch: int) -> Any | None:
    """The first record whose input does not lead with the batch axis (a layer applied
    to a tensor shared by all samples, e.g. a position embedding called on
    ``arange(T)``: its output gradient is summed over samples, so no rule can split it).
    A shared input whose length equals the batch size passes here; the engine's probe at
    a second batch size catches it (`BookkeepingClipping._probe_batch_axis`)."""
    for rec in records:
        if leading_size(rec) != batch:
            return rec
    return None


def _mergeable(module: nn.Module) -> bool:
    return type(module) is nn.Linear or isinstance(module, nn.Linear)


def merge_repeated(records: list[Any]) -> list[Any]:
    """`records` (with ``grad`` filled in) with each Linear layer's calls merged into
    one record of stacked positions (B, ΣT, ·), at its first call's place."""
    if len({id(rec.module) for rec in records}) == len(records):
        return records  # the common case: every layer called once
    groups: dict[int, list[Any]] = {}
    for rec in records:
        groups.setdefault(id(rec.module), []).append(rec)
    merged: list[Any] = []
    for rec in records:
        group = groups[id(rec.module)]
        if len(group) == 1:
            merged.append(rec)
        elif group[0] is rec:
            inputs = torch.cat([as_positions(r.inputs) for r in group], 1)
            grad = torch.cat([as_positions(r.grad) for r in group], 1)
            merged.append(dataclasses.replace(rec, inputs=inputs, grad=grad, output=None))
    return merged
