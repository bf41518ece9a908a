"""The counter-based CPU Gaussian samplers (privacy.noise_sampler: ziggurat, boxmuller):
what every such sampler must do, each test run for each of them.

Each statistical check uses fixed seeds and a bound whose false-failure probability for
a correct N(0, std²) sampler is stated (≤ 1e-6), so a failure means a wrong distribution
(a bad table or transform, a biased sign, a dependence between values or streams), not
bad luck. The sampler-specific tests are in test_ziggurat.py and test_boxmuller.py.
"""

from __future__ import annotations

import math
import pickle
import typing

import numpy as np
import pytest
import torch
from scipy import stats

from raydpfl.algorithms.base import ClientTask
from raydpfl.config import ConfigError
from raydpfl.config.schema import PrivacyConfig
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.privacy.noise import counter_noise, noise_samplers
from raydpfl.privacy.noise.boxmuller import BoxMullerGenerator
from raydpfl.privacy.noise.ziggurat import ZigguratGenerator
from raydpfl.privacy.per_sample.dpsgd import fill_gaussian_, gaussian_like, standard_normal_like
from raydpfl.privacy.per_sample.multi_client import MultiClientDPSGD
from raydpfl.simulation.worker import ClientWorker
from tests.conftest import dp_task, small_config

N = 1_000_000
ALPHA = 1e-6
#: Dvoretzky-Kiefer-Wolfowitz (Massart): P(D_n > c/sqrt(n)) <= 2·exp(−2c²).
KS_BOUND = math.sqrt(math.log(2 / ALPHA) / 2) / math.sqrt(N)
Z_BOUND = 5.0  # two-sided normal probability 5.7e-7

SAMPLERS = list(noise_samplers.COUNTER_SAMPLERS)
#: How a run's summary names each sampler (privacy.noise_source).
NOISE_SOURCE = {
    "ziggurat": "research mode, ziggurat sampler",
    "boxmuller": "research mode, Box-Muller sampler",
}

pytestmark = pytest.mark.parametrize("sampler", SAMPLERS)


def _gen(sampler: str, seed: int) -> counter_noise.CounterNoiseGenerator:
    return noise_samplers.seeded_stream(sampler, seed)


def _normal(sampler: str, seed: int, n: int, std: float = 1.0, dtype=torch.float64):
    return counter_noise.normal((n,), std, _gen(sampler, seed), dtype)


def _draws(
    sampler: str, seed: int, n: int = N, std: float = 1.0, dtype=torch.float64
) -> np.ndarray:
    """Draws as float64 numpy values (a float32 tensor's values widened exactly)."""
    return _normal(sampler, seed, n, std, dtype).numpy().astype(np.float64)


#: Both dtypes: Box-Muller computes float32 tensors with their own float32 arithmetic.
DTYPES = pytest.mark.parametrize("dtype", [torch.float64, torch.float32])


def test_both_counter_samplers_are_covered(sampler):
    assert set(SAMPLERS) == {"ziggurat", "boxmuller"} == set(NOISE_SOURCE)
    assert noise_samplers.COUNTER_SAMPLERS[sampler].sampler == sampler


def test_seeded_stream_makes_each_samplers_generator(sampler):
    classes = {"ziggurat": ZigguratGenerator, "boxmuller": BoxMullerGenerator}
    g = noise_samplers.seeded_stream(sampler, 21)
    assert type(g) is classes[sampler]
    assert counter_noise.is_counter_noise(g) and isinstance(g, torch.Generator)
    # seeded as the default stream: the same state, so every plain draw is unchanged
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(21).get_state())
    plain = noise_samplers.seeded_stream("torch", 21)
    assert type(plain) is torch.Generator and not counter_noise.is_counter_noise(plain)
    assert torch.equal(plain.get_state(), g.get_state())
    with pytest.raises(ValueError, match=r"torch, ziggurat, boxmuller.*'numpy'"):
        noise_samplers.seeded_stream("numpy", 21)


def test_the_registry_matches_the_config(sampler):
    hints = typing.get_type_hints(PrivacyConfig)
    assert typing.get_args(hints["noise_sampler"]) == noise_samplers.NOISE_SAMPLERS
    assert ("torch", *SAMPLERS) == noise_samplers.NOISE_SAMPLERS
    cfg = small_config(experiment__privacy={"noise_sampler": sampler})
    assert cfg.experiment.privacy.noise_sampler == sampler


@DTYPES
@pytest.mark.parametrize("std", [1.0, 2.5])
def test_draws_are_normal_with_the_requested_std(sampler, std, dtype):
    x = _draws(sampler, 1, std=std, dtype=dtype)
    assert stats.kstest(x / std, "norm").statistic < KS_BOUND
    assert abs(x.mean()) / (std / math.sqrt(N)) < Z_BOUND
    # sample variance ~ N(std², 2std⁴/n); skewness ~ N(0, 6/n); excess kurtosis ~ N(0, 24/n)
    assert abs(x.var() / std**2 - 1) / math.sqrt(2 / N) < Z_BOUND
    assert abs(stats.skew(x)) / math.sqrt(6 / N) < Z_BOUND
    assert abs(stats.kurtosis(x)) / math.sqrt(24 / N) < Z_BOUND


@DTYPES
def test_a_chi_square_over_the_whole_line(sampler, dtype):
    """200 equiprobable bins of the normal over 4M draws."""
    x = np.concatenate([_draws(sampler, seed, dtype=dtype) for seed in (2, 3, 4, 5)])
    edges = stats.norm.ppf(np.linspace(0, 1, 201))
    observed, _ = np.histogram(x, bins=edges)
    assert observed.sum() == x.size
    assert stats.chisquare(observed).pvalue > ALPHA


def test_signs_are_balanced_and_independent_of_magnitude(sampler):
    x = _draws(sampler, 6)
    big = np.abs(x) > 1.0
    for part in (x, x[big], x[~big]):
        k = np.count_nonzero(part > 0)
        assert abs(k - part.size / 2) / math.sqrt(part.size / 4) < Z_BOUND


@DTYPES
def test_draws_are_uncorrelated_within_and_across_derived_streams(sampler, dtype):
    """Lag-1..3 autocorrelation within a stream, and the correlation between the
    streams of consecutive seeds and of successive calls on one generator: each
    ~ N(0, 1/n) for independent draws; the same for the squares (a dependence in
    magnitude: a reused layer index or radius)."""
    n = 200_000
    a = _draws(sampler, 7, n, dtype=dtype)
    for lag in (1, 2, 3):
        assert abs(np.corrcoef(a[:-lag], a[lag:])[0, 1]) * math.sqrt(n) < Z_BOUND
        r2 = np.corrcoef(a[:-lag] ** 2, a[lag:] ** 2)[0, 1]
        assert abs(r2) * math.sqrt(n) < Z_BOUND
    for seed in (8, 9):
        b = _draws(sampler, seed, n, dtype=dtype)
        assert abs(np.corrcoef(a, b)[0, 1]) * math.sqrt(n) < Z_BOUND
        assert abs(np.corrcoef(a**2, b**2)[0, 1]) * math.sqrt(n) < Z_BOUND
    g = _gen(sampler, 10)
    first = counter_noise.normal((n,), 1.0, g, torch.float64).numpy()
    second = counter_noise.normal((n,), 1.0, g, torch.float64).numpy()
    assert abs(np.corrcoef(first, second)[0, 1]) * math.sqrt(n) < Z_BOUND
    assert abs(np.corrcoef(first**2, second**2)[0, 1]) * math.sqrt(n) < Z_BOUND


def test_one_call_takes_exactly_one_draw_from_the_torch_stream(sampler):
    """Whatever the tensor's size, a fill advances the client's torch stream by one
    ``random_`` draw, so later draws from it (the next Poisson sample) are fixed."""
    for size in (0, 1, 2, 7, 100_000):
        g, ref = _gen(sampler, 11), torch.Generator().manual_seed(11)
        counter_noise.fill_normal_(torch.empty(size), 1.0, g)
        torch.empty((), dtype=torch.int64).random_(generator=ref)
        assert torch.equal(g.get_state(), ref.get_state()), size


def test_the_stream_is_reproducible_and_the_dtypes_agree(sampler):
    a = _normal(sampler, 12, 5001, 1.5)
    b = _normal(sampler, 12, 5001, 1.5)
    c = _normal(sampler, 12, 5001, 1.5, torch.float32)
    assert torch.equal(a, b)
    assert torch.equal(c, _normal(sampler, 12, 5001, 1.5, torch.float32))
    if sampler == "ziggurat":
        assert torch.equal(c, a.float())  # computed in float64, rounded once
    else:  # float32 arithmetic of the same pairs (boxmuller's docstring, step 5)
        assert not torch.equal(c, a.float())
        torch.testing.assert_close(c.double(), a, rtol=0, atol=5e-7 * 1.5 * 8.66)
    assert not torch.equal(a, _normal(sampler, 13, 5001, 1.5))
    # the std is applied in float64: the ziggurat multiplies the unit value, Box-Muller
    # the radius (std·ρ)·cos, which equals std × the unit draw to an ulp
    d = _normal(sampler, 12, 5001, 3.0)
    unit = _normal(sampler, 12, 5001, 1.0)
    if sampler == "ziggurat":
        assert torch.equal(d, unit * 3.0)
    torch.testing.assert_close(d, unit * 3.0, rtol=1e-14, atol=0)


@DTYPES
def test_add_normal_adds_what_fill_normal_draws(sampler, dtype):
    """`add_normal_` adds the values `fill_normal_` draws from the same state (one
    rounding per value: bit for bit ``out + draws``), takes the same single draw, or
    none with a given seed; views and empty tensors too."""
    base = torch.randn(7, 9, dtype=dtype)
    g, ref = _gen(sampler, 15), _gen(sampler, 15)
    out = base.clone()
    assert counter_noise.add_normal_(out, 1.3, g) is out
    assert torch.equal(out, base + counter_noise.normal(base.shape, 1.3, ref, dtype))
    assert torch.equal(g.get_state(), ref.get_state())
    seed = counter_noise.draw_seed(_gen(sampler, 16))
    g = _gen(sampler, 16)
    seeded = counter_noise.add_normal_(base.clone(), 1.3, g, seed=seed)
    assert torch.equal(g.get_state(), _gen(sampler, 16).get_state())  # no draw taken
    assert torch.equal(
        seeded, base + counter_noise.normal(base.shape, 1.3, _gen(sampler, 16), dtype)
    )
    view = base.clone()[:, ::2]  # not contiguous: through a temporary
    want = view + counter_noise.normal(view.shape, 1.3, _gen(sampler, 17), dtype)
    assert torch.equal(counter_noise.add_normal_(view, 1.3, _gen(sampler, 17)), want)
    g = _gen(sampler, 18)
    counter_noise.add_normal_(torch.empty(0, dtype=dtype), 1.0, g)
    ref = _gen(sampler, 18)
    torch.empty((), dtype=torch.int64).random_(generator=ref)
    assert torch.equal(g.get_state(), ref.get_state())
    with pytest.raises(ValueError, match="float32/float64"):
        counter_noise.add_normal_(torch.zeros(3, dtype=torch.int64), 1.0, _gen(sampler, 0))


@DTYPES
def test_add_normal_with_low_rank_factors_adds_their_product_first(sampler, dtype):
    """low_rank=(g, a): out + gᵀa + the draws `fill_normal_` makes (in one pass with
    Box-Muller's ``add_low_rank``, by a GEMM first without it), one draw taken; factors
    that do not fit the tensor are refused with both shapes named."""
    base = torch.randn(9, 7, dtype=dtype)
    g, a = torch.randn(3, 9, dtype=dtype), torch.randn(3, 7, dtype=dtype)
    stream, ref = _gen(sampler, 19), _gen(sampler, 19)
    out = counter_noise.add_normal_(base.clone(), 1.3, stream, low_rank=(g, a))
    want = base + g.t() @ a + counter_noise.normal(base.shape, 1.3, ref, dtype)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)
    assert torch.equal(stream.get_state(), ref.get_state())
    with pytest.raises(ValueError, match=r"\(3, 7\) and \(3, 9\).*\(9, 7\)"):
        counter_noise.add_normal_(base.clone(), 1.0, _gen(sampler, 0), low_rank=(a, g))


def test_shapes_views_and_bad_tensors(sampler):
    base = torch.zeros(6, 8)
    view = base[:, ::2]  # not contiguous
    counter_noise.fill_normal_(view, 1.0, _gen(sampler, 13))
    assert torch.count_nonzero(base[:, 1::2]) == 0 and torch.count_nonzero(view) == 24
    flat = counter_noise.normal((24,), 1.0, _gen(sampler, 13), torch.float32)
    assert torch.equal(view.reshape(-1), flat)  # row-major order
    shaped = counter_noise.normal((2, 3, 4), 1.0, _gen(sampler, 13), torch.float32)
    assert shaped.shape == (2, 3, 4) and torch.equal(shaped.reshape(-1), flat)
    with pytest.raises(ValueError, match=f"{sampler}.*float32/float64"):
        counter_noise.fill_normal_(torch.zeros(3, dtype=torch.int64), 1.0, _gen(sampler, 0))
    with pytest.raises(ValueError, match=f"{sampler}.*CPU"):
        counter_noise.fill_normal_(torch.empty(3, device="meta"), 1.0, _gen(sampler, 0))


def test_dpsgd_noise_functions_route_the_stream_to_its_sampler(sampler):
    t = torch.zeros(3, 1001)
    expected = counter_noise.normal(t.shape, 2.0, _gen(sampler, 14), torch.float32)
    for fn in (
        lambda g: gaussian_like(t, 2.0, g),
        lambda g: fill_gaussian_(torch.empty_like(t), 2.0, g),
        lambda g: 2.0 * standard_normal_like(t, g),
    ):
        out = fn(_gen(sampler, 14))
        assert out.shape == t.shape and out.dtype == t.dtype
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=0)
    # not torch's own Gaussians from the same seed
    torch_draws = torch.empty_like(t).normal_(0, 2.0, generator=torch.Generator().manual_seed(14))
    assert not torch.allclose(expected, torch_draws)
    # a plain torch generator is untouched by the option
    g = torch.Generator().manual_seed(14)
    assert torch.equal(gaussian_like(t, 2.0, g), torch_draws)


def test_the_vectorised_path_uses_each_clients_stream(sampler):
    params = {"w": torch.zeros(4001), "b": torch.zeros(10)}
    noise = MultiClientDPSGD._draw_noise(params, [_gen(sampler, 1), _gen(sampler, 2)], 2.0)
    for i, seed in enumerate((1, 2)):
        g = _gen(sampler, seed)
        for name in ("w", "b"):
            expected = counter_noise.normal(params[name].shape, 2.0, g, torch.float32)
            assert torch.equal(noise[name][i], expected)
    assert not torch.equal(noise["w"][0], noise["w"][1])


def test_the_option_travels_with_the_algorithm_and_keeps_the_poisson_draws(sampler):
    exp = build_experiment(small_config(experiment__privacy={"noise_sampler": sampler}))
    algorithm = pickle.loads(pickle.dumps(exp.algorithm))  # as Ray ships it
    worker = ClientWorker(algorithm, exp.model_spec, exp.dataset, run_seed=0)
    assert isinstance(worker._stream(dp_task()), noise_samplers.COUNTER_SAMPLERS[sampler])
    plain = build_experiment(small_config())
    plain_worker = ClientWorker(plain.algorithm, plain.model_spec, plain.dataset, run_seed=0)
    assert not counter_noise.is_counter_noise(plain_worker._stream(dp_task()))
    # the same seed: a plain draw from either stream is the same
    a, b = worker._stream(dp_task()), plain_worker._stream(dp_task())
    assert torch.equal(torch.rand(50, generator=a), torch.rand(50, generator=b))
    fast = worker.run_task(exp.init_params, dp_task())
    again = worker.run_task(exp.init_params, dp_task())
    torch_run = plain_worker.run_task(plain.init_params, dp_task())
    assert all(torch.equal(fast.update[k], again.update[k]) for k in fast.update)
    assert not all(torch.equal(fast.update[k], torch_run.update[k]) for k in fast.update)
    # the first step's Poisson sample comes before any noise: the same batch (later
    # steps differ, as torch's noise advances the stream by one draw per value)
    one_step = ClientTask.dp_sgd(
        0, 0, 1, 0.5, noise_multiplier=1.0, clip_norm=1.0, sampling_rate=0.1
    )
    first = worker.run_task(exp.init_params, one_step).metrics["mean_batch_size"]
    assert first == plain_worker.run_task(plain.init_params, one_step).metrics["mean_batch_size"]


def test_a_run_with_the_sampler_says_so_and_keeps_its_charges(sampler):
    cfg = small_config(experiment__algorithm={"rounds": 2})
    scfg = small_config(
        experiment__algorithm={"rounds": 2}, experiment__privacy={"noise_sampler": sampler}
    )
    plain, fast = (
        run_experiment(build_experiment(cfg), None),
        run_experiment(build_experiment(scfg), None),
    )
    assert fast["privacy"]["noise_source"].startswith(NOISE_SOURCE[sampler])
    assert not plain["privacy"]["noise_source"].startswith(NOISE_SOURCE[sampler])
    assert fast["model_sha256"] != plain["model_sha256"]
    assert fast["ledger_sha256"] == plain["ledger_sha256"]  # the same tasks, the same charges
    assert run_experiment(build_experiment(scfg), None)["model_sha256"] == fast["model_sha256"]


def test_bad_settings_are_refused_naming_the_field(sampler):
    with pytest.raises(ConfigError, match="noise_sampler"):
        small_config(experiment__privacy={"noise_sampler": "numpy"})
    with pytest.raises(ConfigError, match=r"noise_sampler.*os\.urandom"):
        small_config(experiment__privacy={"noise_sampler": sampler, "secure_noise": True})


def test_a_gpu_run_is_refused_before_any_work(sampler, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = small_config(experiment__privacy={"noise_sampler": sampler}, runtime__device="auto")
    with pytest.raises(ConfigError, match=rf"noise_sampler.*{sampler}.*CPU"):
        build_experiment(cfg)
