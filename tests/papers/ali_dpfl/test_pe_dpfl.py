"""PE-DPFL: the regularised local gradient, the upload's clip and noise, the round caps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raydpfl.algorithms.base import ClientContext, ClientData, ClientResult, ClientTask
from raydpfl.models import build_model
from raydpfl.papers.ali_dpfl.pe_dpfl import (
    SENSITIVITY_FACTOR,
    PeDpfl,
    calibrate_noise_multiplier,
    classifier_names,
)
from raydpfl.privacy.accounting.accountants import compute_epsilon
from raydpfl.privacy.accounting.ledger import PrivacyCost, PrivacyLedger
from raydpfl.privacy.mechanisms.kernel import GaussianRelease, uses
from raydpfl.privacy.per_sample.engines import make_engine


def _algo(**kw) -> PeDpfl:
    args = dict(
        clients_per_round=2,
        rounds_budget=1000,
        local_steps=1,
        lr=0.3,
        sampling_rate=1.0,
        update_clip_norm=1e6,
        noise_multiplier=2.0,
        epsilon=2.0,
        delta=1e-5,
        reg_weight=0.5,
        perturbation_std=0.4,
    )
    args.update(kw)
    return PeDpfl(**args)


def _problem(n_features=4, n_classes=3, n=6, seed=0):
    torch.manual_seed(seed)
    model = build_model("logreg", (n_features,), n_classes)
    model.requires_grad_(False)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x = torch.randn(n, n_features)
    y = torch.randint(0, n_classes, (n,))
    data = ClientData(0, x, y, torch.arange(n))
    return model, params, data


def _ctx(model, seed=7) -> ClientContext:
    gen = torch.Generator().manual_seed(seed)
    return ClientContext(model, make_engine(model), gen, torch.device("cpu"))


def _task(algo: PeDpfl, *, clip: float, noise: float, lr: float | None = None) -> ClientTask:
    return ClientTask(
        client_id=0,
        round_idx=0,
        local_steps=algo.local_steps,
        lr=algo.lr if lr is None else lr,
        mechanisms=(uses(GaussianRelease(noise, SENSITIVITY_FACTOR * clip), 1),),
    )


def _ce_grads(w, b, x, y):
    """Closed-form ∇ of the mean cross-entropy of softmax regression."""
    p = torch.softmax(x @ w.T + b, dim=1)
    r = p - torch.nn.functional.one_hot(y, w.shape[0]).to(p.dtype)
    return r.T @ x / x.shape[0], r.mean(0)


def test_classifier_is_the_last_parametrised_module():
    assert classifier_names({"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 0, "fc2.bias": 0}) == [
        "fc2.weight",
        "fc2.bias",
    ]
    assert classifier_names({"net.0.weight": 0, "net.2.weight": 0, "net.2.bias": 0}) == [
        "net.2.weight",
        "net.2.bias",
    ]


def test_local_step_follows_the_regularised_gradient_formula():
    algo = _algo()
    model, params, data = _problem()
    w0, b0 = params["linear.weight"].clone(), params["linear.bias"].clone()

    result = algo.local_update(_ctx(model), params, data, _task(algo, clip=1e6, noise=0.0))

    # Replay the client's stream: the Poisson draw (q = 1 keeps every record), then ξ.
    gen = torch.Generator().manual_seed(7)
    torch.rand(data.num_examples, generator=gen)
    xi_w = torch.randn(w0.shape, generator=gen)
    xi_b = torch.randn(b0.shape, generator=gen)
    lam, s = algo.reg_weight, algo.perturbation_std
    gw, gb = _ce_grads(w0, b0, data.records()[0], data.records()[1])
    pw, pb = _ce_grads(w0 + s * xi_w, b0 + s * xi_b, data.records()[0], data.records()[1])
    # ∇J = (1 − λ)∇ℓ(w) + λ∇ℓ(w_cls + ξ); one step of η.
    expect_w = -algo.lr * ((1 - lam) * gw + lam * pw)
    expect_b = -algo.lr * ((1 - lam) * gb + lam * pb)
    torch.testing.assert_close(result.update["linear.weight"], expect_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(result.update["linear.bias"], expect_b, atol=1e-6, rtol=1e-5)
    # The regulariser really moved the step away from plain SGD.
    assert not torch.allclose(expect_w, -algo.lr * gw, atol=1e-4)


def test_without_the_regulariser_the_step_is_plain_sgd():
    algo = _algo(reg_weight=0.0)
    model, params, data = _problem()
    w0, b0 = params["linear.weight"].clone(), params["linear.bias"].clone()

    result = algo.local_update(_ctx(model), params, data, _task(algo, clip=1e6, noise=0.0))

    gw, _ = _ce_grads(w0, b0, data.records()[0], data.records()[1])
    torch.testing.assert_close(result.update["linear.weight"], -algo.lr * gw, atol=1e-6, rtol=0)


def test_upload_is_clipped_to_the_bound():
    algo = _algo(lr=50.0, local_steps=3)
    model, params, data = _problem()

    result = algo.local_update(_ctx(model), params, data, _task(algo, clip=0.25, noise=0.0))

    norm = math.sqrt(sum(float(t.pow(2).sum()) for t in result.update.values()))
    assert norm == pytest.approx(0.25, rel=1e-5)


def test_upload_noise_has_std_twice_the_clip_times_z():
    algo = _algo()
    model, params, data = _problem(n_features=200, n_classes=10, n=20)
    z, clip = 0.7, 0.5

    # lr = 0: the update is the noise alone.
    result = algo.local_update(_ctx(model), params, data, _task(algo, clip=clip, noise=z, lr=0.0))

    noise = torch.cat([t.flatten() for t in result.update.values()])
    assert noise.numel() == 2010
    assert float(noise.std()) == pytest.approx(2 * z * clip, rel=0.07)  # sensitivity 2S
    assert abs(float(noise.mean())) < 0.1


def test_default_perturbation_is_the_aggregate_noise_std():
    algo = _algo(perturbation_std=None, clients_per_round=4, update_clip_norm=0.5)
    assert algo.noise_std == pytest.approx(2 * 2.0 * 0.5)
    assert algo.perturbation_std == pytest.approx(2.0 / 2)


def _drive(algo: PeDpfl, ledger: PrivacyLedger, num_clients: int = 3) -> int:
    """Runs the server half until it stops; every task is charged like the server does."""
    rng = np.random.default_rng(0)
    params = {"w": torch.zeros(2)}
    rounds = 0
    while algo.stop_reason() is None:
        cohort = algo.select(rounds, num_clients, rng)
        tasks = algo.plan(rounds, cohort, np.full(num_clients, 10))
        for t in tasks:
            assert t.privacy_cost == PrivacyCost(algo.noise_multiplier, 1.0, 1)
            ledger.charge(t.client_id, t.privacy_cost)  # raises if over budget
        results = [
            ClientResult(c, {"w": torch.ones(2)}, weight=10.0, num_examples=10) for c in cohort
        ]
        params = algo.aggregate(params, tasks, results)
        rounds += 1
    return rounds


def test_rounds_stop_when_the_next_round_would_exceed_the_budget():
    eps, delta, z = 3.0, 1e-5, 3.0
    algo = _algo(noise_multiplier=z, epsilon=eps, delta=delta, clients_per_round=3)
    ledger = PrivacyLedger("rdp", delta, eps)

    rounds = _drive(algo, ledger)

    assert rounds == algo.budget_rounds > 1
    assert "privacy budget" in algo.stop_reason()
    # Every client took part in every round: its ε is within the budget, one more is not.
    assert ledger.max_epsilon() <= eps
    assert compute_epsilon([(z, 1.0, rounds)], delta, "rdp") <= eps
    assert compute_epsilon([(z, 1.0, rounds + 1)], delta, "rdp") > eps
    assert ledger.would_exceed(0, algo.round_cost)


def test_rounds_budget_caps_first_when_it_is_smaller():
    algo = _algo(rounds_budget=2, noise_multiplier=3.0, epsilon=3.0)
    ledger = PrivacyLedger("rdp", 1e-5, 3.0)

    assert _drive(algo, ledger) == 2
    assert algo.stop_reason().startswith("R_s exhausted")


def test_calibrated_noise_makes_exactly_that_many_rounds_affordable():
    z = calibrate_noise_multiplier(2.0, 1e-5, 25)
    algo = _algo(noise_multiplier=z, epsilon=2.0)

    assert algo.budget_rounds == 25


def test_pe_dpfl_runs_from_a_config_and_stops_on_its_own_budget():
    from raydpfl.experiment.build import build_experiment, run_experiment
    from tests.conftest import small_config

    config = small_config(
        experiment__algorithm={"name": "pe_dpfl", "rounds": 50, "clients_per_round": 4},
        experiment__privacy={"epsilon": 8.0, "noise_multiplier": 1.0},
    )
    exp = build_experiment(config)
    summary = run_experiment(exp, None)
    assert summary["rounds_completed"] < 50  # z = 1 affords only a few full-batch releases
    assert "privacy budget" in summary["stop_reason"]
    assert summary["epsilon_max"] <= 8.0
