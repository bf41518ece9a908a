"""Which engine ``runtime.engine: auto`` takes, and what it says when it falls back:
every model of the zoo gets the book-keeping engine; a user's layer without a rule is
named in one warning line; a lookup without the batch axis and a non-Linear layer called
twice are caught at run time and handed to vmap (same sum)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import raydpfl.config.schema
import raydpfl.papers  # noqa: F401  (registers the papers' models)
from raydpfl import registry
from raydpfl.privacy.per_sample.bookkeeping import BookkeepingClipping, first_unsupported
from raydpfl.privacy.per_sample.dpsgd import PerSampleGradients, clip_weights
from raydpfl.privacy.per_sample.engines import EngineFallbackWarning, make_engine


def _shape(name: str) -> tuple[tuple[int, ...], int]:
    if name.startswith("char_"):
        return (12,), 80
    if name == "bcs_linreg":
        return (16,), 1
    return (3, 32, 32), 10


@pytest.mark.parametrize("name", registry.names("model"))
def test_every_model_of_the_zoo_gets_the_bookkeeping_engine(name):
    shape, classes = _shape(name)
    model = registry.get("model", name).load()(shape, classes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        engine = make_engine(model, "auto")
    assert isinstance(engine, BookkeepingClipping), first_unsupported(model)


def test_a_layer_without_a_rule_is_named_in_one_warning_line():
    model = nn.Sequential()
    model.add_module("embed", nn.Embedding(10, 4))
    model.add_module("rnn", nn.GRU(4, 3, batch_first=True))
    with pytest.warns(EngineFallbackWarning) as caught:
        engine = make_engine(model, "auto")
    assert isinstance(engine, PerSampleGradients)
    (message,) = [str(w.message) for w in caught]
    assert "\n" not in message
    assert "layer 'rnn' (GRU) has no per-sample rule" in message
    assert "falls back to the vmap engine" in message
    with pytest.raises(ValueError, match="layer 'rnn' \\(GRU\\)"):
        make_engine(model, "bookkeeping")


def test_embedding_options_that_mix_samples_are_refused_by_name():
    assert "max_norm" in first_unsupported(nn.Sequential(nn.Embedding(5, 2, max_norm=1.0)))
    mixed = nn.Sequential(nn.Embedding(5, 2, scale_grad_by_freq=True))
    assert "mixes samples" in first_unsupported(mixed)


class _SharedLookup(nn.Module):
    """A position embedding looked up once for the whole batch (no batch axis)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.position = nn.Embedding(5, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, ids):
        x = self.embed(ids) + self.position(torch.arange(ids.shape[1]))
        return self.head(x.mean(1))


@pytest.mark.parametrize("batch", [6, 5])  # 5: the batch as long as the shared lookup
def test_a_lookup_shared_by_the_batch_falls_back_with_the_same_sum(batch):
    torch.manual_seed(0)
    model = _SharedLookup()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randint(0, 7, (batch, 5)), torch.randint(0, 3, (batch,))
    rule = lambda n: clip_weights(n, 0.05)  # noqa: E731
    engine = make_engine(model, "auto")
    assert isinstance(engine, BookkeepingClipping)  # the missing batch axis shows at run time
    with pytest.warns(UserWarning, match="'position' is applied to a tensor without the batch"):
        total, _ = engine.clipped_sum(params, x, y, rule)
    expected, _ = PerSampleGradients(model).clipped_sum(params, x, y, rule)
    for k in expected:
        torch.testing.assert_close(total[k], expected[k], rtol=1e-5, atol=1e-6)


def test_multihead_attention_configurations_without_a_rule_are_named():
    """nn.MultiheadAttention reads out_proj's weight without calling it: its rule covers
    out_proj (never clipped as an idle Linear); dropout and add_bias_kv have no rule."""
    model = nn.Sequential()
    model.add_module("attn", nn.MultiheadAttention(4, 2, batch_first=True))
    assert first_unsupported(model) is None
    model.attn = nn.MultiheadAttention(4, 2, dropout=0.1)
    assert "layer 'attn' (MultiheadAttention)" in first_unsupported(model)
    assert "dropout" in first_unsupported(model)
    model.attn = nn.MultiheadAttention(4, 2, add_bias_kv=True)
    assert "add_bias_kv" in first_unsupported(model)


class _Unbatched(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 2)
        self.head = nn.Linear(4, 3)

    def forward(self, x):  # one sample as an unbatched (L, E) sequence per row
        rows = [self.attn(r, r, r)[0].mean(0) for r in x]
        return self.head(torch.stack(rows))


def test_unbatched_attention_calls_fall_back_at_run_time_with_the_same_sum():
    torch.manual_seed(0)
    model = _Unbatched()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(3, 5, 4), torch.randint(0, 3, (3,))
    rule = lambda n: clip_weights(n, 0.05)  # noqa: E731
    engine = make_engine(model, "auto")
    with pytest.warns(UserWarning, match="unbatched"):
        total, _ = engine.clipped_sum(params, x, y, rule)
    expected, _ = PerSampleGradients(model).clipped_sum(params, x, y, rule)
    for k in expected:
        torch.testing.assert_close(total[k], expected[k], rtol=1e-5, atol=1e-6)
