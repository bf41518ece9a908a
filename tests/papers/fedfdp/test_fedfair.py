"""FedFair (Algorithm 1): the fairness-scaled local step and the server's loss average."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raydpfl.algorithms.base import ClientResult, ClientTask
from raydpfl.papers.fedfdp.fedfair import FedFair, aggregate_losses, fair_lr_factor
from raydpfl.papers.fedfdp.pfl_base import batch_loss_and_grad
from tests.papers.fedfdp.fedfdp_helpers import ctx, params_of, tiny_data, tiny_model


def _algo(**kw) -> FedFair:
    args = dict(
        lam=0.5, clients_per_round=2, lr=0.3, local_steps=2, batch_size=40, local_mode="steps"
    )
    return FedFair(**{**args, **kw})


def test_fair_factor_is_one_plus_lambda_delta():
    assert fair_lr_factor(2.0, 1.5, 0.4) == pytest.approx(1.2)
    assert fair_lr_factor(1.0, 1.5, 4.0) == pytest.approx(-1.0)  # an ascent step (Eq. 9)
    assert fair_lr_factor(float("inf"), 1.0, 0.0) == 1.0


def test_local_step_is_sgd_with_the_dynamic_learning_rate_and_uploads_the_loss():
    model, data = tiny_model(), tiny_data()
    task = ClientTask(
        client_id=0,
        round_idx=0,
        local_steps=2,
        lr=0.3,
        batch_size=40,
        extras={"lam": 0.5, "global_loss": 0.4},
    )
    res = _algo().local_update(ctx(model), params_of(model), data, task)
    w0 = params_of(model)
    w = {k: v.clone() for k, v in w0.items()}
    for _ in range(2):  # batch = all 40 records
        loss, g = batch_loss_and_grad(model, w, data.records()[0], data.records()[1])
        w = {k: w[k] - 0.3 * (1 + 0.5 * (loss - 0.4)) * g[k] for k in w}
    for k in w:
        torch.testing.assert_close(res.update[k], w[k] - w0[k])
    with torch.no_grad():
        final = torch.nn.functional.cross_entropy(
            torch.func.functional_call(model, w, (data.records()[0],)), data.records()[1]
        )
    assert res.metrics["uploaded_loss"] == pytest.approx(float(final), rel=1e-5)


def test_server_averages_models_and_losses_with_data_weights():
    algo = _algo(initial_global_loss=0.0)
    assert algo.plan(0, [0], np.array([5]))[0].extras["global_loss"] == 0.0
    w = {"a": torch.tensor([0.0])}
    results = [
        ClientResult(0, {"a": torch.tensor([1.0])}, 1.0, 1, {"uploaded_loss": 1.0}),
        ClientResult(1, {"a": torch.tensor([5.0])}, 3.0, 3, {"uploaded_loss": 3.0}),
    ]
    new = algo.aggregate(w, [], results)
    assert new["a"].item() == pytest.approx(4.0)
    assert algo.global_loss == pytest.approx(2.5) == aggregate_losses([1.0, 3.0], [1.0, 3.0])
    out = algo.after_round(0, {})
    assert out["fedfair_psi_uploaded"] == pytest.approx(0.75)
    assert algo.plan(1, [0], np.array([5]))[0].extras["global_loss"] == pytest.approx(2.5)


def test_lambda_zero_is_fedavg_sgd():
    model, data = tiny_model(), tiny_data()
    task = ClientTask(
        client_id=0,
        round_idx=0,
        local_steps=2,
        lr=0.3,
        batch_size=40,
        extras={"lam": 0.0, "global_loss": 9.0},
    )
    a = _algo(lam=0.0).local_update(ctx(model, 1), params_of(model), data, task).update
    from raydpfl.algorithms.fedavg import FedAvg

    b = (
        FedAvg(clients_per_round=1, local_steps=2, lr=0.3, batch_size=40)
        .local_update(ctx(model, 1), params_of(model), data, task)
        .update
    )
    for k in a:
        torch.testing.assert_close(a[k], b[k])
