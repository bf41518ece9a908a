"""Robust aggregation of the round's client updates: coordinate-wise median and trimmed mean.

Both are Yin, Chen, Ramchandran & Bartlett, "Byzantine-Robust Distributed Learning:
Towards Optimal Statistical Rates" (ICML 2018):

- coordinate-wise median (their Definition 1): for every coordinate, the median of the
  clients' values (the mean of the two middle values when their number is even);
- coordinate-wise β-trimmed mean (Definition 2): for every coordinate, drop the ⌊βm⌋
  largest and the ⌊βm⌋ smallest of the m values and average the rest (0 ≤ β < 1/2).

Both are unweighted: a client's weight (|D_k|) would let one client with a large claimed
dataset move the result, which is what they are meant to prevent. `mean` is the weighted
mean Σ w_k Δ_k / Σ w_k the rest of the package uses.

Privacy: under record-level DP each client's update is already a DP release, and the
server's combination of released updates is post-processing (no extra cost). Under
client-level DP the noise is calibrated to a *sum*, whose sensitivity a median does not
have: those algorithms do not take these aggregators (the config refuses them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Params = dict[str, torch.Tensor]

#: The aggregators `experiment.algorithm.server.aggregator` takes.
AGGREGATORS = ("mean", "median", "trimmed_mean")


def coordinate_median(updates: Sequence[Params]) -> Params:
    """Coordinate-wise median of the updates (Yin et al. 2018, Def. 1); for an even number
    the mean of the two middle values (`torch.median` would return the lower one)."""
    _check_nonempty(updates)
    m = len(updates)
    out: Params = {}
    for name in updates[0]:
        values = torch.stack([u[name] for u in updates]).sort(dim=0).values
        lo, hi = values[(m - 1) // 2], values[m // 2]
        out[name] = lo if lo is hi else (lo + hi) / 2
    return out


def trimmed_mean(updates: Sequence[Params], trim_fraction: float) -> Params:
    """Coordinate-wise β-trimmed mean (Yin et al. 2018, Def. 2): per coordinate, the mean
    of the values left after dropping the ⌊βm⌋ largest and ⌊βm⌋ smallest, β = `trim_fraction`."""
    _check_nonempty(updates)
    if not 0 <= trim_fraction < 0.5:
        raise ValueError(f"trim_fraction must be in [0, 0.5), got {trim_fraction}")
    m = len(updates)
    k = int(trim_fraction * m)
    out: Params = {}
    for name in updates[0]:
        values = torch.stack([u[name] for u in updates]).sort(dim=0).values
        out[name] = values[k : m - k].mean(dim=0)
    return out


def robust_update(name: str, updates: Sequence[Params], trim_fraction: float = 0.1) -> Params:
    """The round's update Δ combined by the aggregator `name` (``median`` or ``trimmed_mean``)."""
    if name == "median":
        return coordinate_median(updates)
    if name == "trimmed_mean":
        return trimmed_mean(updates, trim_fraction)
    raise ValueError(f"aggregator must be median or trimmed_mean here, got {name!r}")


def _check_nonempty(updates: Sequence[Params]) -> None:
    if not updates:
        raise ValueError("no updates to aggregate")
