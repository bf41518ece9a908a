"""DPFL-BCS's client half (Algorithm 2, §6.5 ClientStep): one full-batch clipped, noisy step.

Per-sample gradients of all D_n records are clipped (L2 to B for the Gaussian mechanism, L1 to
B for Laplace), averaged and scaled by η_t; in stage 1 the two clipped loss reports join the
same release. `BcsClientStep` is mixed into `raydpfl.papers.dpfl_bcs.algorithm.DpflBcs`, whose
server half sets what it reads: ``clip``, ``mechanism``, ``private``, ``regression``,
``loss_bound`` and the per-worker cache ``_psg``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    privacy_session,
)

_CHUNK = 256


def clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """min(1, B/‖g‖): the seed's per-sample clipping rule (L2 for GM, L1 for LM, §6.5 b)."""
    return torch.clamp(clip / (norms + 1e-12), max=1.0)


class BcsClientStep:
    """The client half of DPFL-BCS and its baselines (PRIVATEFL overrides `_forward`)."""

    clip: float
    mechanism: str
    private: bool
    regression: bool
    loss_bound: float
    _psg: dict[int, Any]

    def _loss(self, out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy (classification) or squared error (regression: one output, float y)."""
        if not self.regression:
            return F.cross_entropy(out, y, reduction=reduction)
        return F.mse_loss(out.reshape(y.shape), y, reduction=reduction)

    def _forward(self, model: torch.nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
        """The model's output on a batch (PRIVATEFL first applies the client's transform)."""
        return functional_call(model, params, (x,))

    def _per_sample(self, model: torch.nn.Module) -> Any:
        fn = self._psg.get(id(model))
        if fn is None:

            def sample_loss(
                params: Params, const: Params, x: torch.Tensor, y: torch.Tensor
            ) -> torch.Tensor:
                out = self._forward(model, {**params, **const}, x.unsqueeze(0))
                return self._loss(out, y.unsqueeze(0))

            fn = vmap(grad(sample_loss), in_dims=(None, None, 0, 0))
            self._psg[id(model)] = fn
        return fn

    def _clipped_mean(
        self, ctx: ClientContext, params: Params, x, y, const: Params | None = None
    ) -> Params:
        """(1/D_n)·Σ clip(∇f(w, ζ)) over all records (L2 for GM, L1 for LM; none: plain).

        The gradient is taken with respect to `params` only; `const` (PRIVATEFL's frozen
        transform) enters the forward pass as a constant."""
        const = {} if const is None else {n: t.detach() for n, t in const.items()}
        frozen = {n: p.detach() for n, p in params.items()}
        total = {n: torch.zeros_like(p) for n, p in frozen.items()}
        if not self.private:
            with torch.enable_grad():
                leaves = {n: p.clone().requires_grad_(True) for n, p in frozen.items()}
                loss = self._loss(self._forward(ctx.model, {**leaves, **const}, x), y)
                grads = torch.autograd.grad(loss, list(leaves.values()))
            return {n: g.detach() for n, g in zip(leaves, grads, strict=True)}
        per_sample = self._per_sample(ctx.model)
        order = 1 if self.mechanism == "laplace" else 2
        for start in range(0, x.shape[0], _CHUNK):
            g = per_sample(frozen, const, x[start : start + _CHUNK], y[start : start + _CHUNK])
            flat = torch.cat([t.reshape(t.shape[0], -1) for t in g.values()], dim=1)
            norms = flat.abs().sum(dim=1) if order == 1 else flat.norm(dim=1)
            factors = clip_factors(norms, self.clip)
            for name, t in g.items():
                total[name].add_(torch.einsum("b,b...->...", factors, t))
        return {n: t / x.shape[0] for n, t in total.items()}

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

    def _noisy_step(
        self,
        ctx: ClientContext,
        trainable: Params,
        const: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        task: ClientTask,
        data: ClientData | None = None,
    ) -> tuple[Params, dict[str, float]]:
        """The released step η_t·(clipped mean gradient) + noise for every `trainable`
        coordinate (`const` enters the forward pass only), and in stage 1 the two noisy loss
        reports of the same release. The caller applies −step to what it owns."""
        lr = task.lr
        mean_grad = self._clipped_mean(ctx, trainable, x, y, const)
        step = {n: g * lr for n, g in mean_grad.items()}  # g_n^t = η_t·∇F_n
        # One invocation of the task's declared release (none for a non-private baseline).
        release = privacy_session(ctx, task, data).get().open() if task.mechanisms else None
        scale = release.scale if release is not None else 0.0
        metrics: dict[str, float] = {}
        if task.extras.get("stage1", 0.0):
            model = {**trainable, **const}
            before = self._mean_clipped_loss(ctx, model, x, y)
            local = {n: t.detach() - step[n] if n in step else t for n, t in model.items()}
            after = self._mean_clipped_loss(ctx, local, x, y)
            # The two losses are coordinates d+1, d+2 of the same release (Eq. 13, Alg. 2).
            noise = release.noise(torch.Size([2])) if release and scale > 0 else torch.zeros(2)
            metrics["loss_before"] = (lr * before + float(noise[0])) / lr
            metrics["loss_after"] = (lr * after + float(noise[1])) / lr
        noisy = {
            name: g + release.noise(g.shape) if release and scale > 0 else g
            for name, g in step.items()
        }
        return noisy, metrics

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        x, y = data.batch(torch.arange(data.num_examples, device=data.device))
        noisy, metrics = self._noisy_step(ctx, params, {}, x, y, task, data)
        return ClientResult(
            client_id=task.client_id,
            update={name: -g for name, g in noisy.items()},
            weight=1.0,
            num_examples=data.num_examples,
            metrics=metrics,
        )
