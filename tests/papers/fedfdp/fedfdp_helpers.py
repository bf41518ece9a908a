"""Tiny problems shared by the FedFDP algorithm tests (not a test module)."""

from __future__ import annotations

import torch
from torch import nn

from raydpfl.algorithms.base import ClientContext, ClientData
from raydpfl.privacy.per_sample.engines import make_engine


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def tiny_data(n: int = 40, client_id: int = 0) -> ClientData:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 4, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    return ClientData(client_id=client_id, x=x, y=y, indices=torch.arange(n))


_ENGINES: dict[int, object] = {}


def ctx(model: nn.Module, seed: int = 0) -> ClientContext:
    # One engine per model: the book-keeping engine hooks the model for its lifetime.
    engine = _ENGINES.setdefault(id(model), make_engine(model))
    return ClientContext(
        model=model,
        clipping=engine,  # type: ignore[arg-type]
        generator=torch.Generator().manual_seed(seed),
        device=torch.device("cpu"),
    )


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}
