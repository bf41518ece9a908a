"""Drop-in layers that compute exactly what their `torch.nn` namesakes compute, faster.

`MaxPool2d`: PyTorch's CPU max-pooling kernel is an order of magnitude slower on
contiguous (N, C, H, W) activations than on channels-last ones when the batch is small
(one thread, FedAvgCNN's first pooling of 3×32×24×24 values: ~240 µs against ~24 µs),
and small Poisson batches are the normal case in DP federated learning. So on CPU the
input is pooled in channels-last layout. The values and gradients are the same (max
pooling picks the same element in either layout); only the memory layout of the output
changes, and the layers after it (ReLU, Conv2d, Linear after a flatten) accept either.

The layout change must not leak backwards: a plain `.contiguous(channels_last)` passes
the gradient through unchanged, so the layer *before* the pooling (FedAvgCNN's ReLU)
would get a channels-last gradient for its contiguous activation, and PyTorch's CPU
element-wise kernels on operands of mixed layouts are a strided gather: ReLU's backward
on 30×32×24×24 values took ~3.3 ms instead of ~0.08 ms (one thread). `_ChannelsLast`
hands the gradient back in the layout of the input it was given (one copy, ~0.1 ms).
"""

from __future__ import annotations

import torch
from torch import nn


def _functorch_transform_active() -> bool:
    """Whether we run under `torch.func` (vmap/grad), which cannot change memory format."""
    probe = getattr(torch._C, "_are_functorch_transforms_active", None)
    return True if probe is None else bool(probe())


class _ChannelsLast(torch.autograd.Function):
    """x in channels-last layout; the gradient goes back in x's own layout.

    Old-style (``forward(ctx, x)``, no ``setup_context``): `Function.apply` then skips
    binding the arguments with `inspect.signature`, ~40 µs per call. It is never used
    under `torch.func` transforms (`MaxPool2d` checks first), which would need the new
    style."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def, override]
        # only a contiguous (N, C, H, W) input is handed back a converted gradient; any
        # other layout gets the gradient as an identity would pass it
        ctx.to_contiguous = x.is_contiguous() and not x.is_contiguous(
            memory_format=torch.channels_last
        )
        return x.contiguous(memory_format=torch.channels_last)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def, override]
        return grad.contiguous() if ctx.to_contiguous else grad


class MaxPool2d(nn.MaxPool2d):
    """`torch.nn.MaxPool2d` that pools CPU activations in channels-last layout (same
    values, ~10x faster for small batches; see the module docstring). On other devices,
    for non-4-D inputs and inside `torch.func` transforms it is exactly the parent."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() == 4 and input.device.type == "cpu" and not _functorch_transform_active():
            input = _ChannelsLast.apply(input)
        return super().forward(input)
