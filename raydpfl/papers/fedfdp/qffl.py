"""q-FFL (Li et al., ICLR 2020) and DP q-FFL, FedFDP's baselines (shared/specs/fedfdp.md
§8.3, §11 A16): the q-FedSGD/q-FedAvg server step with Lipschitz estimate L = 1/η:
Δ_k = L(w_t − y_k), h_k = q F_k^{q−1}‖Δ_k‖² + L F_k^q, w ← w_t − Σ F_k^q Δ_k / Σ h_k
(`qffl_step`).

DP q-FFL needs each client's loss F_k(w_t): it is released by a ``loss`` follow-up task
after aggregation (the loss of the new global model), exactly FedFDP's loss mechanism
(`raydpfl.papers.fedfdp.loss_upload`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from raydpfl.algorithms.base import ClientContext, ClientData, ClientResult, ClientTask, Params
from raydpfl.papers.fedfdp.loss_upload import LossUpload, LossUploadFollowups, release_loss
from raydpfl.papers.fedfdp.pfl_base import PflBase, run_local_sgd


def qffl_step(
    global_params: Params,
    deltas: Sequence[Params],
    losses: Sequence[float],
    *,
    q: float,
    lr: float,
    eps: float = 1e-10,
) -> Params:
    """q-FedAvg's server step (Li et al. 2020, Alg. 3) with L = 1/η.

    Δw_k = L(w_t − y_k) = −Δ_k/η;  h_k = q(F_k+eps)^{q−1}‖Δw_k‖² + L(F_k+eps)^q;
    w_{t+1} = w_t − Σ_k (F_k+eps)^q Δw_k / Σ_k h_k. q = 0 is FedAvg's uniform mean with
    step 1 (Σ Δ_k / K). Losses must be ≥ 0 (callers clip released losses at 0).
    """
    lip = 1.0 / lr
    num = {n: torch.zeros_like(t) for n, t in global_params.items()}
    denom = 0.0
    for delta, loss in zip(deltas, losses, strict=True):
        f = max(float(loss), 0.0) + eps
        dw = {n: -lip * d for n, d in delta.items()}
        sq = float(sum(t.double().pow(2).sum() for t in dw.values()))
        denom += q * f ** (q - 1.0) * sq + lip * f**q
        for n in num:
            num[n].add_(dw[n], alpha=f**q)
    if denom <= 0:
        return {n: t.clone() for n, t in global_params.items()}
    return {n: global_params[n] - num[n] / denom for n in global_params}


class QFFL(PflBase):
    """q-FFL (q-FedAvg) with exponent `qffl_q`; F_k(w_t) is the first local batch's loss."""

    name = "qffl"

    def __init__(self, *, qffl_q: float = 1.0, **kw: Any) -> None:
        super().__init__(**kw)
        self.qffl_q = qffl_q

    def _losses(self, results: Sequence[ClientResult]) -> list[float]:
        return [float(r.metrics.get("first_batch_loss", 0.0)) for r in results]

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        if not results:
            return {n: t.clone() for n, t in global_params.items()}
        return qffl_step(
            global_params,
            [r.update for r in results],
            self._losses(results),
            q=self.qffl_q,
            lr=self.lr,
        )

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        return run_local_sgd(self, ctx, params, data, task)


class DPQFFL(LossUploadFollowups, QFFL):
    """q-FFL with DP-SGD local steps and F_k(w_t) from the private loss upload.

    After aggregation each client releases the loss of the new global model through
    `LossUpload` (a ``loss`` follow-up charged SGM(q_l, σ_l)); the server keeps it as
    F_k for the next round (post-processing). Before the first release F_k = `init_loss`
    (data-independent, ln(num_classes) by default).
    """

    name = "dp_qffl"
    is_private = True

    def __init__(self, *, loss_upload: LossUpload, init_loss: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.loss_upload = loss_upload
        self.init_loss = init_loss
        self.client_loss: dict[int, float] = {}

    def _losses(self, results: Sequence[ClientResult]) -> list[float]:
        return [max(self.client_loss.get(r.client_id, self.init_loss), 0.0) for r in results]

    def after_round(
        self,
        round_idx: int,
        metrics: Mapping[str, float],
        followups: Sequence[ClientResult] = (),
    ) -> dict[str, float]:
        super().after_round(round_idx, metrics, followups)
        released = self.loss_upload.update([r for r in followups if "noisy_loss" in r.metrics])
        self.client_loss.update(released)
        if not released:
            return {}
        return {"qffl_loss_mean": float(np.mean(list(released.values())))}

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        if task.kind == "loss":
            return release_loss(ctx, params, data, task)
        return run_local_sgd(self, ctx, params, data, task)

    def unaccounted_releases(self) -> list[str]:
        return [
            *super().unaccounted_releases(),
            "loss_task_diagnostics (raw noiseless mean loss and size of each loss batch, "
            "returned to the server half beside the private loss; not written to outputs)",
        ]

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "client_loss": {str(k): v for k, v in self.client_loss.items()},
            "loss_upload": self.loss_upload.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.client_loss = {int(k): float(v) for k, v in state.get("client_loss", {}).items()}
        self.loss_upload.load_state_dict(state.get("loss_upload", {}))
