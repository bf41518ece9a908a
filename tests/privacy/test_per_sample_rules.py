"""Every per-sample rule of `raydpfl.privacy.per_sample` (and the Linear-call merging of
recurrent cells) against a ground-truth loop: one backward pass per record, the
per-sample gradients read off `.grad`, their norms, and the clipped sum Σ_i a_i g_i with
a_i = min(1, C/(‖g_i‖ + 1e-6)). Batches of 0, 1, 2 and 7 records."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import raydpfl.config.schema  # noqa: F401  (registers the text models)
from raydpfl.models import build_model
from raydpfl.models.recurrent import DPGRU, DPLSTM
from raydpfl.privacy.per_sample.bookkeeping import BookkeepingClipping, first_unsupported
from raydpfl.privacy.per_sample.dpsgd import clip_weights
from raydpfl.privacy.per_sample.embedding import EmbeddingRule

BATCHES = (0, 1, 2, 7)


def ground_truth(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float):
    """(norms (B,), clipped sum {name: tensor}) by one backward pass per record."""
    params = dict(model.named_parameters())
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    norms = []
    for i in range(x.shape[0]):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads = {
            n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in params.items()
        }
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
        norms.append(norm)
        a = clip_weights(norm, clip)
        for n, g in grads.items():
            total[n] += a * g
    model.zero_grad(set_to_none=True)
    return torch.stack(norms) if norms else torch.zeros(0), total


class _Tokens(nn.Module):
    """Embedding (optionally with padding) → LayerNorm/RMSNorm → Linear head."""

    def __init__(self, vocab: int, norm: str = "layer", padding_idx: int | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab, 6, padding_idx=padding_idx)
        self.norm = {
            "layer": nn.LayerNorm(6),
            "layer_nobias": nn.LayerNorm(6, bias=False),
            "rms": nn.RMSNorm(6),
            "rms_eps": nn.RMSNorm(6, eps=1e-3),
        }[norm]
        self.head = nn.Linear(6, 5)

    def forward(self, ids):
        return self.head(torch.tanh(self.norm(self.embed(ids))).mean(1))


class _Normed2d(nn.Module):
    """LayerNorm over two trailing dims (normalized_shape (4, 3)) on (B, T, 4, 3)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm((4, 3))
        self.rms = nn.RMSNorm((4, 3))
        self.head = nn.Linear(12, 5)

    def forward(self, x):
        h = self.rms(torch.relu(self.norm(x)))
        return self.head(h.sum(1).flatten(1))


class _Recurrent(nn.Module):
    """A Linear called once per step (an Elman cell), a DPLSTM and a DPGRU."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 4)
        self.cell = nn.Linear(4, 4)
        self.lstm = DPLSTM(4, 5, num_layers=2)
        self.gru = DPGRU(5, 6)
        self.head = nn.Linear(6, 5)

    def forward(self, x):
        h = torch.zeros(x.shape[0], 4)
        steps = []
        for t in range(x.shape[1]):
            h = torch.tanh(self.inp(x[:, t]) + self.cell(h))
            steps.append(h)
        return self.head(self.gru(self.lstm(torch.stack(steps, 1)))[:, -1])


class _Attention(nn.Module):
    """nn.MultiheadAttention in four configurations: self-attention with a causal bool
    mask (batch first), the same sequence-first, cross-attention with kdim/vdim and a
    key padding mask, and no bias with a float mask (attention weights returned)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(11, 8)
        if kind == "cross":
            self.keys, self.values = nn.Linear(8, 5), nn.Linear(8, 3)
            self.attn = nn.MultiheadAttention(8, 2, kdim=5, vdim=3, batch_first=True)
        else:
            self.attn = nn.MultiheadAttention(
                8, 4 if kind == "nobias" else 2, bias=kind != "nobias", batch_first=kind != "seq"
            )
        self.register_buffer(
            "float_mask", torch.randn(6, 6, generator=torch.Generator().manual_seed(5))
        )
        self.head = nn.Linear(8, 5)

    def forward(self, ids):
        x, t = self.embed(ids), ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        if self.kind == "self":
            out, _ = self.attn(x, x, x, attn_mask=causal, need_weights=False)
        elif self.kind == "seq":
            xs = x.transpose(0, 1)
            out = self.attn(xs, xs, xs, attn_mask=causal)[0].transpose(0, 1)
        elif self.kind == "cross":
            padding = ids == 0
            padding[:, 0] = False  # no fully masked row
            out, _ = self.attn(x, self.keys(x), self.values(x), key_padding_mask=padding)
        else:
            out, _ = self.attn(x, x, x, attn_mask=self.float_mask[:t, :t])
        return self.head(torch.relu(out).mean(1))


def _cases():
    g = torch.Generator().manual_seed(0)
    ids = lambda vocab, b, t: torch.randint(0, vocab, (b, t), generator=g)  # noqa: E731
    return {
        # vocab 50 > 3² positions: ghost norm; vocab 5 < 4²: materialised
        "embedding_ghost_layernorm": (lambda: _Tokens(50), lambda b: ids(50, b, 3)),
        "embedding_materialised_layernorm": (lambda: _Tokens(5), lambda b: ids(5, b, 4)),
        "embedding_padding_ghost": (lambda: _Tokens(60, padding_idx=2), lambda b: ids(4, b, 6)),
        "embedding_padding_materialised": (
            lambda: _Tokens(4, "layer_nobias", padding_idx=0),
            lambda: None,
        ),
        "rmsnorm": (lambda: _Tokens(9, "rms"), lambda b: ids(9, b, 5)),
        "rmsnorm_eps": (lambda: _Tokens(9, "rms_eps"), lambda b: ids(9, b, 2)),
        "norms_over_two_dims": (
            lambda: _Normed2d(),
            lambda b: torch.randn(b, 3, 4, 3, generator=g) * 2,
        ),
        "repeated_linear_and_dplstm": (
            lambda: _Recurrent(),
            lambda b: torch.randn(b, 6, 3, generator=g),
        ),
        "mha_self_causal": (lambda: _Attention("self"), lambda b: ids(11, b, 5)),
        "mha_sequence_first": (lambda: _Attention("seq"), lambda b: ids(11, b, 4)),
        "mha_cross_kdim_padding": (lambda: _Attention("cross"), lambda b: ids(11, b, 6)),
        "mha_no_bias_float_mask": (lambda: _Attention("nobias"), lambda b: ids(11, b, 6)),
        "char_transformer": (
            lambda: build_model("char_transformer", (7,), 80, width=8, heads=2, layers=1),
            lambda b: ids(80, b, 7),
        ),
        "char_lstm": (
            lambda: build_model("char_lstm", (6,), 80, embed=4, hidden=12, layers=2),
            lambda b: ids(80, b, 6),
        ),
    }


CASES = _cases()


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("case", list(CASES))
def test_rule_equals_one_backward_pass_per_record(case, batch):
    torch.manual_seed(1)
    make_model, make_x = CASES[case]
    model = make_model()
    if case == "embedding_padding_materialised":  # padding tokens in most windows
        x = torch.randint(0, 4, (batch, 5), generator=torch.Generator().manual_seed(batch))
    else:
        x = make_x(batch)
    y = torch.randint(0, 5, (batch,), generator=torch.Generator().manual_seed(7))
    assert first_unsupported(model) is None
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    engine = BookkeepingClipping(model)

    norms = engine.norms(params, x, y)
    clip = float(norms.median()) if batch else 1.0  # about half the records clipped
    expected_norms, expected = ground_truth(model, x, y, clip)
    actual, stats = engine.clipped_sum(params, x, y, lambda n: clip_weights(n, clip))

    assert engine._fallback is None  # the rules ran, not vmap
    assert stats.batch_size == batch
    torch.testing.assert_close(norms, expected_norms, rtol=1e-4, atol=1e-6)
    assert list(actual) == list(expected)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-6)
    if batch == 0:
        assert all(float(t.abs().sum()) == 0.0 for t in actual.values())
    # accumulating into given tensors, scaled (the fused DP-SGD update), in two chunks
    into = {k: torch.full_like(p, 0.5) for k, p in params.items()}
    chunked = BookkeepingClipping(make_model(), max_chunk=4)
    chunked.clipped_sum(params, x, y, lambda n: clip_weights(n, clip), into=into, scale=-2.0)
    for name in expected:
        torch.testing.assert_close(into[name], 0.5 - 2.0 * expected[name], rtol=1e-4, atol=1e-5)


def test_both_embedding_strategies_are_exercised():
    assert EmbeddingRule.ghost_pays(nn.Embedding(50, 2), 3)
    assert not EmbeddingRule.ghost_pays(nn.Embedding(5, 2), 4)
    assert not EmbeddingRule.ghost_pays(nn.Embedding(80, 2), 80)  # LEAF's Shakespeare


def test_dplstm_computes_what_nn_lstm_computes():
    torch.manual_seed(0)
    reference = nn.LSTM(3, 5, num_layers=2, batch_first=True)
    ours = DPLSTM(3, 5, num_layers=2).load_lstm_(reference)
    x = torch.randn(4, 7, 3)
    torch.testing.assert_close(ours(x), reference(x)[0], rtol=1e-5, atol=1e-6)
    assert ours(torch.randn(2, 0, 3)).shape == (2, 0, 5)


def test_dpgru_computes_what_nn_gru_computes():
    torch.manual_seed(0)
    reference = nn.GRU(3, 5, num_layers=2, batch_first=True)
    ours = DPGRU(3, 5, num_layers=2).load_gru_(reference)
    x = torch.randn(4, 7, 3)
    torch.testing.assert_close(ours(x), reference(x)[0], rtol=1e-5, atol=1e-6)
    assert sum(p.numel() for p in ours.parameters()) == sum(
        p.numel() for p in reference.parameters()
    )
