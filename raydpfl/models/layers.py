"""Drop-in layers that compute exactly what their `torch.nn` namesakes compute, faster.

`MaxPool2d`: PyTorch's CPU max-pooling kernel is an order of magnitude slower on
contiguous (N, C, H, W) activations than on channels-last ones when the batch is small
(one thread, FedAvgCNN's first pooling of 3×32×24×24 values: ~240 µs against ~24 µs),
and small Poisson batches are the normal case in DP federated learning. So on CPU the
input is pooled in channels-last layout. The values and gradients are the same (max
pooling picks the same element in either layout); only the memory layout of the output
changes, and the layers after it (ReLU, Conv2d, Linear after a flatten) accept either.
"""

from __future__ import annotations

import torch
from torch import nn


def _functorch_transform_active() -> bool:
    """Whether we run under `torch.func` (vmap/grad), which cannot change memory format."""
    probe = getattr(torch._C, "_are_functorch_transforms_active", None)
    return True if probe is None else bool(probe())


class MaxPool2d(nn.MaxPool2d):
    """`torch.nn.MaxPool2d` that pools CPU activations in channels-last layout (same
    values, ~10x faster for small batches; see the module docstring). On other devices,
    for non-4-D inputs and inside `torch.func` transforms it is exactly the parent."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() == 4 and input.device.type == "cpu" and not _functorch_transform_active():
            input = input.contiguous(memory_format=torch.channels_last)
        return super().forward(input)
