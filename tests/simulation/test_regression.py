"""Linear regression end to end (DPFL-BCS's convex case on the offline diabetes stand-in):
the MSE client step, MSE evaluation without an accuracy, the config's task checks."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raydpfl.algorithms.base import ClientContext, ClientData
from raydpfl.config import ConfigError, config_from_dict, load_config
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.models import build_model
from raydpfl.papers.dpfl_bcs.algorithm import DpflBcs
from raydpfl.papers.dpfl_bcs.calibration import stage1_sensitivity
from raydpfl.simulation.evaluation import evaluate
from tests.conftest import with_release_scale
from tests.papers.dpfl_bcs.dpfl_bcs_helpers import bcs_config

ROOT = Path(__file__).resolve().parents[2]


def _algo(**kw) -> DpflBcs:
    args = dict(
        clients_per_round=2,
        rounds=10,
        lr=0.1,
        lr_decay_tau=200.0,
        clip_norm=1.0,
        mechanism="gaussian",
        epsilons=[1.0] * 4,
        deltas=[1e-5] * 4,
        train_sizes=[30] * 4,
        num_params=11,
        selection="uniform",
        regression=True,
        loss_bound=8.0,
    )
    args.update(kw)
    return DpflBcs(**args)


def _data(n: int = 30):
    torch.manual_seed(0)
    model = build_model("bcs_linreg", (10,), 1)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x = torch.randn(n, 10)
    y = x @ torch.linspace(-1, 1, 10) + 0.1 * torch.randn(n)
    return model, params, ClientData(0, x, y, torch.arange(n))


def _ctx(model) -> ClientContext:
    return ClientContext(model, None, torch.Generator().manual_seed(0), torch.device("cpu"))


def test_the_client_step_is_the_mse_gradient():
    model, params, data = _data()
    x, y = data.records()
    w, b = params["linear.weight"], params["linear.bias"]
    residual = x @ w[0] + b - y
    grad_w, grad_b = 2 * residual @ x / len(y), 2 * residual.mean()  # ∇ mean (w·x + b − y)²
    a = _algo(mechanism="none")  # plain full-batch step, as FedSGD
    task = a.plan(0, [0], a.sizes)[0]
    res = a.local_update(_ctx(model), dict(params), data, task)
    torch.testing.assert_close(res.update["linear.weight"][0], -task.lr * grad_w)
    torch.testing.assert_close(res.update["linear.bias"][0], -task.lr * grad_b)
    # Private: per-sample MSE gradients clipped to B = 1, so the step is at most ηB.
    dp = _algo()
    planned = dp.plan(0, [0], dp.sizes)[0]
    # a stage-1 release (with the loss reports): the sensitivity of Eq. 13
    stage1 = stage1_sensitivity(planned.lr, 1.0, 8.0, 30)
    task = dataclasses.replace(
        with_release_scale(planned, 0.0, sensitivity=stage1), extras={"stage1": 1.0}
    )
    res = dp.local_update(_ctx(model), dict(params), data, task)
    step = torch.cat([t.reshape(-1) for t in res.update.values()])
    assert float(step.norm()) <= task.lr * 1.0 * (1 + 1e-5)
    # Stage-1 loss reports are the mean squared error clipped at Θ.
    mse = float(((x @ w[0] + b - y) ** 2).clamp(max=8.0).mean())
    assert res.metrics["loss_before"] == pytest.approx(mse, rel=1e-5)


def test_evaluation_reports_mse_and_no_accuracy_for_float_targets():
    model, params, data = _data()
    out = evaluate(model, params, data.records()[0], data.records()[1])
    pred = data.records()[0] @ params["linear.weight"][0] + params["linear.bias"][0]
    assert out.regression and math.isnan(out.accuracy)
    assert out.loss == pytest.approx(float(((pred - data.records()[1]) ** 2).mean()), rel=1e-5)
    # Classification is unchanged: cross-entropy and accuracy.
    clf = build_model("bcs_linear", (10,), 3)
    cparams = dict(clf.named_parameters())
    labels = torch.randint(0, 3, (30,))
    res = evaluate(clf, cparams, data.records()[0], labels)
    with torch.no_grad():
        logits = clf(data.records()[0])
    assert not res.regression
    assert res.loss == pytest.approx(float(F.cross_entropy(logits, labels)), rel=1e-6)
    assert res.accuracy == pytest.approx(float((logits.argmax(1) == labels).float().mean()))


def _config(name: str, rounds: int = 8, **bcs) -> dict:
    return bcs_config(
        name,
        experiment__name="regression-test",
        experiment__data__dataset="diabetes",
        experiment__data__partition__min_samples_per_client=10,
        experiment__model__name="bcs_linreg",
        experiment__algorithm__rounds=rounds,
        experiment__algorithm__lr=0.1,
        experiment__algorithm__eval_every=1,
        experiment__algorithm__dpfl_bcs={"epsilon_min": 0.5, "epsilon_max": 4.0, **bcs},
        experiment__privacy__clip_norm=1.0,
    )


def test_fedsgd_lowers_the_test_mse_and_reports_no_accuracy():
    exp = build_experiment(config_from_dict(_config("bcs_fedsgd", rounds=10)))
    test = exp.dataset
    init = evaluate(
        exp.model_spec.build(),
        exp.init_params,
        torch.as_tensor(test.x_test),
        torch.as_tensor(test.y_test),
    )
    rows: list[dict] = []
    summary = run_experiment(exp, None, on_round=rows.append)
    mses = [r["test_loss"] for r in rows]
    assert mses[-1] < 0.7 * init.loss  # the linear model learns
    assert mses[-1] < 0.6  # near least squares on diabetes (test MSE ≈ 0.48)
    assert all(math.isnan(r["test_accuracy"]) for r in rows)
    assert summary["final_test_accuracy"] is None and summary["best_test_accuracy"] is None
    assert "regression" in summary["privacy"]["task"]


@pytest.mark.parametrize(
    ("name", "mechanism"), [("dpfl_bcs", "gaussian"), ("bcs_dmldp", "laplace")]
)
def test_dp_regression_runs_stay_within_every_clients_budget(name, mechanism):
    exp = build_experiment(config_from_dict(_config(name, mechanism=mechanism)))
    summary = run_experiment(exp, None)
    a, ledger = exp.algorithm, exp.ledger
    assert a.regression and a.loss_bound == 8.0
    assert summary["rounds_completed"] == 8 and a.total_counts.sum() > 0
    for c in range(a.n):
        assert ledger.epsilon(c) <= a.eps[c]
        assert ledger.steps(c) == a.total_counts[c]
    assert summary["final_test_accuracy"] is None


@pytest.mark.parametrize(
    ("dataset", "model", "algorithm", "field"),
    [
        ("digits", "bcs_linreg", "dpfl_bcs", "experiment.model.name"),
        ("diabetes", "bcs_linear", "dpfl_bcs", "experiment.model.name"),
        ("diabetes", "bcs_mnist_cnn", "bcs_fedsgd", "experiment.model.name"),
        ("diabetes", "bcs_linreg", "fedavg", "experiment.algorithm.name"),
    ],
)
def test_config_refuses_a_model_or_algorithm_of_the_other_task(dataset, model, algorithm, field):
    cfg = _config(algorithm)
    cfg["experiment"]["data"]["dataset"] = dataset
    cfg["experiment"]["model"]["name"] = model
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as err:
        config_from_dict(cfg)
    assert err.value.field == field


def test_privatefl_on_regression_reports_pooled_mse_and_no_accuracy():
    # Personalised runs pool per-client figures on the server; they must stay MSE.
    cfg = _config("bcs_privatefl")
    cfg["experiment"]["data"]["client_test_fraction"] = 0.2
    rows: list[dict] = []
    summary = run_experiment(build_experiment(config_from_dict(cfg)), None, on_round=rows.append)
    evaluated = [r for r in rows if "test_loss" in r]
    assert evaluated and all(math.isnan(r["test_accuracy"]) for r in evaluated)
    assert all(np.isfinite(r["test_loss"]) and r["test_loss"] > 0 for r in evaluated)
    assert summary["final_test_accuracy"] is None and summary["best_test_accuracy"] is None


def test_diabetes_preset_validates_and_builds():
    config = load_config(ROOT / "configs" / "dpfl_bcs" / "diabetes_linear_gm.yaml")
    exp = build_experiment(config)
    assert (
        exp.algorithm.regression and exp.dataset.num_clients == config.experiment.data.num_clients
    )
    assert np.all(exp.dataset.train_sizes() >= 10)
