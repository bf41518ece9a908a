"""Vectorised multi-client DP-SGD equals one-client-at-a-time DP-SGD.

Reference: `DPFedAvg.local_update` (the sequential `dp_sgd_local_update`, normalizer
``expected``) with the worker's default engine (``auto``: book-keeping where supported),
one client after another, each on its own generator. The vectorised path must give
every client the same update and diagnostics and leave every generator in the same
state.

Tolerance: float32 results agree to atol 2e-6 on updates of order 1e-2..1. The two
paths compute the same sums in a different order (book-keeping or a 256-sample
tensordot versus a batched matmul over padded slots), so they differ by a few float32
ulps per step, which τ ≤ 3 SGD steps on small models carry along without amplifying.
The RNG draws (masks and noise) are bit-identical, so no tolerance hides a wrong
draw: a single misplaced draw changes updates by O(σC·η/(q|D|)) ≫ 1e-3. In float64
the paths agree to 1e-12, which shows the difference is rounding only.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raydpfl.algorithms import DPFedAvg
from raydpfl.algorithms.base import ClientContext, ClientData, WeightedUpdateSum
from raydpfl.models import build_model
from raydpfl.privacy.per_sample import multi_client
from raydpfl.privacy.per_sample.engines import make_engine
from raydpfl.privacy.per_sample.multi_client import MultiClientDPSGD, for_model, pays_off

SIZES = [1, 2, 5, 37, 120, 9]  # very different |D_i|; the 1-record client has empty batches
SHAPE = (1, 8, 8)
CLASSES = 5


class TinyGroupNormCNN(nn.Module):
    """Conv → GroupNorm → ReLU → pool → Linear: the layer types of the zoo's CNNs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.GroupNorm(2, 4)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.relu(self.norm(self.conv(x)))), 1))


def _model(name: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    if name == "cnn_gn":
        model = TinyGroupNormCNN()
    elif name == "mlp":
        model = build_model("mlp", SHAPE, CLASSES, hidden=16)
    else:
        model = build_model(name, SHAPE, CLASSES)
    return model.to(dtype).requires_grad_(False)


def _pool(dtype: torch.dtype = torch.float32, sizes=SIZES):
    g = torch.Generator().manual_seed(1)
    total = sum(sizes)
    x = torch.randn((total, *SHAPE), generator=g, dtype=dtype)
    y = torch.randint(0, CLASSES, (total,), generator=g)
    perm = torch.randperm(total, generator=g)  # clients' rows interleave in the pool
    indices, start = [], 0
    for s in sizes:
        indices.append(perm[start : start + s].sort().values)
        start += s
    return x, y, indices


def _algorithm(**overrides) -> DPFedAvg:
    kw = dict(
        clients_per_round=len(SIZES),
        local_steps=3,
        lr=0.2,
        clip_norm=0.5,
        noise_multiplier=1.1,
        sampling_rate=0.3,
    )
    kw.update(overrides)
    return DPFedAvg(**kw)


def _generators(n: int, seed: int = 3) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed * 1000 + k) for k in range(n)]


def _sequential(alg, model, params, x, y, indices, tasks, gens, engine="auto"):
    clipping = make_engine(model, engine)
    out = []
    for k, task in enumerate(tasks):
        ctx = ClientContext(model, clipping, gens[k], torch.device("cpu"))
        start = {n: p.clone() for n, p in params.items()}
        out.append(alg.local_update(ctx, start, ClientData(k, x, y, indices[k]), task))
    return out


def _vectorised(alg, model, params, x, y, indices, tasks, gens, engine="auto"):
    multi_client._ENGINES[model] = MultiClientDPSGD(model, engine=engine)
    clipping = make_engine(model, "vmap")  # unused by the vectorised path
    ctxs = [ClientContext(model, clipping, g, torch.device("cpu")) for g in gens]
    datas = [ClientData(k, x, y, idx) for k, idx in enumerate(indices)]
    return alg.local_update_group(ctxs, params, datas, tasks)


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_same(seq, vec, atol):
    assert len(seq) == len(vec)
    for a, b in zip(seq, vec, strict=True):
        assert a.client_id == b.client_id
        assert a.weight == b.weight and a.num_examples == b.num_examples
        assert a.metrics == pytest.approx(b.metrics, abs=1e-12)
        assert list(a.update) == list(b.update)
        for name in a.update:
            torch.testing.assert_close(b.update[name], a.update[name], atol=atol, rtol=0)


def _assert_streams_equal(g1, g2):
    for a, b in zip(g1, g2, strict=True):
        assert torch.equal(a.get_state(), b.get_state())


@pytest.mark.parametrize("engine", ["bookkeeping", "vmap"])
@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn_gn", "bcs_mnist_cnn"])
@pytest.mark.parametrize("steps", [1, 3])
def test_vectorised_equals_one_at_a_time(name, steps, engine):
    model, (x, y, indices) = _model(name), _pool()
    params = _params(model)
    alg = _algorithm(local_steps=steps)
    tasks = alg.plan(0, list(range(len(SIZES))), None)
    g_seq, g_vec = _generators(len(SIZES)), _generators(len(SIZES))

    seq = _sequential(alg, model, params, x, y, indices, tasks, g_seq)
    before = {n: p.clone() for n, p in params.items()}
    vec = _vectorised(alg, model, params, x, y, indices, tasks, g_vec, engine)

    _assert_same(seq, vec, atol=2e-6)
    _assert_streams_equal(g_seq, g_vec)
    assert all(torch.equal(params[n], before[n]) for n in params)  # start not modified
    # seed 3: the 1-record client's first Poisson batch is empty (a noise-only step)
    assert seq[0].metrics["mean_batch_size"] < 1.0


@pytest.mark.parametrize("engine", ["bookkeeping", "vmap"])
def test_float64_agrees_to_rounding_only(engine):
    model, (x, y, indices) = _model("cnn_gn", torch.float64), _pool(torch.float64)
    params = _params(model)
    alg = _algorithm(local_steps=3)
    tasks = alg.plan(0, list(range(len(SIZES))), None)
    g_seq, g_vec = _generators(len(SIZES)), _generators(len(SIZES))

    seq = _sequential(alg, model, params, x, y, indices, tasks, g_seq, engine="vmap")
    vec = _vectorised(alg, model, params, x, y, indices, tasks, g_vec, engine)

    _assert_same(seq, vec, atol=1e-12)
    _assert_streams_equal(g_seq, g_vec)


@pytest.mark.parametrize(
    ("max_clients", "small_budget", "engine"),
    [
        (1, False, "vmap"),
        (4, False, "vmap"),
        (None, True, "vmap"),
        (1, False, "bookkeeping"),
        (4, False, "bookkeeping"),
        (None, True, "bookkeeping"),
    ],
)
def test_chunking_does_not_change_results(max_clients, small_budget, engine):
    """Client chunks of 1 (each client alone), 4 (a boundary inside the group) and all,
    and a budget so small that chunks hold 3 clients and per-sample gradients come
    6 samples (2 padded slots per client) at a time."""
    model, (x, y, indices) = _model("mlp"), _pool()
    params = _params(model)
    kw = dict(local_steps=2, lr=0.2, sampling_rate=0.3, clip_norm=0.5, noise_multiplier=1.1)
    ref_gens, gens = _generators(len(SIZES)), _generators(len(SIZES))
    ref = MultiClientDPSGD(model, engine=engine).run(params, x, y, indices, ref_gens, **kw)
    param_bytes = sum(p.numel() * p.element_size() for p in params.values())
    budget = 12 * param_bytes if small_budget else 2**30

    trainer = MultiClientDPSGD(
        model, memory_budget_bytes=budget, max_clients=max_clients, engine=engine
    )
    out = trainer.run(params, x, y, indices, gens, **kw)

    expected_chunk = min(3 if small_budget else len(SIZES), max_clients or len(SIZES))
    assert min(trainer.clients_per_chunk(params), len(SIZES)) == expected_chunk
    assert torch.equal(out.batch_sizes, ref.batch_sizes)
    assert torch.equal(out.clipped_fractions, ref.clipped_fractions)
    for name in params:
        torch.testing.assert_close(out.updates[name], ref.updates[name], atol=1e-6, rtol=0)
    _assert_streams_equal(ref_gens, gens)


@pytest.mark.parametrize("engine", ["bookkeeping", "vmap"])
def test_group_composition_and_order_do_not_matter(engine):
    model, (x, y, indices) = _model("cnn_gn"), _pool()
    params = _params(model)
    kw = dict(local_steps=2, lr=0.2, sampling_rate=0.3, clip_norm=0.5, noise_multiplier=1.1)
    trainer = MultiClientDPSGD(model, engine=engine)
    whole = trainer.run(params, x, y, indices, _generators(len(SIZES)), **kw)
    order = [4, 0, 5, 2]
    gens = _generators(len(SIZES))
    part = trainer.run(params, x, y, [indices[k] for k in order], [gens[k] for k in order], **kw)

    for row, k in enumerate(order):
        assert torch.equal(part.batch_sizes[row], whole.batch_sizes[k])
        for name in params:
            torch.testing.assert_close(
                part.updates[name][row], whole.updates[name][k], atol=1e-6, rtol=0
            )


def test_every_batch_empty_gives_noise_only_steps():
    sizes = [1, 2, 1]
    model, (x, y, indices) = _model("logreg"), _pool(sizes=sizes)
    params = _params(model)
    alg = _algorithm(local_steps=3, sampling_rate=0.01, clients_per_round=3)
    tasks = alg.plan(0, [0, 1, 2], None)
    g_seq, g_vec = _generators(3, seed=3), _generators(3, seed=3)

    seq = _sequential(alg, model, params, x, y, indices, tasks, g_seq)
    vec = _vectorised(alg, model, params, x, y, indices, tasks, g_vec)

    assert all(r.metrics["mean_batch_size"] == 0.0 for r in vec)
    _assert_same(seq, vec, atol=2e-6)
    _assert_streams_equal(g_seq, g_vec)


def test_no_noise_draws_when_sigma_is_zero():
    model, (x, y, indices) = _model("mlp"), _pool()
    params = _params(model)
    alg = _algorithm(noise_multiplier=0.0, local_steps=2)
    tasks = alg.plan(0, list(range(len(SIZES))), None)
    g_seq, g_vec = _generators(len(SIZES)), _generators(len(SIZES))

    seq = _sequential(alg, model, params, x, y, indices, tasks, g_seq)
    vec = _vectorised(alg, model, params, x, y, indices, tasks, g_vec)

    _assert_same(seq, vec, atol=2e-6)
    _assert_streams_equal(g_seq, g_vec)


def test_padded_slots_contribute_nothing():
    """The record that padded slots replay cannot change any client's sum, even an
    outlier far outside the data; and it is never counted as clipped."""
    model, (x, y, indices) = _model("mlp"), _pool()
    x = torch.cat([x, torch.full((1, *SHAPE), 1e3)])  # the outlier: pool row -1
    y = torch.cat([y, torch.tensor([0])])
    params = _params(model)
    engine = MultiClientDPSGD(model, engine="vmap")
    c = 3
    stacked = {n: p.unsqueeze(0).repeat(c, *([1] * p.dim())) for n, p in params.items()}
    stacked = {n: t + 0.01 * k for k, (n, t) in enumerate(stacked.items())}
    rows = torch.cat([indices[3][:5], indices[4][:2]])  # batches of 5, 2 and 0
    seg = torch.tensor([0] * 5 + [1] * 2)
    counts = torch.tensor([5, 2, 0])
    own_first = torch.stack([indices[3][0], indices[4][0], indices[5][0]])
    outlier = torch.full((c,), x.shape[0] - 1)

    ref, ref_clipped = engine._stacked_step(stacked, x, y, rows, seg, counts, own_first, 0.5, 64)
    out, clipped = engine._stacked_step(stacked, x, y, rows, seg, counts, outlier, 0.5, 64)

    for name in params:
        assert torch.equal(out[name], ref[name])
        assert torch.equal(out[name][2], torch.zeros_like(out[name][2]))  # empty batch
    assert torch.equal(clipped, ref_clipped)
    assert clipped[2] == 0


def test_padded_slots_contribute_nothing_with_bookkeeping():
    """Same for the grouped book-keeping engine: a padded slot holding an outlier gives
    exactly the sums of the same batches without that slot."""
    model, (x, y, _) = _model("cnn_gn"), _pool()
    params = _params(model)
    grouped = MultiClientDPSGD(model, engine="bookkeeping")._grouped
    stacked = {n: p.unsqueeze(0).repeat(2, *([1] * p.dim())) for n, p in params.items()}
    xs, ys = x[:6].view(2, 3, *SHAPE).clone(), y[:6].view(2, 3)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    ref, ref_clipped = grouped.clipped_sums(stacked, xs, ys, mask, 0.5)
    xs[0, 2], xs[1, 1:] = 1e3, -1e3  # outliers in the padded slots only
    out, clipped = grouped.clipped_sums(stacked, xs, ys, mask, 0.5)

    for name in params:
        assert torch.equal(out[name], ref[name])
    assert torch.equal(clipped, ref_clipped)


def test_group_sum_matches_worker_partial_sum():
    model, (x, y, indices) = _model("logreg"), _pool()
    params = _params(model)
    alg = _algorithm()
    tasks = alg.plan(0, list(range(len(SIZES))), None)
    seq = _sequential(alg, model, params, x, y, indices, tasks, _generators(len(SIZES)))
    ref = WeightedUpdateSum()
    for r in seq:
        ref.add(r.update, r.weight, r.metrics)

    clipping = make_engine(model)
    ctxs = [ClientContext(model, clipping, g, torch.device("cpu")) for g in _generators(6)]
    datas = [ClientData(k, x, y, idx) for k, idx in enumerate(indices)]
    acc = alg.local_update_group_sum(ctxs, params, datas, tasks)

    assert acc.weight == ref.weight and acc.count == ref.count
    assert acc.metric_means() == pytest.approx(ref.metric_means(), abs=1e-12)
    for name in params:
        torch.testing.assert_close(acc.total[name], ref.total[name], atol=1e-4, rtol=0)


def test_unsupported_groups_fall_back_to_one_at_a_time():
    model, (x, y, indices) = _model("logreg"), _pool()
    params = _params(model)
    alg = _algorithm()
    tasks = alg.plan(0, list(range(len(SIZES))), None)
    mixed = [tasks[0].__class__(**{**tasks[0].__dict__, "lr": 0.05}), *tasks[1:]]

    class Overriding(DPFedAvg):
        def local_update(self, ctx, params, data, task):
            return super().local_update(ctx, params, data, task)

    assert alg.supports_group(tasks)
    assert not alg.supports_group(mixed)
    assert not alg.supports_group([])
    assert not alg.supports_group([tasks[0].__class__(**{**tasks[0].__dict__, "kind": "x"})])
    assert not Overriding(**{k: getattr(alg, k) for k in _algorithm_fields()}).supports_group(
        tasks
    )
    seq = _sequential(alg, model, params, x, y, indices, mixed, _generators(6), engine="vmap")
    vec = _vectorised(alg, model, params, x, y, indices, mixed, _generators(6))
    _assert_same(seq, vec, atol=0.0)  # the fallback is the sequential path itself


def _algorithm_fields():
    return (
        "clients_per_round",
        "local_steps",
        "lr",
        "clip_norm",
        "noise_multiplier",
        "sampling_rate",
    )


def test_engine_is_cached_per_model():
    model = _model("logreg")
    assert for_model(model) is for_model(model)
    assert for_model(model) is not for_model(_model("logreg"))


def test_vectorising_pays_off_on_cpu_for_small_models_only():
    assert pays_off(_model("cnn_gn"), "cpu")
    assert not pays_off(build_model("fedavg_cnn", (1, 28, 28), 10), "cpu")
    assert pays_off(build_model("fedavg_cnn", (1, 28, 28), 10), "cuda")


def test_grouped_bookkeeping_leaves_the_resident_model_untouched():
    model, (x, y, indices) = _model("cnn_gn"), _pool()
    params = _params(model)
    probe = x[:4]
    before = model(probe)
    MultiClientDPSGD(model, engine="bookkeeping").run(
        params,
        x,
        y,
        indices,
        _generators(len(SIZES)),
        local_steps=1,
        lr=0.2,
        sampling_rate=0.3,
        clip_norm=0.5,
        noise_multiplier=1.1,
    )
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert torch.equal(model(probe), before)
    with pytest.raises(ValueError, match="book-keeping rule"):
        MultiClientDPSGD(nn.Sequential(nn.Flatten(), nn.Bilinear(64, 64, 2)), engine="bookkeeping")


def test_same_device_treats_an_unindexed_device_as_the_current_one():
    from raydpfl.privacy.per_sample.multi_client import same_device

    assert same_device(torch.device("cpu"), torch.device("cpu"))
    assert same_device(torch.device("cpu", 0), torch.device("cpu"))
    assert not same_device(torch.device("cpu"), torch.device("meta"))
    assert same_device(torch.device("meta"), torch.device("meta"))


def test_vectorised_bookkeeping_hands_a_layer_called_twice_to_vmap():
    from tests.privacy.test_bookkeeping import _Twice

    torch.manual_seed(0)
    model = _Twice().requires_grad_(False)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(40, 4) * 3, torch.randint(0, 3, (40,))
    indices = [torch.arange(0, 15), torch.arange(15, 40)]
    kwargs = dict(local_steps=2, lr=0.5, sampling_rate=0.5, clip_norm=0.1, noise_multiplier=1.0)

    grouped = MultiClientDPSGD(model, engine="bookkeeping")
    with pytest.warns(UserWarning, match="runs more than once"):
        got = grouped.run(params, x, y, indices, _generators(2, seed=7), **kwargs)
    want = MultiClientDPSGD(model, engine="vmap").run(
        params, x, y, indices, _generators(2, seed=7), **kwargs
    )

    assert grouped.engine == "vmap"
    for n in params:
        torch.testing.assert_close(got.updates[n], want.updates[n], rtol=1e-5, atol=1e-6)
