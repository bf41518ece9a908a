"""Binds a parameter dict to a resident module for one call, cheaply.

`torch.func.functional_call` is general (tied weights, strictness checks, buffers, any
attribute path) and pays for it on every call: ~0.3 ms on one CPU thread for FedAvgCNN's
8 tensors, about the cost of the forward pass itself at the batch of 3 records a W2
client step has (`benchmarks/profile_w1.py`). The per-sample clipping engine calls it
once per DP-SGD step, so `ParameterBinding` resolves the module slots once and then
swaps the tensors into them with plain dict stores, restoring the module's own afterwards.

The model computes the same function of the same tensors either way (the forward reads
`module.weight`, which is the bound tensor), so results are bit-identical to
`functional_call` (tests/privacy/test_param_binding.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
from torch import nn


class ParameterBinding:
    """The parameter slots of `model`, resolved once; `bound(params)` fills them.

    A tied parameter (one tensor under several names) is filled under every name from
    the first name `named_parameters()` gives it, as `functional_call` ties them. A name
    missing from `params` keeps the module's own tensor (``strict=False``, as there).
    Buffers are the module's own (what `functional_call` gets from detached copies of
    them: the same storage).
    """

    def __init__(self, model: nn.Module) -> None:
        first_name: dict[int, str] = {}
        self._slots: list[tuple[dict[str, torch.Tensor | None], str, str]] = []
        for full_name, p in model.named_parameters(remove_duplicate=False):
            owner, _, attr = full_name.rpartition(".")
            module = model.get_submodule(owner)
            canonical = first_name.setdefault(id(p), full_name)
            self._slots.append((module._parameters, attr, canonical))
        self.names = frozenset(name for _, _, name in self._slots)

    @contextlib.contextmanager
    def bound(self, params: Mapping[str, torch.Tensor]) -> Iterator[None]:
        """Within the block the model's parameters are `params`' tensors (by name)."""
        unknown = set(params) - self.names
        if unknown:
            raise KeyError(f"not parameters of the model: {sorted(unknown)}")
        saved = [slots[attr] for slots, attr, _ in self._slots]
        try:
            for slots, attr, name in self._slots:
                if name in params:
                    slots[attr] = params[name]
            yield
        finally:
            for (slots, attr, _), own in zip(self._slots, saved, strict=True):
                slots[attr] = own
