"""raydpfl.models.layers: the fast layers compute exactly what torch.nn computes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from raydpfl.models.layers import MaxPool2d


def _pair(shape, kernel=2, stride=None, padding=0):
    torch.manual_seed(0)
    x = torch.relu(torch.randn(shape))
    return x, MaxPool2d(kernel, stride, padding), nn.MaxPool2d(kernel, stride, padding)


def test_max_pool_same_values_and_gradients_in_channels_last_layout():
    for shape, args in [((3, 32, 24, 24), (2,)), ((2, 5, 9, 7), (3, 2, 1))]:
        x, fast, ref = _pair(shape, *args)
        a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        out_fast, out_ref = fast(a), ref(b)
        assert torch.equal(out_fast, out_ref)
        assert out_fast.is_contiguous(memory_format=torch.channels_last)
        upstream = torch.randn(out_ref.shape)
        out_fast.backward(upstream)
        out_ref.backward(upstream)
        assert torch.equal(a.grad, b.grad)


def test_max_pool_hands_the_gradient_back_in_its_inputs_layout():
    """The gradient reaching the layer before the pooling has that layer's layout: a
    channels-last gradient for a contiguous activation makes PyTorch's element-wise
    backward kernels (ReLU's) a strided gather, ~40x slower (layers.py docstring)."""
    torch.manual_seed(0)
    for fmt in (torch.contiguous_format, torch.channels_last):
        pre = torch.randn(3, 8, 12, 12).contiguous(memory_format=fmt).requires_grad_(True)
        seen: list[torch.Tensor] = []
        h = pre.relu()  # the activation the pooling gets, in `fmt`
        h.register_hook(seen.append)
        MaxPool2d(2)(h).backward(torch.randn(3, 8, 6, 6).contiguous(memory_format=fmt))
        assert seen[0].is_contiguous(memory_format=fmt)
    # values unchanged whatever layout the gradient takes
    x = torch.randn(2, 4, 10, 10)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    upstream = torch.randn(2, 4, 5, 5)
    MaxPool2d(2)(a.relu()).backward(upstream)
    nn.MaxPool2d(2)(b.relu()).backward(upstream)
    assert torch.equal(a.grad, b.grad) and a.grad.is_contiguous()


def test_max_pool_under_vmap_is_the_plain_layer():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 13 * 13, 3)
    )
    params = {n: p.detach() for n, p in model.named_parameters()}
    x, y = torch.randn(5, 1, 28, 28), torch.randint(0, 3, (5,))

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    for i in range(5):
        single = grad(loss)(params, x[i], y[i])
        for name in params:
            torch.testing.assert_close(per_sample[name][i], single[name])


def test_max_pool_keeps_three_dimensional_inputs_unchanged():
    x, fast, ref = _pair((4, 10, 10))
    assert torch.equal(fast(x), ref(x))
