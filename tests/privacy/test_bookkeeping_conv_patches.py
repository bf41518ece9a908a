"""The book-keeping engine's Conv2d patches (cut from a channels-last copy of the input,
ordered (k_h, k_w, C_in)) must be F.unfold's patches reordered, and the per-sample
gradients built from them must equal torch.func's for every conv geometry."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raydpfl.models import MODELS, build_model
from raydpfl.privacy.per_sample.bookkeeping import (
    BookkeepingClipping,
    _as_weight,
    _conv_patches,
    _positions,
    _Record,
)
from raydpfl.privacy.per_sample.dpsgd import PerSampleGradients, clip_weights, per_sample_norms

GEOMETRIES = [
    # (C_in, C_out, kernel, stride, padding, dilation, bias)
    (1, 32, 5, 1, 0, 1, True),  # FedAvgCNN's conv1
    (32, 64, 5, 1, 0, 1, True),  # FedAvgCNN's conv2
    (3, 4, 3, 1, 1, 1, False),
    (2, 3, 3, 2, 1, 1, True),
    (2, 3, (3, 2), (2, 1), (1, 0), 1, True),
    (3, 2, 3, 1, 2, 2, True),
    (2, 4, 3, 1, "same", 1, True),
    (2, 4, 1, 2, 0, 1, False),
]


def _unfold_reordered(m: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """F.unfold's (B, C·kh·kw, T) patches as (B, T, kh·kw·C)."""
    if isinstance(m.padding, str):
        x, padding = F.pad(x, m._reversed_padding_repeated_twice), 0
    else:
        padding = m.padding
    cols = F.unfold(x, m.kernel_size, dilation=m.dilation, padding=padding, stride=m.stride)
    b, (kh, kw), c = x.shape[0], m.kernel_size, x.shape[1]
    return cols.view(b, c, kh, kw, -1).permute(0, 4, 2, 3, 1).reshape(b, cols.shape[-1], -1)


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_patches_are_unfold_reordered(geometry, channels_last):
    cin, cout, k, stride, padding, dilation, bias = geometry
    torch.manual_seed(0)
    m = nn.Conv2d(cin, cout, k, stride=stride, padding=padding, dilation=dilation, bias=bias)
    x = torch.randn(3, cin, 11, 9)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    patches = _conv_patches(m, x)

    torch.testing.assert_close(patches, _unfold_reordered(m, x), rtol=0, atol=0)
    assert patches.shape[1] == m(x).shape[2] * m(x).shape[3]  # T = output positions


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_per_sample_conv_gradients_in_weight_layout(geometry):
    cin, cout, k, stride, padding, dilation, bias = geometry
    torch.manual_seed(1)
    m = nn.Conv2d(cin, cout, k, stride=stride, padding=padding, dilation=dilation, bias=bias)
    x = torch.randn(4, cin, 11, 9)
    out = m(x)
    g = torch.randn_like(out)
    rec = _Record(m, "", x, out, grad=g)
    a_mat, g_mat = _positions(rec)
    per_sample = torch.bmm(g_mat.transpose(1, 2), a_mat)  # (B, q, p), p in (kh, kw, C_in)

    expected = torch.stack(
        [
            torch.autograd.grad((m(x[i : i + 1]) * g[i : i + 1]).sum(), m.weight)[0]
            for i in range(4)
        ]
    )

    got = _as_weight(rec, per_sample.flatten(1), (4,))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert got.is_contiguous()
    torch.testing.assert_close(_as_weight(rec, per_sample.sum(0)), expected.sum(0))


class _ConvZoo(nn.Module):
    """Every geometry above that keeps the spatial size positive, in one model."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 0))
        self.b = nn.Conv2d(3, 4, 3, padding="same", dilation=2)
        self.c = nn.Conv2d(4, 5, 1, stride=2, bias=False)
        self.head = nn.Linear(5 * 3 * 7, 3)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.relu(self.b(h))
        return self.head(torch.relu(self.c(h)).flatten(1))


@pytest.mark.parametrize("name", [*MODELS, "conv_zoo"])
def test_clipped_sum_matches_materialised_and_keeps_parameter_order(name):
    torch.manual_seed(2)
    if name == "conv_zoo":
        model, shape, classes = _ConvZoo(), (2, 11, 14), 3
    else:
        model, shape, classes = build_model(name, (1, 28, 28), 10), (1, 28, 28), 10
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(7, *shape) * 2, torch.randint(0, classes, (7,))
    vmap_engine, bk_engine = PerSampleGradients(model), BookkeepingClipping(model)
    clip = float(per_sample_norms(vmap_engine.grads(params, x, y)).median())
    rule = lambda n: clip_weights(n, clip)  # noqa: E731

    expected, _ = vmap_engine.clipped_sum(params, x, y, rule)
    actual, _ = bk_engine.clipped_sum(params, x, y, rule)

    assert list(actual) == list(params)  # the noise is drawn in this order
    for k in expected:
        torch.testing.assert_close(actual[k], expected[k], rtol=1e-4, atol=1e-5)
        assert actual[k].shape == params[k].shape and actual[k].is_contiguous()
    # fresh tensors: the caller adds noise in place
    ptrs = [t.data_ptr() for t in actual.values()]
    assert len(set(ptrs)) == len(ptrs)
    assert not set(ptrs) & {p.data_ptr() for p in params.values()}


def test_chunked_batches_accumulate_like_one_chunk():
    torch.manual_seed(3)
    model = build_model("fedavg_cnn", (1, 28, 28), 10)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(11, 1, 28, 28), torch.randint(0, 10, (11,))
    rule = lambda n: clip_weights(n, 0.5)  # noqa: E731

    whole, s1 = BookkeepingClipping(model).clipped_sum(params, x, y, rule)
    chunked, s2 = BookkeepingClipping(model, max_chunk=4).clipped_sum(params, x, y, rule)

    assert list(chunked) == list(params)
    for k in whole:
        torch.testing.assert_close(chunked[k], whole[k], rtol=1e-4, atol=1e-6)
    assert s1.clipped_fraction == s2.clipped_fraction
    assert s1.mean_norm == pytest.approx(s2.mean_norm, rel=1e-5)
