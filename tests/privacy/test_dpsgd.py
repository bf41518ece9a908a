import math

import pytest
import torch
from torch import nn

from raydpfl.privacy.per_sample.dpsgd import (
    LossWeightRule,
    PerSampleGradients,
    add_gaussian_noise,
    clip_weights,
    dp_sgd_gradient,
    dp_sgd_step_,
    gaussian_like,
    per_sample_norms,
    poisson_sample,
    standard_normal_like,
)


def _gen(seed=0):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _model_and_batch(n=16):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x = torch.randn(n, 5) * 4
    y = torch.randint(0, 3, (n,))
    return model, params, x, y


def test_poisson_sample_size_matches_binomial_moments():
    n, q, trials = 2000, 0.05, 400
    gen = _gen(1)

    sizes = torch.tensor(
        [poisson_sample(n, q, gen).numel() for _ in range(trials)], dtype=torch.float64
    )

    mean, var = n * q, n * q * (1 - q)
    assert abs(sizes.mean().item() - mean) < 4 * math.sqrt(var / trials)
    assert abs(sizes.var().item() / var - 1) < 0.25


def test_poisson_sample_includes_each_record_independently_with_rate_q():
    n, q, trials = 50, 0.2, 4000
    gen = _gen(2)
    counts = torch.zeros(n)
    pair = 0

    for _ in range(trials):
        idx = poisson_sample(n, q, gen)
        counts[idx] += 1
        pair += int((idx == 0).any() and (idx == 1).any())

    freq = counts / trials
    tol = 5 * math.sqrt(q * (1 - q) / trials)
    assert (freq - q).abs().max().item() < tol
    # Independence: P(0 and 1 both in) = q², unlike fixed-size sampling.
    assert abs(pair / trials - q * q) < 5 * math.sqrt(q * q / trials)


def test_poisson_sample_yields_empty_batches_at_their_natural_rate():
    n, q, trials = 10, 0.05, 3000
    gen = _gen(3)

    empty = sum(poisson_sample(n, q, gen).numel() == 0 for _ in range(trials)) / trials

    assert abs(empty - (1 - q) ** n) < 0.03


def test_per_sample_gradients_equal_individual_autograd_gradients():
    model, params, x, y = _model_and_batch(6)
    engine = PerSampleGradients(model)

    grads = engine.grads(params, x, y)

    for i in range(6):
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1])
        loss.backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name][i], p.grad, rtol=1e-4, atol=1e-6)


def test_every_clipped_per_sample_norm_is_at_most_c():
    model, params, x, y = _model_and_batch(32)
    engine = PerSampleGradients(model)
    clip = 0.1

    grads = engine.grads(params, x, y)
    weights = clip_weights(per_sample_norms(grads), clip)
    clipped = {k: g * weights.view(-1, *[1] * (g.dim() - 1)) for k, g in grads.items()}

    norms_before = per_sample_norms(grads)
    norms_after = per_sample_norms(clipped)
    assert (norms_before > clip).any()
    assert (norms_after <= clip).all()
    small = norms_before < clip
    torch.testing.assert_close(norms_after[small], norms_before[small])


def test_chunked_clipped_sum_equals_unchunked():
    model, params, x, y = _model_and_batch(20)
    rule = lambda n: clip_weights(n, 0.5)  # noqa: E731

    whole, _ = PerSampleGradients(model, max_chunk=64).clipped_sum(params, x, y, rule)
    chunked, stats = PerSampleGradients(model, max_chunk=3).clipped_sum(params, x, y, rule)

    for k in whole:
        torch.testing.assert_close(whole[k], chunked[k], rtol=1e-5, atol=1e-6)
    assert stats.batch_size == 20


def test_noise_has_std_sigma_c_and_zero_mean():
    sigma, clip, gen = 1.3, 0.7, _gen(4)
    tensors = {"a": torch.zeros(200_000), "b": torch.zeros(300, 100)}

    add_gaussian_noise(tensors, sigma * clip, gen)

    flat = torch.cat([t.flatten() for t in tensors.values()])
    assert abs(flat.std().item() / (sigma * clip) - 1) < 0.01
    assert abs(flat.mean().item()) < 0.01


def test_empty_batch_step_is_pure_noise_over_expected_batch():
    model, params, x, y = _model_and_batch(4)
    sigma, clip, expected = 2.0, 1.0, 10.0

    grad, stats = dp_sgd_gradient(
        PerSampleGradients(model),
        params,
        x[:0],
        y[:0],
        clip_norm=clip,
        noise_multiplier=sigma,
        expected_batch_size=expected,
        generator=_gen(5),
    )

    flat = torch.cat([g.flatten() for g in grad.values()])
    assert stats.batch_size == 0
    assert flat.abs().sum() > 0
    assert abs(flat.std().item() / (sigma * clip / expected) - 1) < 0.15  # ~100 params


def test_no_noise_and_no_clipping_equals_nonprivate_gradient_rescaled():
    model, params, x, y = _model_and_batch(12)
    expected = 8.0

    grad, _ = dp_sgd_gradient(
        PerSampleGradients(model),
        params,
        x,
        y,
        clip_norm=1e9,
        noise_multiplier=0.0,
        expected_batch_size=expected,
        generator=_gen(6),
    )

    model.zero_grad()
    nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grad[name], p.grad / expected, rtol=1e-4, atol=1e-6)


def test_same_generator_seed_gives_same_noise_and_other_seed_differs():
    model, params, x, y = _model_and_batch(8)
    kwargs = dict(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=4.0)
    engine = PerSampleGradients(model)

    a, _ = dp_sgd_gradient(engine, params, x, y, generator=_gen(7), **kwargs)
    b, _ = dp_sgd_gradient(engine, params, x, y, generator=_gen(7), **kwargs)
    c, _ = dp_sgd_gradient(engine, params, x, y, generator=_gen(8), **kwargs)

    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("bad", [dict(clip_norm=0.0), dict(expected_batch_size=0.0)])
def test_invalid_step_arguments_are_rejected(bad):
    model, params, x, y = _model_and_batch(2)
    kwargs = dict(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=1.0, generator=_gen())
    kwargs.update(bad)

    with pytest.raises(ValueError, match=next(iter(bad))):
        dp_sgd_gradient(PerSampleGradients(model), params, x, y, **kwargs)


@pytest.mark.parametrize("sampler", ["torch", "boxmuller", "ziggurat"])
@pytest.mark.parametrize("engine_kind", ["vmap", "bookkeeping"])
@pytest.mark.parametrize("sigma", [0.0, 1.5])
@pytest.mark.parametrize("n", [3, 9])
def test_fused_step_equals_subtracting_the_privatised_gradient(
    engine_kind, sigma, sampler, n, monkeypatch
):
    """Every engine and sampler, a batch under and over `LOW_RANK_MAX_BATCH`; with the
    book-keeping engine and Box-Muller the step forms no noise tensor (the sampler adds
    into the parameters), and a small batch's Linear weight sums are added with the
    noise (``add_low_rank``): the same draws, the same update up to float rounding."""
    from raydpfl.privacy.noise.boxmuller import BoxMullerGenerator
    from raydpfl.privacy.noise.noise_samplers import seeded_stream
    from raydpfl.privacy.per_sample import dpsgd
    from raydpfl.privacy.per_sample.engines import make_engine

    assert 3 <= dpsgd.LOW_RANK_MAX_BATCH < 9
    model, params, x, y = _model_and_batch(n)
    engine = make_engine(model, engine_kind)
    kwargs = dict(clip_norm=0.5, noise_multiplier=sigma, expected_batch_size=3.0)
    g_ref, g_fused = seeded_stream(sampler, 11), seeded_stream(sampler, 11)

    grad, ref_stats = dp_sgd_gradient(engine, params, x, y, generator=g_ref, **kwargs)
    expected = {k: p - 0.3 * grad[k] for k, p in params.items()}
    fused = {k: p.clone() for k, p in params.items()}
    without_noise_tensor = sigma > 0 and sampler == "boxmuller" and engine_kind == "bookkeeping"
    if without_noise_tensor:

        def no_noise_tensor(*args, **kw):
            raise AssertionError("the fused update drew a noise tensor")

        monkeypatch.setattr(dpsgd, "gaussian_like", no_noise_tensor)
    low_rank_shapes = []
    kernel = BoxMullerGenerator.add_low_rank

    def spy(out, seed, std, g, a):
        low_rank_shapes.append((g.shape, a.shape))
        kernel(out, seed, std, g, a)

    monkeypatch.setattr(BoxMullerGenerator, "add_low_rank", staticmethod(spy))
    stats = dp_sgd_step_(engine, fused, x, y, lr=0.3, generator=g_fused, **kwargs)
    monkeypatch.undo()
    if without_noise_tensor and n == 3:  # both Linear weights: factors (B, q), (B, p)
        assert low_rank_shapes == [((3, 8), (3, 5)), ((3, 3), (3, 8))]
    else:
        assert low_rank_shapes == []

    for k in params:
        torch.testing.assert_close(fused[k], expected[k], rtol=1e-6, atol=1e-6)
    assert stats == ref_stats
    # the same draws were consumed: both generators are left in the same state
    assert torch.equal(g_ref.get_state(), g_fused.get_state())
    if sigma > 0:  # the noise is really there (not a silent no-op)
        clean = {k: p.clone() for k, p in params.items()}
        dp_sgd_step_(
            engine,
            clean,
            x,
            y,
            lr=0.3,
            generator=seeded_stream(sampler, 11),
            **{**kwargs, "noise_multiplier": 0.0},
        )
        assert not all(torch.allclose(clean[k], fused[k]) for k in params)


def test_a_batch_over_one_chunk_keeps_the_noise_tensor():
    """Adding into the parameters needs every layer's sum formed after the one forward
    pass: a batch over the engine's chunk takes the noise-tensor path, still correct."""
    from raydpfl.privacy.noise.noise_samplers import seeded_stream
    from raydpfl.privacy.per_sample.bookkeeping import BookkeepingClipping

    model, params, x, y = _model_and_batch(9)
    engine = BookkeepingClipping(model, max_chunk=4)
    kwargs = dict(clip_norm=0.5, noise_multiplier=1.5, expected_batch_size=3.0)
    grad, _ = dp_sgd_gradient(
        engine, params, x, y, generator=seeded_stream("boxmuller", 5), **kwargs
    )
    stepped = {k: p.clone() for k, p in params.items()}
    dp_sgd_step_(engine, stepped, x, y, lr=0.3, generator=seeded_stream("boxmuller", 5), **kwargs)
    for k in params:
        torch.testing.assert_close(stepped[k], params[k] - 0.3 * grad[k], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (dict(clip_norm=0.0), "clip_norm"),
        (dict(expected_batch_size=0.0), "expected_batch_size"),
        (dict(noise_multiplier=-1.0), "noise std"),
    ],
)
def test_fused_step_rejects_invalid_arguments(bad, message):
    model, params, x, y = _model_and_batch(2)
    kwargs = dict(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=1.0, generator=_gen())
    kwargs.update(bad)
    with pytest.raises(ValueError, match=message):
        dp_sgd_step_(PerSampleGradients(model), params, x, y, lr=0.1, **kwargs)


@pytest.mark.parametrize("shape", [(7,), (64, 33), (3, 2, 5, 5)])
def test_gaussian_like_draws_what_a_scaled_standard_normal_draws(shape):
    """Scaling inside the Gaussian kernel changes no draw: the same values as std·randn
    (to float rounding) and the generator left in the same state, small tensors (torch's
    scalar path) and large ones (its vectorised path) alike."""
    t = torch.empty(shape)
    g1, g2 = _gen(5), _gen(5)
    scaled = gaussian_like(t, 2.5, g1)
    expected = 2.5 * standard_normal_like(t, g2)
    torch.testing.assert_close(scaled, expected, rtol=1e-6, atol=0)
    assert scaled.shape == t.shape and scaled.dtype == t.dtype
    assert torch.equal(g1.get_state(), g2.get_state())


@pytest.mark.parametrize("engine_kind", ["vmap", "bookkeeping"])
@pytest.mark.parametrize("n", [0, 9])
def test_clipped_sum_into_adds_the_sum_to_the_given_tensors(engine_kind, n):
    """`into=` returns the caller's own tensors with the clipped sum added (the fused
    GEMM for Linear layers), equal to adding the separately formed sum; an empty batch
    leaves them unchanged."""
    from raydpfl.privacy.per_sample.engines import make_engine

    model, params, x, y = _model_and_batch(max(n, 1))
    x, y = x[:n], y[:n]
    engine = make_engine(model, engine_kind)
    rule = lambda norms: clip_weights(norms, 0.5)  # noqa: E731
    base = {k: torch.randn(p.shape, generator=_gen(3)) for k, p in params.items()}
    into = {k: b.clone() for k, b in base.items()}

    summed, stats = engine.clipped_sum(params, x, y, rule)
    out, into_stats = engine.clipped_sum(params, x, y, rule, into=into)

    assert list(out) == list(params)
    assert all(out[k] is into[k] for k in params)  # added in place, nothing new
    for k in params:
        torch.testing.assert_close(out[k], base[k] + summed[k], rtol=1e-6, atol=1e-6)
    assert into_stats == stats
    if n == 0:
        assert all(torch.equal(out[k], base[k]) for k in params)


# ---- the run-time sensitivity check on caller-supplied weight rules -----------------------
@pytest.mark.parametrize("engine_kind", ["vmap", "bookkeeping"])
@pytest.mark.parametrize(
    "rule",
    [
        lambda norms: 2.0 / (norms + 1e-6),  # every sample at twice C = 1
        lambda norms: torch.where(norms > 0, torch.full_like(norms, float("nan")), norms),
        LossWeightRule(lambda norms, losses: -3.0 / (norms + 1e-6)),  # |a|·‖g‖ = 3 > C
    ],
    ids=["twice-C", "nan", "negative-3C"],
)
def test_a_weight_rule_that_exceeds_the_clip_norm_is_refused(engine_kind, rule):
    from raydpfl.privacy.per_sample.dpsgd import SensitivityError, dp_sgd_step_
    from raydpfl.privacy.per_sample.engines import make_engine

    model, params, x, y = _model_and_batch()
    engine = make_engine(model, engine_kind)
    with pytest.raises(SensitivityError, match=r"above the clip norm C = 1"):
        dp_sgd_step_(
            engine,
            params,
            x,
            y,
            lr=0.1,
            clip_norm=1.0,
            noise_multiplier=1.0,
            expected_batch_size=4.0,
            generator=_gen(),
            weight_rule=rule,
        )


def test_a_rule_within_the_bound_passes_unchanged_and_only_the_platform_opts_out():
    from raydpfl.privacy.per_sample.dpsgd import BoundedWeightRule, SensitivityError

    norms = torch.tensor([0.5, 2.0, 8.0])
    inside = BoundedWeightRule(lambda n: -clip_weights(n, 1.0), 1.0)  # sign is free
    assert torch.equal(inside(norms), -clip_weights(norms, 1.0))
    loose = lambda n: torch.full_like(n, 10.0)  # noqa: E731
    loose.unbounded_by_design = True  # an attribute on the rule no longer turns it off
    with pytest.raises(SensitivityError, match="above the clip norm"):
        BoundedWeightRule(loose, 1.0)(norms)
    # the run-level opt-out, which only the platform passes (and lists as unbounded)
    assert torch.equal(BoundedWeightRule(loose, 1.0, check=False)(norms), torch.full((3,), 10.0))
