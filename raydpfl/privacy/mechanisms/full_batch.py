"""What the platform computes from a client's records for its un-subsampled releases.

The kernel's `GaussianRelease`, `LaplaceRelease` and `ExponentialSelection` release
values computed here, by the platform, from the records a worker bound to the task, so
that the sensitivity the charge assumes holds whatever the client half does:

- `clipped_mean_gradient`: (1/n)·Σ clip(∇ℓ(w; z_i)) over all n records, each per-record
  gradient taken by ``vmap(grad(·))`` of the client half's one-record loss (so no record
  can enter another record's term) and clipped in the mechanism's norm (L2 for Gaussian
  noise, L1 for Laplace). Replace-one sensitivity 2C/n (DPFL-BCS Lemmas 1–2).
- `clamped_mean_loss`: (1/n)·Σ clamp(ℓ(w; z_i), 0, Θ), one record per term likewise;
  sensitivity Θ/n at a point w that does not depend on the records.
- `clip_in_place`: output perturbation's clip (PE-DPFL): any function of the records
  scaled into the ball of radius S has replace-one sensitivity 2S.
- `accuracy_percent`: a candidate model's accuracy in % on the records (RC-DPFL §5.4);
  it moves by at most 100/(n − 1) when one record is added or removed.

Pure functions of tensors: the live mechanisms in `raydpfl.privacy.mechanisms.kernel`
check the declared sensitivity against these bounds, draw the noise and count the use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch.func import functional_call, grad, vmap

Params = dict[str, torch.Tensor]

#: ℓ(params, const, x, y) on ONE record (x, y without a batch dimension) → a scalar.
RecordLoss = Callable[[Params, Params, torch.Tensor, torch.Tensor], torch.Tensor]

#: Records per vmap call (memory only: the sums do not depend on it).
CHUNK = 256
#: Records per forward pass when scoring a model (memory only).
EVAL_CHUNK = 1024


def clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """min(1, C/‖g‖) per record (the 1e-12 keeps a zero gradient's factor finite). DPFL-BCS's
    seed rule (§6.5 b), kept beside DP-SGD's `per_sample.dpsgd.clip_weights` (ε = 1e-6) so
    the full-batch releases keep their bits; both bound every contribution by C."""
    return torch.clamp(clip / (norms + 1e-12), max=1.0)


def _on_one_record(loss: RecordLoss) -> RecordLoss:
    """`loss` on a batch of one: the client half's loss sees one record at a time."""

    def one(params: Params, const: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss(params, const, x.unsqueeze(0), y.unsqueeze(0)).reshape(())

    return one


def clipped_mean_gradient(
    loss: RecordLoss,
    params: Params,
    const: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    clip: float,
    order: int,
) -> Params:
    """(1/n)·Σ_i min(1, C/‖∇ℓ_i‖_order)·∇ℓ_i over all n records, with respect to `params`
    (`const` enters the loss as a constant). An empty record set gives zeros."""
    frozen = {n: p.detach() for n, p in params.items()}
    fixed = {n: t.detach() for n, t in const.items()}
    total = {n: torch.zeros_like(p) for n, p in frozen.items()}
    n = int(x.shape[0])
    if n == 0:
        return total
    per_record = vmap(grad(_on_one_record(loss)), in_dims=(None, None, 0, 0))
    for start in range(0, n, CHUNK):
        g = per_record(frozen, fixed, x[start : start + CHUNK], y[start : start + CHUNK])
        flat = torch.cat([t.reshape(t.shape[0], -1) for t in g.values()], dim=1)
        norms = flat.abs().sum(dim=1) if order == 1 else flat.norm(dim=1)
        factors = clip_factors(norms, clip)
        for name, t in g.items():
            total[name].add_(torch.einsum("b,b...->...", factors, t))
    return {name: t / n for name, t in total.items()}


def clamped_mean_loss(
    loss: RecordLoss,
    params: Params,
    const: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    bound: float,
) -> float:
    """(1/n)·Σ_i clamp(ℓ_i, 0, Θ) over all n records (0.0 for none)."""
    n = int(x.shape[0])
    if n == 0:
        return 0.0
    frozen = {k: p.detach() for k, p in params.items()}
    fixed = {k: t.detach() for k, t in const.items()}
    per_record = vmap(_on_one_record(loss), in_dims=(None, None, 0, 0))
    with torch.no_grad():
        losses = [
            per_record(frozen, fixed, x[s : s + CHUNK], y[s : s + CHUNK]).clamp(0.0, bound)
            for s in range(0, n, CHUNK)
        ]
    return float(torch.cat(losses).mean())


def update_norm(update: Mapping[str, torch.Tensor], order: int) -> float:
    """‖Δ‖ over all tensors together: L2 as the sum of per-tensor squared sums, or L1."""
    if order == 1:
        return sum(float(t.abs().sum()) for t in update.values())
    return math.sqrt(sum(float(t.pow(2).sum()) for t in update.values()))


def clip_in_place(update: Params, bound: float, order: int) -> float:
    """Scales `update` in place into the ball ‖Δ‖_order ≤ `bound`; returns the norm before."""
    norm = update_norm(update, order)
    if norm > bound:
        factor = bound / norm
        for t in update.values():
            t.mul_(factor)
    return norm


@torch.no_grad()
def accuracy_percent(
    model: torch.nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor
) -> float:
    """100·(correct predictions)/n of `params` on the records (arg-max of the model's
    output; 0.0 for none)."""
    n = int(x.shape[0])
    correct = 0
    for start in range(0, n, EVAL_CHUNK):
        logits = functional_call(model, params, (x[start : start + EVAL_CHUNK],))
        correct += int((logits.argmax(1) == y[start : start + EVAL_CHUNK]).sum())
    return 100.0 * correct / max(n, 1)
