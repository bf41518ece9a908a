"""Secure-noise mode: DP noise and Poisson samples from os.urandom (privacy.secure_noise).

The statistical tests use fixed bounds whose false-failure probability is stated: each
is below 1e-6 for a correct sampler, so a failure means a wrong distribution.
"""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.privacy.noise import secure_noise
from raydpfl.privacy.noise.secure_noise import SecureGenerator
from raydpfl.privacy.per_sample.dpsgd import (
    add_gaussian_noise,
    fill_gaussian_,
    gaussian_like,
    poisson_sample,
    standard_normal_like,
    uniform_draws,
)
from raydpfl.privacy.per_sample.multi_client import MultiClientDPSGD
from raydpfl.simulation.worker import ClientWorker
from tests.conftest import dp_task, small_config

N = 100_000
#: Kolmogorov-Smirnov: P(D_n > c/sqrt(n)) <= 2·exp(−2c²) (Dvoretzky-Kiefer-Wolfowitz,
#: Massart's constant), so c = sqrt(ln(2/α)/2) gives false-failure probability ≤ α.
ALPHA = 1e-6
KS_BOUND = math.sqrt(math.log(2 / ALPHA) / 2) / math.sqrt(N)
#: |Z| > 5 for a standard normal statistic: two-sided probability 5.7e-7.
Z_BOUND = 5.0


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ks_distance(x: torch.Tensor, std: float) -> float:
    """sup |F_n − Φ(·/std)| of the sample `x` (float64)."""
    xs, _ = torch.sort(x.double())
    cdf = 0.5 * (1 + torch.special.erf(xs / (std * math.sqrt(2))))
    n = xs.numel()
    upper = torch.arange(1, n + 1, dtype=torch.float64) / n - cdf
    lower = cdf - torch.arange(0, n, dtype=torch.float64) / n
    return float(torch.maximum(upper, lower).max())


@pytest.mark.parametrize("std", [1.0, 2.5])
def test_secure_draws_are_normal_with_the_requested_std(std):
    x = gaussian_like(torch.zeros(N, dtype=torch.float64), std, SecureGenerator())

    assert _ks_distance(x, std) < KS_BOUND
    # mean ~ N(0, std²/n); sample variance ~ N(std², 2std⁴/n) for large n
    assert abs(float(x.mean())) / (std / math.sqrt(N)) < Z_BOUND
    assert abs(float(x.var()) / std**2 - 1) / math.sqrt(2 / N) < Z_BOUND


def test_every_noise_function_honours_the_secure_stream_and_keeps_shape_and_dtype():
    t = torch.zeros(300, 7)
    for draw in (
        standard_normal_like(t, SecureGenerator()),
        gaussian_like(t, 3.0, SecureGenerator()),
        fill_gaussian_(torch.empty_like(t), 3.0, SecureGenerator()),
        add_gaussian_noise({"t": t.clone()}, 3.0, SecureGenerator())["t"],
    ):
        assert draw.shape == t.shape and draw.dtype == torch.float32
        assert float(draw.std()) > 0.5 and torch.isfinite(draw).all()
    assert gaussian_like(torch.zeros(()), 1.0, SecureGenerator()).shape == ()


def test_a_secure_stream_leaves_its_own_torch_state_untouched():
    """DP draws bypass the generator (os.urandom): its PRNG state does not move."""
    g = SecureGenerator()
    before = g.get_state()
    gaussian_like(torch.zeros(100), 1.0, g)
    poisson_sample(100, 0.5, g)
    assert torch.equal(g.get_state(), before)


def test_secure_poisson_sampling_has_rate_q():
    n, q = 20_000, 0.05
    size = poisson_sample(n, q, SecureGenerator()).numel()
    # Binomial(n, q): |size − nq| / sqrt(nq(1−q)) > 5 has probability < 1e-6
    assert abs(size - n * q) / math.sqrt(n * q * (1 - q)) < Z_BOUND
    u = uniform_draws(N, SecureGenerator())
    assert u.dtype == torch.float64 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert _uniform_ks(u) < KS_BOUND


def _uniform_ks(u: torch.Tensor) -> float:
    us, _ = torch.sort(u)
    n = us.numel()
    upper = torch.arange(1, n + 1, dtype=torch.float64) / n - us
    lower = us - torch.arange(0, n, dtype=torch.float64) / n
    return float(torch.maximum(upper, lower).max())


def test_same_seed_gives_the_same_noise_in_research_mode_and_different_in_secure_mode():
    t = torch.zeros(1000)
    assert torch.equal(gaussian_like(t, 1.0, _gen(7)), gaussian_like(t, 1.0, _gen(7)))
    assert not torch.equal(
        gaussian_like(t, 1.0, SecureGenerator()), gaussian_like(t, 1.0, SecureGenerator())
    )


def test_research_mode_draws_are_unchanged():
    """The secure branch is a type check only: research streams draw what torch draws."""
    t = torch.zeros(50)
    assert torch.equal(
        gaussian_like(t, 2.0, _gen(3)), torch.empty(50).normal_(0, 2, generator=_gen(3))
    )
    assert torch.equal(uniform_draws(50, _gen(3)), torch.rand(50, generator=_gen(3)))


def test_the_vectorised_path_draws_secure_noise_too():
    params = {"w": torch.zeros(4000)}
    secure = MultiClientDPSGD._draw_noise(params, [SecureGenerator(), SecureGenerator()], 2.0)
    again = MultiClientDPSGD._draw_noise(params, [SecureGenerator(), SecureGenerator()], 2.0)
    research = MultiClientDPSGD._draw_noise(params, [_gen(1), _gen(2)], 2.0)
    assert secure is not None and again is not None and research is not None
    assert not torch.equal(secure["w"], again["w"])
    assert torch.equal(
        research["w"], MultiClientDPSGD._draw_noise(params, [_gen(1), _gen(2)], 2.0)["w"]
    )
    assert abs(float(secure["w"].std()) / 2.0 - 1) < 0.05  # 8,000 draws: sd of ratio ~0.008


@pytest.mark.parametrize("secure", [False, True])
def test_a_worker_repeats_a_task_exactly_only_in_research_mode(secure):
    exp = build_experiment(small_config(experiment__privacy={"secure_noise": secure}))
    worker = ClientWorker(exp.algorithm, exp.model_spec, exp.dataset, run_seed=0)
    a = worker.run_task(exp.init_params, dp_task()).update
    b = worker.run_task(exp.init_params, dp_task()).update
    same = all(torch.equal(a[k], b[k]) for k in a)
    assert same is not secure


def test_the_mode_travels_with_the_algorithm_to_another_process():
    """Ray pickles the algorithm into every worker actor; the mode goes with it."""
    exp = build_experiment(small_config(experiment__privacy={"secure_noise": True}))
    algorithm = pickle.loads(pickle.dumps(exp.algorithm))
    worker = ClientWorker(algorithm, exp.model_spec, exp.dataset, run_seed=0)
    assert isinstance(worker._stream(dp_task()), SecureGenerator)
    plain = build_experiment(small_config())
    worker = ClientWorker(plain.algorithm, plain.model_spec, plain.dataset, run_seed=0)
    assert not secure_noise.is_secure(worker._stream(dp_task()))


def test_a_two_round_run_with_secure_noise_works_and_says_so(tmp_path):
    config = small_config(
        experiment__algorithm={"rounds": 2}, experiment__privacy={"secure_noise": True}
    )
    (tmp_path / "a").mkdir()
    first = run_experiment(build_experiment(config), tmp_path / "a")
    second = run_experiment(build_experiment(config), None)

    assert first["rounds_completed"] == 2
    assert first["privacy"]["noise_source"].startswith("secure mode: ")
    assert "os.urandom" in (tmp_path / "a" / "summary.json").read_text()
    assert first["model_sha256"] != second["model_sha256"]  # same seed, fresh noise
    assert first["ledger_sha256"] == second["ledger_sha256"]  # the same charges


def test_research_mode_says_so_in_the_summary():
    summary = run_experiment(
        build_experiment(small_config(experiment__algorithm={"rounds": 1})), None
    )
    assert summary["privacy"]["noise_source"].startswith("research mode")


def test_secure_laplace_has_the_requested_scale():
    from raydpfl.papers.dpfl_bcs.algorithm import laplace_noise

    b = 1.5
    x = laplace_noise(torch.Size([N]), b, SecureGenerator(), "cpu").double()
    xs, _ = torch.sort(x)
    cdf = torch.where(xs < 0, 0.5 * torch.exp(xs / b), 1 - 0.5 * torch.exp(-xs / b))
    n = xs.numel()
    upper = torch.arange(1, n + 1, dtype=torch.float64) / n - cdf
    lower = cdf - torch.arange(0, n, dtype=torch.float64) / n
    assert float(torch.maximum(upper, lower).max()) < KS_BOUND
    assert (
        x.dtype == torch.float64
        and laplace_noise((3,), b, SecureGenerator(), "cpu").dtype == torch.float32
    )
    # research mode: the client's stream, reproducible
    assert torch.equal(
        laplace_noise((9,), b, _gen(4), "cpu"), laplace_noise((9,), b, _gen(4), "cpu")
    )


def test_algorithm_noise_outside_dp_sgd_is_secure_too():
    """DPFL-BCS's Gaussian and FedFDP's noisy loss draw through the same functions."""
    from raydpfl.papers.fedfdp.theory import private_mean_loss

    losses = torch.ones(10)

    def noisy_mean_loss(losses, clip, sigma, denominator, generator):
        return private_mean_loss(
            losses,
            clip_bound=clip,
            noise_multiplier=sigma,
            denominator=denominator,
            generator=generator,
        )

    research = [noisy_mean_loss(losses, 1.0, 1.0, 10.0, _gen(5)) for _ in range(2)]
    assert research[0] == research[1]
    secure = {noisy_mean_loss(losses, 1.0, 1.0, 10.0, SecureGenerator()) for _ in range(3)}
    assert len(secure) == 3
    g = SecureGenerator()
    before = g.get_state()
    noisy_mean_loss(losses, 1.0, 1.0, 10.0, g)
    assert torch.equal(g.get_state(), before)  # drawn from os.urandom, not the torch state
