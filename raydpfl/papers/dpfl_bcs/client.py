"""DPFL-BCS's client half (Algorithm 2, §6.5 ClientStep): one full-batch clipped, noisy step.

Per-sample gradients of all D_n records are clipped (L2 to B for the Gaussian mechanism, L1 to
B for Laplace), averaged and scaled by η_t; in stage 1 the two clipped loss reports join the
same release. `BcsClientStep` is mixed into `raydpfl.papers.dpfl_bcs.algorithm.DpflBcs`, whose
server half sets what it reads: ``clip``, ``mechanism``, ``private``, ``regression``,
``loss_bound``. A private task's step is the platform's full-batch release
(`raydpfl.privacy.mechanisms.kernel.LiveRelease.mean_clipped_gradient`): the client half
supplies the loss, never touches the records or the noise.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call

from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    privacy_session,
)

_CHUNK = 256


class BcsClientStep:
    """The client half of DPFL-BCS and its baselines (PRIVATEFL overrides `_forward`)."""

    clip: float
    mechanism: str
    private: bool
    regression: bool
    loss_bound: float

    def _loss(self, out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy (classification) or squared error (regression: one output, float y)."""
        if not self.regression:
            return F.cross_entropy(out, y, reduction=reduction)
        return F.mse_loss(out.reshape(y.shape), y, reduction=reduction)

    def _forward(self, model: torch.nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
        """The model's output on a batch (PRIVATEFL first applies the client's transform)."""
        return functional_call(model, params, (x,))

    def _clipped_mean(
        self, ctx: ClientContext, params: Params, x, y, const: Params | None = None
    ) -> Params:
        """∇F_n(w): the plain full-batch gradient of a non-private baseline (a private
        task's clipped mean is the platform's release, `_noisy_step`). The gradient is taken
        with respect to `params` only; `const` enters the forward pass as a constant."""
        const = {} if const is None else {n: t.detach() for n, t in const.items()}
        with torch.enable_grad():
            leaves = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
            loss = self._loss(self._forward(ctx.model, {**leaves, **const}, x), y)
            grads = torch.autograd.grad(loss, list(leaves.values()))
        return {n: g.detach() for n, g in zip(leaves, grads, strict=True)}

    def _mean_clipped_loss(self, ctx: ClientContext, params: Params, x, y) -> float:
        with torch.no_grad():
            losses = [
                self._loss(
                    self._forward(ctx.model, params, x[s : s + _CHUNK]),
                    y[s : s + _CHUNK],
                    reduction="none",
                ).clamp(max=self.loss_bound)
                for s in range(0, x.shape[0], _CHUNK)
            ]
            return float(torch.cat(losses).mean())

    def _record_loss(self, model: torch.nn.Module) -> Any:
        """ℓ(params, const, x, y) on a batch: the loss the platform differentiates per
        record (it calls it on batches of one)."""

        def loss(params: Params, const: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self._loss(self._forward(model, {**params, **const}, x), y)

        return loss

    def _noisy_step(
        self,
        ctx: ClientContext,
        trainable: Params,
        const: Params,
        task: ClientTask,
        data: ClientData,
    ) -> tuple[Params, dict[str, float]]:
        """The released step η_t·(clipped mean gradient) + noise for every `trainable`
        coordinate (`const` enters the forward pass only), and in stage 1 the two noisy loss
        reports of the same release. The caller applies −step to what it owns.

        Private: the task's declared release computes it from the client's records (the
        platform's full-batch release: per-record gradients clipped to B in the
        mechanism's norm, the declared sensitivity checked against 2η_tB/D_n, + 2η_tΘ/D_n
        with the loss reports, Eq. 13). Non-private baselines read the records directly."""
        lr = task.lr
        stage1 = bool(task.extras.get("stage1", 0.0))
        metrics: dict[str, float] = {}
        if task.mechanisms:
            release = privacy_session(ctx, task, data).get()
            out = release.mean_clipped_gradient(
                trainable,
                self._record_loss(ctx.model),
                clip_norm=self.clip,
                scale=lr,
                const=const,
                norm=1 if self.mechanism == "laplace" else 2,  # the seed's rule (§6.5 b)
                loss_bound=self.loss_bound if stage1 else None,
                loss_reports=("start", "after_step") if stage1 else (),
            )
            if stage1:  # coordinates d+1, d+2 of the same release (Eq. 13, Alg. 2)
                metrics["loss_before"] = out.losses[0] / lr
                metrics["loss_after"] = out.losses[1] / lr
            return out.update, metrics
        x, y = data.batch(torch.arange(data.num_examples, device=data.device))
        mean_grad = self._clipped_mean(ctx, trainable, x, y, const)
        step = {n: g * lr for n, g in mean_grad.items()}  # g_n^t = η_t·∇F_n
        if stage1:
            model = {**trainable, **const}
            metrics["loss_before"] = self._mean_clipped_loss(ctx, model, x, y)
            local = {n: t.detach() - step[n] if n in step else t for n, t in model.items()}
            metrics["loss_after"] = self._mean_clipped_loss(ctx, local, x, y)
        return step, metrics

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        noisy, metrics = self._noisy_step(ctx, params, {}, task, data)
        return ClientResult(
            client_id=task.client_id,
            update={name: -g for name, g in noisy.items()},
            weight=1.0,
            num_examples=data.num_examples,
            metrics=metrics,
        )
