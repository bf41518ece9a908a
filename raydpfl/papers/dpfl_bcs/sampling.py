"""DPFL-BCS's client sampling: exactly K distinct clients with the planned inclusion
probabilities, by systematic PPS sampling (§6.4).

Paper: "The Power of Bias: Optimizing Client Selection in Federated Learning with Heterogeneous
Differential Privacy" (Ma et al.; seed 003, implementation spec shared/specs/dpfl-bcs.md, cited
as §). Pure functions over floats and numpy arrays (numpy and scipy only: no torch, no Ray).

`inclusion_probabilities` gives π_n = K·p_n over the available clients; `sample_clients`
draws S_t.
"""

from __future__ import annotations

import numpy as np

from raydpfl.papers.dpfl_bcs._checks import (
    _array,
    _count,
)


def inclusion_probabilities(
    probabilities: object, clients_per_round: int, available: object = None
) -> np.ndarray:
    """Per-round inclusion probabilities π_n = K·p_n over the candidate set 𝒜 (§6.4 [REC]).

    Clients outside ``available`` (a boolean mask or an index array; default: all) or with
    p_n = 0 get π_n = 0. The rest are rescaled so Σ π_n = k = min(K, their number), then any
    π_n > 1 is capped at 1 and the excess redistributed proportionally, until none exceeds 1.
    With every client available and T_n ≤ T_s this is exactly π_n = K·p_n = T_n/T_s.
    """
    p = _array("probabilities", probabilities)
    if np.any(p < 0):
        raise ValueError("probabilities must be >= 0")
    k_max = _count("clients_per_round", clients_per_round)
    w = p.copy()
    if available is not None:
        mask = np.zeros(p.size, dtype=bool)
        avail = np.asarray(available)
        if avail.dtype == bool:
            if avail.shape != p.shape:
                raise ValueError("a boolean available mask must match probabilities")
            mask = avail
        else:
            mask[avail.astype(np.int64)] = True
        w[~mask] = 0.0
    support = w > 0
    k = min(k_max, int(support.sum()))
    pi = np.zeros(p.size)
    capped = np.zeros(p.size, dtype=bool)
    while k > 0:
        free = support & ~capped
        pi[free] = (k - capped.sum()) * w[free] / w[free].sum()
        over = free & (pi > 1.0)
        if not over.any():
            break
        capped |= over
        pi[capped] = 1.0
        if not (support & ~capped).any():
            break
    return pi


def sample_clients(
    probabilities: object,
    clients_per_round: int,
    rng: np.random.Generator,
    available: object = None,
) -> np.ndarray:
    """Draw S_t: exactly min(K, |𝒜 ∩ {p_n > 0}|) distinct clients, sorted (§6.4 [REC]).

    Scheme: systematic PPS sampling (Madow 1949) on π = `inclusion_probabilities`. Clients
    with π_n = 1 are taken; the others are put in a fresh random order, laid end to end as
    intervals of length π_n on [0, k′), and the clients whose intervals contain u, u+1, …,
    u+k′−1 are taken, u ~ U[0, 1). Each point lands in an interval with probability equal to
    its length and no interval (length ≤ 1) holds two of the unit-spaced points, so every
    client is included with probability exactly π_n (= K·p_n, what Eqs. 15–17 use) and the
    K clients are distinct. Only first-order inclusion probabilities are controlled; the random
    order makes the pairwise ones positive but not those of a particular design.
    `numpy.random.Generator.choice(replace=False, p=…)` would instead distort π (§6.4).
    """
    pi = inclusion_probabilities(probabilities, clients_per_round, available)
    certain = np.flatnonzero(pi >= 1.0)
    rest = np.flatnonzero((pi > 0) & (pi < 1.0))
    k_rest = round(float(pi.sum())) - certain.size
    chosen = np.empty(0, dtype=np.int64)
    if k_rest > 0:
        order = rng.permutation(rest)
        edges = np.cumsum(pi[order])
        edges[-1] = k_rest  # absorb rounding so the last point always lands inside
        points = rng.random() + np.arange(k_rest)
        chosen = order[np.searchsorted(edges, points, side="right")]
    selected = np.sort(np.concatenate([certain, chosen]))
    if np.unique(selected).size != selected.size:
        # Only possible through floating-point rounding at an interval of length ~1.
        raise RuntimeError("systematic sampling selected a client twice")
    return selected
