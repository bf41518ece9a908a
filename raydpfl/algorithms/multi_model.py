"""Several models in one parameter dict: the layout multi-model algorithms use.

The server keeps one flat ``dict[str, Tensor]``. A single-model algorithm keeps the
model's own (unprefixed) names. A multi-model algorithm (RC-DPFL's M cluster models,
its clustered baselines) keeps model ``k`` under ``"{k}/{name}"``; a `ClientTask` names
the model its client starts from in `model_key`, and `Algorithm.evaluation_model_keys`
names the model that scores each client. Checkpoints, hashing and the broadcast handle
the flat dict unchanged.

These helpers live here (not in `raydpfl.simulation`) so algorithms may use them; the
worker (`raydpfl.simulation.worker`) imports them too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

Params = dict[str, torch.Tensor]

#: `ClientTask.model_key` of the single global model (unprefixed parameter names).
GLOBAL_MODEL = "global"
#: `ClientTask.model_key` asking for every broadcast model at once, read-only (e.g. for a
#: client that scores all cluster models to choose its cluster).
ALL_MODELS = "*"


def cluster_key(m: int) -> str:
    """The model key of cluster model m: ``"m{m}"``."""
    return f"m{int(m)}"


def model_params(params: Mapping[str, torch.Tensor], model_key: str) -> Params:
    """Model `model_key` of a flat dict: the ``"{model_key}/"`` entries without the prefix,
    or the whole (single-model) mapping for ``global``.

    Raises:
        KeyError: If no parameter carries that prefix.
    """
    if model_key == GLOBAL_MODEL:
        return dict(params)
    prefix = f"{model_key}/"
    out = {n[len(prefix) :]: t for n, t in params.items() if n.startswith(prefix)}
    if not out:
        raise KeyError(f"no model {model_key!r} in the parameters")
    return out


def shared_params(params: Mapping[str, torch.Tensor]) -> Params:
    """The unprefixed entries of a flat dict: the part every model key shares (all of a
    single-model dict, none of a pure multi-model one)."""
    return {n: t for n, t in params.items() if "/" not in n}


def join_models(models: Sequence[Mapping[str, torch.Tensor]], keys: Sequence[str]) -> Params:
    """One flat dict holding ``models[k]`` under ``"{keys[k]}/{name}"`` (in that order)."""
    if len(models) != len(keys) or len(set(keys)) != len(keys):
        raise ValueError("need one distinct key per model")
    return {f"{k}/{n}": t for k, m in zip(keys, models, strict=True) for n, t in m.items()}


def is_multi_model(params: Mapping[str, torch.Tensor]) -> bool:
    """Whether `params` uses the prefixed multi-model layout."""
    return bool(params) and all("/" in n for n in params)
