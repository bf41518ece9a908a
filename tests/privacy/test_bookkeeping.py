"""The book-keeping engine must give the materialised (torch.func) engine's update."""

import warnings

import pytest
import torch
from torch import nn

from raydpfl.models import MODELS, build_model
from raydpfl.privacy.per_sample.bookkeeping import BookkeepingClipping, supports
from raydpfl.privacy.per_sample.dpsgd import PerSampleGradients, clip_weights, per_sample_norms
from raydpfl.privacy.per_sample.engines import make_engine


class _Mixed(nn.Module):
    """Every rule at once: strided/padded conv, GroupNorm, Linear on (B, T, p) both with
    the materialised rule (seq) and the ghost-norm rule (wide: T=2 ≪ p, q), no-bias."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, stride=2, padding=1)
        self.norm = nn.GroupNorm(2, 6)
        self.seq = nn.Linear(7, 5)
        self.wide = nn.Linear(15, 40)
        self.head = nn.Linear(80, 4, bias=False)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))  # (B, 6, 7, 7)
        h = torch.relu(self.seq(h.mean(2)))  # (B, 6, 5): T=6, materialised
        h = torch.relu(self.wide(h.reshape(-1, 2, 15)))  # (B, 2, 40): ghost norm
        return self.head(h.flatten(1))


def test_the_mixed_model_exercises_both_norm_rules():
    from raydpfl.privacy.per_sample.bookkeeping import _norm_sq, _positions

    model = _Mixed()
    engine = BookkeepingClipping(model)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}

    _, records = engine._norms(params, torch.randn(3, 1, 14, 14), torch.tensor([0, 1, 2]))
    kept = {rec.prefix: rec.per_sample is not None for rec in records}

    assert kept["seq"] and kept["conv"] and not kept["wide"]  # wide took the ghost branch
    assert all(_norm_sq(r).shape == (3,) for r in records if r.prefix in ("seq", "wide"))
    assert _positions(records[-2])[0].shape == (3, 2, 15)


def _case(name):
    torch.manual_seed(0)
    if name == "mixed":
        return _Mixed(), (1, 14, 14), 4
    return build_model(name, (1, 28, 28), 10), (1, 28, 28), 10


@pytest.mark.parametrize("name", [*MODELS, "mixed"])
def test_bookkeeping_equals_materialised_per_sample_gradients(name):
    model, shape, classes = _case(name)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(13, *shape) * 3, torch.randint(0, classes, (13,))
    vmap_engine, bk_engine = PerSampleGradients(model), BookkeepingClipping(model)
    norms = per_sample_norms(vmap_engine.grads(params, x, y))
    clip = float(norms.median())  # about half the samples are clipped
    rule = lambda n: clip_weights(n, clip)  # noqa: E731

    expected, expected_stats = vmap_engine.clipped_sum(params, x, y, rule)
    actual, stats = bk_engine.clipped_sum(params, x, y, rule)

    torch.testing.assert_close(bk_engine.norms(params, x, y), norms, rtol=1e-4, atol=1e-6)
    assert actual.keys() == expected.keys()
    for k in expected:
        torch.testing.assert_close(actual[k], expected[k], rtol=1e-4, atol=1e-5)
    assert stats.batch_size == 13 and stats.clipped_fraction == expected_stats.clipped_fraction
    # accumulating into given tensors (DP-SGD's noise) gives the same sum on every layer
    # rule, the fused Linear GEMM included; a second chunk adds to the same tensors
    base = {k: torch.full_like(p, 0.25) for k, p in params.items()}
    into = {k: b.clone() for k, b in base.items()}
    BookkeepingClipping(model, max_chunk=8).clipped_sum(params, x, y, rule, into=into)
    for k in expected:
        torch.testing.assert_close(into[k] - base[k], expected[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "conv, channels_first",
    [
        (dict(in_channels=1, out_channels=4, kernel_size=5), True),  # FedAvgCNN's conv1
        (dict(in_channels=3, out_channels=4, kernel_size=3, padding=1), True),
        (dict(in_channels=2, out_channels=3, kernel_size=3, dilation=2, bias=False), True),
        (dict(in_channels=1, out_channels=4, kernel_size=3, stride=(1, 2)), False),
        (dict(in_channels=8, out_channels=4, kernel_size=3, padding=1), False),
        (dict(in_channels=2, out_channels=3, kernel_size=(3, 2), stride=(2, 1)), True),
    ],
)
def test_both_conv_patch_layouts_give_the_per_sample_weighted_sum(conv, channels_first):
    """Channels-first patches (long output rows) and channels-last ones (k_w·C_in runs)
    form the per-sample weight gradients in different orders; both give vmap's norms and
    weighted sum, through any padding, stride and dilation."""
    torch.manual_seed(0)
    layer = nn.Conv2d(**conv)
    model = nn.Sequential(layer, nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))
    x = torch.randn(7, conv["in_channels"], 12, 11)
    model(x)  # materialises the lazy head
    y = torch.randint(0, 3, (7,))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    engine, vmap_engine = BookkeepingClipping(model), PerSampleGradients(model)
    norms = per_sample_norms(vmap_engine.grads(params, x, y))
    _, records = engine._norms(params, x, y)
    assert records[0].per_sample is not None
    assert records[0].per_sample_pq is channels_first
    torch.testing.assert_close(engine.norms(params, x, y), norms, rtol=1e-4, atol=1e-6)
    rule = lambda n: clip_weights(n, float(norms.median()))  # noqa: E731
    expected, _ = vmap_engine.clipped_sum(params, x, y, rule)
    actual, _ = engine.clipped_sum(params, x, y, rule)
    for k in expected:
        assert actual[k].shape == expected[k].shape
        torch.testing.assert_close(actual[k], expected[k], rtol=1e-4, atol=1e-5)


def test_a_scaled_sum_is_added_into_given_tensors_on_both_paths():
    """`scale` multiplies the sum added into `into` (the fused DP-SGD update adds
    −(lr/B)·s into the parameters), on the book-keeping rules and on the vmap fallback
    a shared layer hands the model to; without `into` it is refused."""

    class Twice(nn.Module):  # a non-Linear layer called twice: the fallback
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(4, 4)
            self.norm = nn.LayerNorm(4)

        def forward(self, x):
            return self.inner(self.norm(torch.relu(self.norm(x))))

    torch.manual_seed(0)
    for model, x in ((_Mixed(), torch.randn(5, 1, 14, 14)), (Twice(), torch.randn(5, 4))):
        y = torch.randint(0, 4, (5,))
        params = {k: v.detach().clone() for k, v in model.named_parameters()}
        rule = lambda n: clip_weights(n, 0.7)  # noqa: E731
        expected, _ = PerSampleGradients(model).clipped_sum(params, x, y, rule)
        engine = BookkeepingClipping(model)
        into = {k: torch.full_like(p, 0.5) for k, p in params.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback's notice
            engine.clipped_sum(params, x, y, rule, into=into, scale=-0.25)
        for k in expected:
            torch.testing.assert_close(into[k], 0.5 - 0.25 * expected[k], rtol=1e-5, atol=1e-6)
        assert engine.adds_into_params(5) is (model.__class__ is _Mixed)
        assert not engine.adds_into_params(engine.max_chunk + 1)
        with pytest.raises(ValueError, match="scale needs `into`"):
            engine.clipped_sum(params, x, y, rule, scale=2.0)


def test_low_rank_leaves_linear_weight_sums_as_factors():
    """`low_rank`: a Linear weight on 2-d inputs is not added to; its scaled sum comes
    back as factors (scale·G, A) with GᵀA the sum (a second chunk's rows appended),
    every other parameter is added as before; Linear layers on (B, T, p) inputs, and
    the vmap fallback, add everything; without `into` it is refused."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    x, y = torch.randn(7, 6), torch.randint(0, 3, (7,))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    rule = lambda n: clip_weights(n, 0.7)  # noqa: E731
    expected, _ = PerSampleGradients(model).clipped_sum(params, x, y, rule)
    for chunk in (1024, 4):  # one chunk; two (rows 0-3 and 4-6)
        engine = BookkeepingClipping(model, max_chunk=chunk)
        into = {k: torch.full_like(p, 0.5) for k, p in params.items()}
        factors = {}
        engine.clipped_sum(params, x, y, rule, into=into, scale=-0.25, low_rank=factors)
        assert sorted(factors) == ["0.weight", "2.weight"]
        for k in expected:
            if k in factors:
                g, a = factors[k]
                assert g.shape == (7, params[k].shape[0]) and a.shape == (7, params[k].shape[1])
                assert torch.equal(into[k], torch.full_like(params[k], 0.5))  # untouched
                torch.testing.assert_close(g.t() @ a, -0.25 * expected[k], rtol=1e-5, atol=1e-6)
            else:
                torch.testing.assert_close(into[k], 0.5 - 0.25 * expected[k], rtol=1e-5, atol=1e-6)
    mixed = _Mixed()  # Linear layers on (B, T, p) inputs: added, no factors
    params = {k: v.detach().clone() for k, v in mixed.named_parameters()}
    x, y = torch.randn(5, 1, 14, 14), torch.randint(0, 4, (5,))
    into = {k: torch.zeros_like(p) for k, p in params.items()}
    factors = {}
    BookkeepingClipping(mixed).clipped_sum(params, x, y, rule, into=into, low_rank=factors)
    assert list(factors) == ["head.weight"]  # head: 2-d inputs; seq and wide: (B, T, p)

    class Twice(nn.Module):  # one layer called twice: the vmap fallback adds everything
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return self.inner(torch.relu(self.inner(x)))

    twice = Twice()
    params2 = {k: v.detach().clone() for k, v in twice.named_parameters()}
    x2, y2 = torch.randn(5, 4), torch.randint(0, 4, (5,))
    want, _ = PerSampleGradients(twice).clipped_sum(params2, x2, y2, rule)
    into2 = {k: torch.zeros_like(p) for k, p in params2.items()}
    factors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's notice
        BookkeepingClipping(twice).clipped_sum(params2, x2, y2, rule, into=into2, low_rank=factors)
    assert factors == {}
    for k in want:
        torch.testing.assert_close(into2[k], want[k], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="low_rank needs `into`"):
        BookkeepingClipping(mixed).clipped_sum(params, x, y, rule, low_rank={})


def test_any_weight_rule_gives_the_same_weighted_sum():
    model, shape, classes = _case("fedavg_cnn")
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(9, *shape), torch.randint(0, classes, (9,))
    # A fairness-style rule: weights that are not plain clipping (FedFDP scales by a factor).
    rule = lambda n: 0.3 * clip_weights(n, 0.5) + 0.1  # noqa: E731

    expected, _ = PerSampleGradients(model).clipped_sum(params, x, y, rule)
    actual, _ = BookkeepingClipping(model).clipped_sum(params, x, y, rule)

    for k in expected:
        torch.testing.assert_close(actual[k], expected[k], rtol=1e-4, atol=1e-5)


def test_empty_batch_gives_zeros_and_hooks_stay_silent_outside_a_step():
    model, shape, _ = _case("mlp")
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    engine = BookkeepingClipping(model)

    total, stats = engine.clipped_sum(
        params, torch.zeros(0, *shape), torch.zeros(0).long(), lambda n: n
    )
    model(torch.randn(4, *shape))  # an evaluation pass must not record anything

    assert stats.batch_size == 0
    assert all(t.abs().sum() == 0 for t in total.values())
    assert engine._records is None


def test_auto_engine_falls_back_to_torch_func_for_unsupported_layers():
    grouped = nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.Flatten(), nn.Linear(4, 2))
    embedding = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(4, 2))

    assert supports(build_model("fedavg_cnn", (1, 28, 28), 10))
    assert not supports(grouped) and not supports(embedding)
    assert isinstance(make_engine(grouped), PerSampleGradients)
    assert isinstance(make_engine(build_model("mlp", (1, 28, 28), 10)), BookkeepingClipping)
    assert isinstance(make_engine(build_model("mlp", (1, 28, 28), 10), "vmap"), PerSampleGradients)
    with pytest.raises(ValueError, match="engine must be one of"):
        make_engine(grouped, "fast")


class _Twice(nn.Module):
    """One Linear applied twice in a forward pass: its per-sample gradient is the sum of
    both calls' gradients, whose norm a per-call rule cannot give. The grouped
    multi-client engine hands it to vmap (tests/privacy/test_multi_client.py); the
    single-client engine merges a Linear's calls (tests/privacy/test_per_sample_rules.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.body(torch.relu(self.body(x))))


class _NormTwice(nn.Module):
    """One LayerNorm applied twice: no rule merges its calls, so the single-client
    engine hands the model to vmap."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.body(torch.relu(self.body(x))))


def test_a_layer_called_twice_hands_the_model_to_the_vmap_engine():
    torch.manual_seed(0)
    model = _NormTwice()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(6, 4) * 3, torch.randint(0, 3, (6,))
    rule = lambda n: clip_weights(n, 0.1)  # noqa: E731
    engine = make_engine(model, "auto")
    assert isinstance(engine, BookkeepingClipping)  # the repeat shows only at run time

    with pytest.warns(UserWarning, match="runs more than once"):
        total, _ = engine.clipped_sum(params, x, y, rule)
    expected, _ = PerSampleGradients(model).clipped_sum(params, x, y, rule)

    for k in expected:
        torch.testing.assert_close(total[k], expected[k], rtol=1e-5, atol=1e-6)
    # each clipped per-sample gradient is within C, so one sample's sum is too
    one, _ = engine.clipped_sum(params, x[:1], y[:1], rule)
    assert torch.sqrt(sum(t.pow(2).sum() for t in one.values())) <= 0.1 + 1e-6
    vmap_norms = per_sample_norms(PerSampleGradients(model).grads(params, x, y))
    torch.testing.assert_close(engine.norms(params, x, y), vmap_norms)


def test_tied_weights_are_not_supported():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    model[2].weight = model[0].weight

    assert not supports(model)
    assert isinstance(make_engine(model, "auto"), PerSampleGradients)
    with pytest.raises(ValueError, match="book-keeping rule"):
        BookkeepingClipping(model)
