"""Choosing the per-sample clipping engine for a model.

Both engines compute one DP-SGD step's Σ_i a_i ∇ℓ_i
(`raydpfl.privacy.per_sample.dpsgd.ClippedSumEngine`):
`PerSampleGradients` materialises per-sample gradients with torch.func (any model);
`BookkeepingClipping` computes per-sample norms from layer inputs and output gradients
without materialising them (`raydpfl.privacy.per_sample.bookkeeping`, with the rules of
`raydpfl.privacy.per_sample`; layers with a rule only). They give the same update up to
float error. This module sits above both, so neither imports the other's chooser.
"""

from __future__ import annotations

import logging
import warnings

from torch import nn

from raydpfl.privacy.per_sample import bookkeeping
from raydpfl.privacy.per_sample.dpsgd import ClippedSumEngine, PerSampleGradients

#: The engine names `make_engine` (and ``runtime.engine``) accept.
ENGINES = ("auto", "bookkeeping", "vmap")

log = logging.getLogger(__name__)


class EngineFallbackWarning(UserWarning):
    """``runtime.engine: auto`` took the vmap engine: a layer of the model has no
    per-sample rule (the message names it)."""


def fallback_reason(model: nn.Module) -> str | None:
    """Why ``auto`` would not take the book-keeping engine for `model` (None: it would):
    the first layer without a per-sample rule, named (`bookkeeping.first_unsupported`)."""
    return bookkeeping.first_unsupported(model)


def make_engine(model: nn.Module, kind: str = "auto") -> ClippedSumEngine:
    """The per-sample clipping engine for `model`.

    ``bookkeeping`` computes per-sample norms from layer inputs and output gradients;
    ``vmap`` materialises per-sample gradients with torch.func; ``auto`` takes
    book-keeping wherever every layer has a rule for it, and otherwise says in one
    line (an `EngineFallbackWarning`, also logged) which layer has
    none and that the model runs on vmap.

    Raises:
        ValueError: `kind` is not one of `ENGINES`, or ``bookkeeping`` for a model with
            a layer that has no rule (the message names it).
    """
    if kind not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {kind!r}")
    if kind == "bookkeeping":
        return bookkeeping.BookkeepingClipping(model)
    if kind == "auto":
        reason = fallback_reason(model)
        if reason is None:
            return bookkeeping.BookkeepingClipping(model)
        message = (
            f"runtime.engine auto: {type(model).__name__}'s {reason}; it falls back to the "
            "vmap engine (torch.func per-sample gradients, slower)"
        )
        log.info(message)
        warnings.warn(message, EngineFallbackWarning, stacklevel=2)
    return PerSampleGradients(model)
