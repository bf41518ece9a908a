"""Aggregation rules of DPFL-BCS's baselines (shared/specs/dpfl-bcs.md §11.7).

The baselines share DPFL-BCS's client machinery (`raydpfl.papers.dpfl_bcs.algorithm`: one
full-batch clipped step, the same per-client budgets split over an integer plan, the same
exhaustion rule) and differ in selection and aggregation:

- FedSGD (no DP), DPSGD (Gaussian) and DMLDP (Laplace): uniform selection, plain 1/|S_t| mean.
  DMLDP is Wu et al.'s Laplace baseline reduced to this machinery (L1 clipping, Laplace noise),
  as the spec recommends; the original's other details are not modelled.
- WeiAvg: uniform selection; weights ε_n/Σ_{m∈S_t} ε_m ("the ratio of privacy as aggregate
  weights", §11.7). The seed gives no more detail; this is the spec's [REC].
- PFA (Liu et al., "Projected Federated Averaging with Heterogeneous Differential Privacy",
  VLDB 2022; NOT in /work/shared/seeds, implemented from its published description and
  these assumptions): clients whose ε_n is in the top ``public_fraction`` of all budgets are
  "public", the rest "private". Each round the server takes the top-``rank`` right singular
  subspace V of the public clients' (noisy) updates of that round (uncentred SVD of the
  |P|×d matrix; the paper uses Lanczos on the same covariance), replaces every private
  update u by its projection V Vᵀ u, and aggregates all updates with WeiAvg's ε-weights.
  A round without a public client falls back to WeiAvg. Post-processing only: no privacy cost.

- PRIVATEFL (uniform) and PRIVATEFL-BCS (biased selection), Table I: a personalised input
  transformation per client (Yang et al., USENIX Security 2023; NOT in the seeds); see
  `raydpfl.papers.dpfl_bcs.privatefl` for the model, what is noised and our assumptions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

Params = dict[str, torch.Tensor]


def weiavg_weights(epsilons: Sequence[float]) -> np.ndarray:
    """WeiAvg's aggregation weights ε_n/Σ_{m∈S_t} ε_m over the round's clients."""
    eps = np.asarray(epsilons, dtype=float)
    if eps.size == 0 or np.any(eps <= 0) or not np.all(np.isfinite(eps)):
        raise ValueError("epsilons must be a non-empty array of finite values > 0")
    return eps / eps.sum()


def pfa_public_mask(epsilons: Sequence[float], public_fraction: float) -> np.ndarray:
    """Which clients PFA treats as public: ε_n ≥ the (1 − fraction) quantile of all ε."""
    eps = np.asarray(epsilons, dtype=float)
    if not 0 < public_fraction <= 1:
        raise ValueError(f"public_fraction must be in (0, 1], got {public_fraction}")
    threshold = np.quantile(eps, 1.0 - public_fraction)
    return eps >= threshold


def flatten(update: Params) -> torch.Tensor:
    """One update as a flat vector (parameters in insertion order)."""
    return torch.cat([t.reshape(-1) for t in update.values()])


def unflatten(vector: torch.Tensor, like: Params) -> Params:
    """The inverse of `flatten` for tensors shaped like `like`."""
    out, offset = {}, 0
    for name, t in like.items():
        out[name] = vector[offset : offset + t.numel()].view_as(t).clone()
        offset += t.numel()
    return out


def project_onto_public(
    public: torch.Tensor, private: torch.Tensor, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """PFA's projection: private rows onto the top-``rank`` right singular subspace of the
    public rows. Returns (projected private rows, the d×k basis)."""
    if public.ndim != 2 or private.ndim != 2 or public.shape[1] != private.shape[1]:
        raise ValueError("public and private must be (n, d) matrices with the same d")
    k = max(1, min(rank, public.shape[0]))
    _, _, vh = torch.linalg.svd(public.double(), full_matrices=False)
    basis = vh[:k].T  # d × k, orthonormal columns
    projected = (private.double() @ basis) @ basis.T
    return projected.to(private.dtype), basis


def weighted_mean(updates: Sequence[torch.Tensor], weights: np.ndarray) -> torch.Tensor:
    """Σ w_k u_k for weights summing to 1 (in the given order)."""
    total = torch.zeros_like(updates[0])
    for u, w in zip(updates, weights, strict=True):
        total.add_(u, alpha=float(w))
    return total
