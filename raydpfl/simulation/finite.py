"""A global model with NaN or inf in it stops the run (issue 35): a clip norm, learning
rate or noise so large that the aggregate overflows would otherwise "complete" and save
an all-NaN model with exit 0."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


class NonFiniteModelError(RuntimeError):
    """The global model holds NaN or inf after a round's aggregation."""


def check_finite_model(
    params: Mapping[str, torch.Tensor], round_idx: int, clients: Sequence[int]
) -> None:
    """Raises `NonFiniteModelError` (one line: the round, the tensors, the round's clients)
    when any floating-point tensor of `params` holds a NaN or an inf. One device sync."""
    names = [n for n, t in params.items() if t.is_floating_point()]
    if not names:
        return
    ok = torch.stack([torch.isfinite(params[n]).all() for n in names]).cpu()
    if bool(ok.all()):
        return
    bad = [n for n, good in zip(names, ok.tolist(), strict=True) if not good]
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    ids = sorted(int(c) for c in clients)
    shown = ", ".join(str(c) for c in ids[:10]) + (
        f", ... ({len(ids)} in all)" if len(ids) > 10 else ""
    )
    raise NonFiniteModelError(
        f"round {round_idx + 1}: the global model holds NaN or inf ({bad[0]}{more}) after "
        f"aggregating the updates of client(s) {shown or 'none'}; the run is stopped and "
        "its earlier rounds are kept (is clip_norm, lr or the noise too large?)"
    )
