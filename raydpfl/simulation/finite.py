"""A global model with NaN or inf in it, or whose weights have exploded, stops the run
(issues 35, 53): a clip norm, learning rate or noise so large that the aggregate
overflows would otherwise "complete" and save an all-NaN model with exit 0; and one just
below overflow (``lr: 1e30``: weights of 1e29, a test loss of 2e29) did, without a word.

Why `MAX_WEIGHT` = 1e15. No model trained by gradient steps has weights near it (trained
networks' weights are O(1); a linear model on unscaled features, O(1e4)), and a float32
weight there is past repair: its spacing (ulp) is 2^(49-23) ≈ 6.7e7, so every update
smaller than ~3e7 — any clipped DP step, η·C, and any sane SGD step — rounds away to
nothing, and an O(1) input times it already gives activations of 1e15+, so the loss is
meaningless. Stopping there loses nothing a later round could have recovered, and keeps
the rounds before the explosion (as for NaN).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

#: The largest weight magnitude a global model may reach (see the module docstring).
MAX_WEIGHT = 1e15


class NonFiniteModelError(RuntimeError):
    """The global model holds NaN or inf, or a weight past `MAX_WEIGHT`, after a round's
    aggregation."""


def check_finite_model(
    params: Mapping[str, torch.Tensor], round_idx: int, clients: Sequence[int]
) -> None:
    """Raises `NonFiniteModelError` (one line: the round, the tensors, the round's clients)
    when any floating-point tensor of `params` holds a NaN or an inf, or a value whose
    magnitude exceeds `MAX_WEIGHT`. One device sync."""
    names = [n for n, t in params.items() if t.is_floating_point() and t.numel()]
    if not names:
        return
    # Each tensor's largest magnitude: NaN if it holds a NaN (amax propagates it).
    peaks = torch.stack([params[n].detach().abs().amax().double() for n in names]).cpu()
    finite = torch.isfinite(peaks)
    exploded = finite & (peaks > MAX_WEIGHT)
    if bool(finite.all()) and not bool(exploded.any()):
        return
    ids = sorted(int(c) for c in clients)
    shown = ", ".join(str(c) for c in ids[:10]) + (
        f", ... ({len(ids)} in all)" if len(ids) > 10 else ""
    )
    after = f"after aggregating the updates of client(s) {shown or 'none'}"
    if not bool(finite.all()):
        bad = [n for n, good in zip(names, finite.tolist(), strict=True) if not good]
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise NonFiniteModelError(
            f"round {round_idx + 1}: the global model holds NaN or inf ({bad[0]}{more}) "
            f"{after}; the run is stopped and its earlier rounds are kept (is clip_norm, lr "
            "or the noise too large?)"
        )
    worst = int(torch.argmax(torch.where(exploded, peaks, torch.zeros_like(peaks))))
    raise NonFiniteModelError(
        f"round {round_idx + 1}: the global model diverged: {names[worst]} holds a weight of "
        f"{float(peaks[worst]):.3g}, past {MAX_WEIGHT:g} (no step can move a float32 weight "
        f"there) {after}; the run is stopped and its earlier rounds are kept (is lr or "
        "clip_norm too large?)"
    )
