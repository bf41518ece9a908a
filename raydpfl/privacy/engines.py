"""Choosing the per-sample clipping engine for a model.

Both engines compute one DP-SGD step's Σ_i a_i ∇ℓ_i (`raydpfl.privacy.dpsgd.ClippedSumEngine`):
`PerSampleGradients` materialises per-sample gradients with torch.func (any model);
`BookkeepingClipping` computes per-sample norms from layer inputs and output gradients
without materialising them (`raydpfl.privacy.bookkeeping`; layers with a rule only). They
give the same update up to float error. This module sits above both, so neither imports
the other's chooser.
"""

from __future__ import annotations

from torch import nn

from raydpfl.privacy import bookkeeping
from raydpfl.privacy.dpsgd import ClippedSumEngine, PerSampleGradients

#: The engine names `make_engine` (and ``runtime.engine``) accept.
ENGINES = ("auto", "bookkeeping", "vmap")


def make_engine(model: nn.Module, kind: str = "auto") -> ClippedSumEngine:
    """The per-sample clipping engine for `model`.

    ``bookkeeping`` computes per-sample norms from layer inputs and output gradients;
    ``vmap`` materialises per-sample gradients with torch.func; ``auto`` takes
    book-keeping wherever every layer has a rule for it (`bookkeeping.supports`).

    Raises:
        ValueError: `kind` is not one of `ENGINES`.
    """
    if kind not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {kind!r}")
    if kind == "bookkeeping" or (kind == "auto" and bookkeeping.supports(model)):
        return bookkeeping.BookkeepingClipping(model)
    return PerSampleGradients(model)
