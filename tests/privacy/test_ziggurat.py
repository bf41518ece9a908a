"""The ziggurat Gaussian sampler (privacy.noise_sampler: ziggurat).

Each statistical test uses fixed seeds and a bound whose false-failure probability for a
correct N(0, std²) sampler is stated (≤ 1e-6), so a failure means a wrong distribution
(a bad table, a biased layer or sign bit, a broken tail or wedge), not bad luck.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from scipy import stats

from raydpfl.algorithms.base import ClientTask
from raydpfl.config import ConfigError
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.privacy import ziggurat
from raydpfl.privacy.dpsgd import fill_gaussian_, gaussian_like, standard_normal_like
from raydpfl.privacy.multi_client import MultiClientDPSGD
from raydpfl.privacy.ziggurat import ZigguratGenerator
from raydpfl.simulation.worker import ClientWorker
from tests.conftest import dp_task, small_config

N = 1_000_000
ALPHA = 1e-6
#: Dvoretzky-Kiefer-Wolfowitz (Massart): P(D_n > c/sqrt(n)) <= 2·exp(−2c²).
KS_BOUND = math.sqrt(math.log(2 / ALPHA) / 2) / math.sqrt(N)
Z_BOUND = 5.0  # two-sided normal probability 5.7e-7


def _gen(seed: int) -> ZigguratGenerator:
    g = ZigguratGenerator()
    g.manual_seed(seed)
    return g


def _draws(seed: int, n: int = N, std: float = 1.0) -> np.ndarray:
    return ziggurat.normal((n,), std, _gen(seed), torch.float64).numpy()


def test_tables_close_the_ziggurat():
    """256 layers of equal area V between x[1] = R and x[256] = 0: the recursion's last
    step lands on f = 1 (to the constants' 12 digits), and the edges decrease."""
    x = ziggurat.EDGES
    assert x[1] == ziggurat.R and x[-1] == 0.0
    assert np.all(np.diff(x[1:]) < 0)
    top = ziggurat.V / x[255] + math.exp(-0.5 * x[255] ** 2)
    assert top == pytest.approx(1.0, abs=1e-9)
    # the base strip: rectangle R·f(R) plus the tail mass beyond R equals V
    tail = math.sqrt(math.pi / 2) * math.erfc(ziggurat.R / math.sqrt(2))
    assert ziggurat.R * math.exp(-0.5 * ziggurat.R**2) + tail == pytest.approx(
        ziggurat.V, rel=1e-9
    )


@pytest.mark.parametrize("std", [1.0, 2.5])
def test_draws_are_normal_with_the_requested_std(std):
    x = _draws(1, std=std)
    assert stats.kstest(x / std, "norm").statistic < KS_BOUND
    assert abs(x.mean()) / (std / math.sqrt(N)) < Z_BOUND
    # sample variance ~ N(std², 2std⁴/n); skewness ~ N(0, 6/n); excess kurtosis ~ N(0, 24/n)
    assert abs(x.var() / std**2 - 1) / math.sqrt(2 / N) < Z_BOUND
    assert abs(stats.skew(x)) / math.sqrt(6 / N) < Z_BOUND
    assert abs(stats.kurtosis(x)) / math.sqrt(24 / N) < Z_BOUND


def test_the_tail_and_the_wedges_carry_their_mass():
    """Counts in bands that only the slow paths produce: beyond R (the tail method) and
    near the layer edges (the wedges), against the normal's probabilities, each within 5
    binomial standard deviations; and a 200-bin chi-square over the whole line."""
    x = np.concatenate([_draws(seed) for seed in (2, 3, 4, 5)])
    n = x.size
    bands = [(ziggurat.R, np.inf), (3.0, ziggurat.R), (2.0, 2.2), (0.0, 0.05)]
    for lo, hi in bands:
        p = 2 * (stats.norm.cdf(hi) - stats.norm.cdf(lo))
        count = np.count_nonzero((np.abs(x) >= lo) & (np.abs(x) < hi))
        assert abs(count - n * p) / math.sqrt(n * p * (1 - p)) < Z_BOUND, (lo, hi)
    edges = stats.norm.ppf(np.linspace(0, 1, 201))
    observed, _ = np.histogram(x, bins=edges)
    chi2 = stats.chisquare(observed)
    assert chi2.pvalue > ALPHA


def test_signs_are_balanced_and_independent_of_magnitude():
    x = _draws(6)
    big = np.abs(x) > 1.0
    for part in (x, x[big], x[~big]):
        k = np.count_nonzero(part > 0)
        assert abs(k - part.size / 2) / math.sqrt(part.size / 4) < Z_BOUND


def test_draws_are_uncorrelated_within_and_across_derived_streams():
    """Lag-1..3 autocorrelation within a stream, and the correlation between the
    streams of consecutive seeds and of successive calls on one generator: each
    ~ N(0, 1/n) for independent draws."""
    n = 200_000
    a = _draws(7, n)
    for lag in (1, 2, 3):
        r = np.corrcoef(a[:-lag], a[lag:])[0, 1]
        assert abs(r) * math.sqrt(n) < Z_BOUND
    for seed in (8, 9):
        r = np.corrcoef(a, _draws(seed, n))[0, 1]
        assert abs(r) * math.sqrt(n) < Z_BOUND
    g = _gen(10)
    first = ziggurat.normal((n,), 1.0, g, torch.float64).numpy()
    second = ziggurat.normal((n,), 1.0, g, torch.float64).numpy()
    assert abs(np.corrcoef(first, second)[0, 1]) * math.sqrt(n) < Z_BOUND
    # squares too: a dependence in magnitude (e.g. the layer index reused) shows there
    assert abs(np.corrcoef(a[:-1] ** 2, a[1:] ** 2)[0, 1]) * math.sqrt(n) < Z_BOUND


def test_one_call_takes_exactly_one_draw_from_the_torch_stream():
    """Whatever the tensor's size, a fill advances the client's torch stream by one
    ``random_`` draw, so later draws from it (the next Poisson sample) are fixed."""
    for size in (0, 1, 7, 100_000):
        g, ref = _gen(11), torch.Generator().manual_seed(11)
        ziggurat.fill_normal_(torch.empty(size), 1.0, g)
        torch.empty((), dtype=torch.int64).random_(generator=ref)
        assert torch.equal(g.get_state(), ref.get_state())


def test_the_stream_is_reproducible_and_the_dtypes_agree():
    a = ziggurat.normal((5000,), 1.5, _gen(12), torch.float64)
    b = ziggurat.normal((5000,), 1.5, _gen(12), torch.float64)
    c = ziggurat.normal((5000,), 1.5, _gen(12), torch.float32)
    assert torch.equal(a, b)
    assert torch.equal(c, a.float())  # computed in float64, rounded once
    d = ziggurat.normal((5000,), 3.0, _gen(12), torch.float64)
    assert torch.equal(d, ziggurat.normal((5000,), 1.0, _gen(12), torch.float64) * 3.0)


def test_shapes_views_and_bad_tensors():
    base = torch.zeros(6, 8)
    view = base[:, ::2]  # not contiguous
    ziggurat.fill_normal_(view, 1.0, _gen(13))
    assert torch.count_nonzero(base[:, 1::2]) == 0 and torch.count_nonzero(view) == 24
    flat = ziggurat.normal((24,), 1.0, _gen(13), torch.float32)
    assert torch.equal(view.reshape(-1), flat)  # row-major order
    with pytest.raises(ValueError, match="float32/float64"):
        ziggurat.fill_normal_(torch.zeros(3, dtype=torch.int64), 1.0, _gen(0))
    with pytest.raises(ValueError, match="CPU"):
        ziggurat.fill_normal_(torch.empty(3, device="meta"), 1.0, _gen(0))


def test_dpsgd_noise_functions_route_a_ziggurat_stream_to_it():
    t = torch.zeros(3, 1000)
    for fn in (
        lambda g: gaussian_like(t, 2.0, g),
        lambda g: fill_gaussian_(torch.empty_like(t), 2.0, g),
        lambda g: 2.0 * standard_normal_like(t, g),
    ):
        out = fn(_gen(14))
        expected = ziggurat.normal(t.shape, 2.0, _gen(14), torch.float32)
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    # a plain torch generator is untouched by the option
    g = torch.Generator().manual_seed(14)
    assert torch.equal(
        gaussian_like(t, 2.0, g),
        torch.empty_like(t).normal_(0, 2.0, generator=torch.Generator().manual_seed(14)),
    )


def test_the_vectorised_path_uses_each_clients_ziggurat_stream():
    params = {"w": torch.zeros(4000), "b": torch.zeros(10)}
    noise = MultiClientDPSGD._draw_noise(params, [_gen(1), _gen(2)], 2.0)
    for i, seed in enumerate((1, 2)):
        g = _gen(seed)
        for name in ("w", "b"):
            expected = ziggurat.normal(params[name].shape, 2.0, g, torch.float32)
            assert torch.equal(noise[name][i], expected)


def test_the_option_travels_with_the_algorithm_and_keeps_the_poisson_draws():
    exp = build_experiment(small_config(experiment__privacy={"noise_sampler": "ziggurat"}))
    algorithm = pickle.loads(pickle.dumps(exp.algorithm))  # as Ray ships it
    worker = ClientWorker(algorithm, exp.model_spec, exp.dataset, run_seed=0)
    assert isinstance(worker._stream(dp_task()), ZigguratGenerator)
    plain = build_experiment(small_config())
    plain_worker = ClientWorker(plain.algorithm, plain.model_spec, plain.dataset, run_seed=0)
    # the same seed: a plain draw from either stream is the same
    a, b = worker._stream(dp_task()), plain_worker._stream(dp_task())
    assert torch.equal(torch.rand(50, generator=a), torch.rand(50, generator=b))
    zig = worker.run_task(exp.init_params, dp_task())
    again = worker.run_task(exp.init_params, dp_task())
    torch_run = plain_worker.run_task(plain.init_params, dp_task())
    assert all(torch.equal(zig.update[k], again.update[k]) for k in zig.update)
    assert not all(torch.equal(zig.update[k], torch_run.update[k]) for k in zig.update)
    # the first step's Poisson sample comes before any noise: the same batch (later
    # steps differ, as torch's noise advances the stream by one draw per value)
    one_step = ClientTask(**{**vars(dp_task()), "local_steps": 1})
    first = worker.run_task(exp.init_params, one_step).metrics["mean_batch_size"]
    assert first == plain_worker.run_task(plain.init_params, one_step).metrics["mean_batch_size"]


def test_a_run_with_the_ziggurat_sampler_says_so_and_keeps_its_charges():
    cfg = small_config(experiment__algorithm={"rounds": 2})
    zcfg = small_config(
        experiment__algorithm={"rounds": 2}, experiment__privacy={"noise_sampler": "ziggurat"}
    )
    plain, zig = (
        run_experiment(build_experiment(cfg), None),
        run_experiment(build_experiment(zcfg), None),
    )
    assert zig["privacy"]["noise_source"].startswith("research mode, ziggurat sampler")
    assert zig["model_sha256"] != plain["model_sha256"]
    assert zig["ledger_sha256"] == plain["ledger_sha256"]  # the same tasks, the same charges
    assert run_experiment(build_experiment(zcfg), None)["model_sha256"] == zig["model_sha256"]


def test_bad_settings_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match="noise_sampler"):
        small_config(experiment__privacy={"noise_sampler": "numpy"})
    with pytest.raises(ConfigError, match=r"noise_sampler.*os\.urandom"):
        small_config(experiment__privacy={"noise_sampler": "ziggurat", "secure_noise": True})


def test_a_gpu_run_is_refused_before_any_work(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = small_config(experiment__privacy={"noise_sampler": "ziggurat"}, runtime__device="auto")
    with pytest.raises(ConfigError, match=r"noise_sampler.*CPU"):
        build_experiment(cfg)
