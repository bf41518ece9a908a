"""FedFair (Algorithm 1 of "FedFDP: Fairness-Aware Federated Learning with Differential
Privacy", Ling et al.; seed 001; shared/specs/fedfdp.md §4): non-private.

Local objective (001 Eq. 7): H_i(w) = F_i(w) + (λ/2)(F_i(w) − F(w_t))², with the broadcast
global loss F(w_t) held constant, so ∇H_i = (1 + λΔ_i)∇F_i with Δ_i = F_i(w, b) − F(w_t) the
batch-mean loss at the current iterate minus the global loss (Eq. 8): a per-batch dynamic
learning rate η(1 + λΔ_i) (Eq. 9; `fair_lr_factor`). λ = 0 is FedAvg.

Each client uploads its model and its training loss F_i(w_{t+1}^i) (over its whole
training split, §11 A2; or one batch); the server averages both with p_i ∝ |D_i|
(Alg. 1 S5–S6). F(w_0) = `initial_global_loss` (0.0, as the authors' code, §11 A8).
The uploaded losses are in the clear: FedFair has no privacy (listed in
`unaccounted_releases`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    trained_result,
)
from raydpfl.algorithms.local_dp_sgd import per_sample_losses
from raydpfl.papers.fedfdp.pfl_base import PflBase, local_sgd, mean_loss
from raydpfl.privacy.per_sample.dpsgd import poisson_sample


def fair_lr_factor(batch_loss: float, global_loss: float, lam: float) -> float:
    """1 + λ(F_i(w, b) − F(w_t)) (001 Eq. 8–9). With `min_factor`, callers may clamp it."""
    if lam == 0.0:
        return 1.0
    return 1.0 + lam * (batch_loss - global_loss)


def aggregate_losses(losses: Sequence[float], weights: Sequence[float]) -> float:
    """F(w_{t+1}) = Σ p_i F_i with p_i ∝ weights over the clients that uploaded (Alg. 1 S6)."""
    w = np.asarray(weights, dtype=float)
    return float(np.dot(np.asarray(losses, dtype=float), w / w.sum()))


def weighted_variance(values: Sequence[float], weights: Sequence[float]) -> float:
    """Σ p_i (v_i − Σ p_j v_j)² with p ∝ weights (Ψ, Eq. 2), NaN entries dropped."""
    v, w = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
    keep = np.isfinite(v)
    if not keep.any() or w[keep].sum() <= 0:
        return float("nan")
    v, p = v[keep], w[keep] / w[keep].sum()
    return float(np.sum(p * (v - np.sum(p * v)) ** 2))


class FedFair(PflBase):
    """FedFair: fairness-scaled local SGD; model and loss averaged by the server."""

    name = "fedfair"
    is_private = False

    def __init__(
        self,
        *,
        lam: float,
        initial_global_loss: float = 0.0,
        loss_eval: Literal["full", "batch"] = "full",
        min_factor: float | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.lam = lam
        self.global_loss = initial_global_loss
        self.loss_eval = loss_eval
        self.min_factor = min_factor
        self._last: dict[str, float] = {}

    def _round_extras(self) -> dict[str, float]:
        return {"lam": self.lam, "global_loss": self.global_loss}

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        new = super().aggregate(global_params, tasks, results)
        if results:
            losses = [r.metrics["uploaded_loss"] for r in results]
            weights = [r.weight for r in results]
            self.global_loss = aggregate_losses(losses, weights)
            self._last = {
                "fedfair_global_loss": self.global_loss,
                "fedfair_psi_uploaded": weighted_variance(losses, weights),
            }
        return new

    def after_round(
        self,
        round_idx: int,
        metrics: Mapping[str, float],
        followups: Sequence[ClientResult] = (),
    ) -> dict[str, float]:
        super().after_round(round_idx, metrics, followups)
        return {**self._last, "fedfair_lambda": self.lam}

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        lam, global_loss = float(task.extras["lam"]), float(task.extras["global_loss"])

        def scale(loss: float) -> float:
            f = fair_lr_factor(loss, global_loss, lam)
            return f if self.min_factor is None else max(f, self.min_factor)

        start, metrics = local_sgd(ctx, params, data, task, private=False, loss_scale=scale)
        if self.loss_eval == "full":
            uploaded = mean_loss(ctx.model, params, data)
        else:
            positions = poisson_sample(data.num_examples, self.sampling_rate, ctx.generator)
            losses = per_sample_losses(ctx.model, params, *data.batch(positions))
            uploaded = float(losses.mean()) if losses.numel() else global_loss
        metrics["uploaded_loss"] = uploaded
        return trained_result(task, data, params, start, metrics)

    def unaccounted_releases(self) -> list[str]:
        return [
            *super().unaccounted_releases(),
            "client_losses (each client's training loss, uploaded in the clear: FedFair is "
            "non-private)",
        ]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "global_loss": self.global_loss, "lam": self.lam}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.global_loss = float(state.get("global_loss", self.global_loss))
        self.lam = float(state.get("lam", self.lam))
