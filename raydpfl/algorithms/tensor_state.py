"""Flat, deterministic keys for an algorithm's checkpointed tensor state.

`Algorithm.tensor_state` returns one flat ``{key: tensor}`` dict, saved in a tensors-only
torch file beside the JSON checkpoint: ``"{field}/{name}"`` for a server-wide parameter
dict (server momentum, SCAFFOLD's c) and ``"{field}/{client_id}/{name}"`` for per-client
dicts (control variates, PRIVATEFL's transformations). These helpers write and read
that layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

Params = dict[str, torch.Tensor]


def pack_tensors(field: str, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`params` under ``"{field}/{name}"`` (one server-wide dict, for `tensor_state`)."""
    return {f"{field}/{n}": t for n, t in params.items()}


def pack_client_tensors(
    field: str, per_client: Mapping[int, Mapping[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """Every client's dict under ``"{field}/{client_id}/{name}"``, clients in ascending
    id order (so the file's layout does not depend on the order clients were seen)."""
    return {
        f"{field}/{int(c)}/{n}": t for c in sorted(per_client) for n, t in per_client[c].items()
    }


def unpack_tensor_state(
    tensors: Mapping[str, torch.Tensor],
    *,
    shared: Sequence[str] = (),
    per_client: Sequence[str] = (),
) -> tuple[dict[str, Params], dict[str, dict[int, Params]]]:
    """Splits a `tensor_state` back into its fields (the inverse of the packers).

    Returns ``(field → params, field → client id → params)`` for the `shared` and
    `per_client` fields that occur (absent fields are simply missing). A key with
    another field, or a per-client key whose client id is not a non-negative integer,
    raises ValueError naming the key: the state was written by something else.
    """
    out_shared: dict[str, Params] = {}
    out_clients: dict[str, dict[int, Params]] = {}
    for key, t in tensors.items():
        field, _, rest = key.partition("/")
        if field in shared and rest:
            out_shared.setdefault(field, {})[rest] = t
            continue
        client, _, name = rest.partition("/")
        if field in per_client and client.isdigit() and name:
            out_clients.setdefault(field, {}).setdefault(int(client), {})[name] = t
            continue
        expected = [f"{f}/<name>" for f in shared] + [f"{f}/<client>/<name>" for f in per_client]
        raise ValueError(
            f"unexpected tensor state entry {key!r}: expected only {expected or 'none'}"
        )
    return out_shared, out_clients
