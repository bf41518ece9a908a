"""FedFDP's baselines: each defining update on a tiny problem (spec §8.3, §11 A16)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from raydpfl.algorithms.base import ClientResult, ClientTask
from raydpfl.algorithms.dp_fedavg import DPFedAvg
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.papers.fedfdp.feddyn import FedDyn
from raydpfl.papers.fedfdp.fedfair import weighted_variance
from raydpfl.papers.fedfdp.fedprox import DPFedProx, FedProx
from raydpfl.papers.fedfdp.options import NAMES
from raydpfl.papers.fedfdp.pfl_base import batch_loss_and_grad
from raydpfl.papers.fedfdp.qffl import QFFL, qffl_step
from raydpfl.papers.fedfdp.scaffold import Scaffold, scaffold_control_update
from tests.conftest import small_config
from tests.papers.fedfdp.fedfdp_helpers import ctx, params_of, tiny_data, tiny_model

COMMON = dict(clients_per_round=2, lr=0.5, local_steps=2, batch_size=40, local_mode="steps")


def _task(steps: int = 2, payload=None, **kw) -> ClientTask:
    return ClientTask(
        client_id=0, round_idx=0, local_steps=steps, lr=0.5, batch_size=40, payload=payload, **kw
    )


def _manual_sgd(model, data, steps, lr, extra):
    """Full-batch SGD by hand: w ← w − η(∇F(w) + extra(w, w0))."""
    w0 = params_of(model)
    w = {k: v.clone() for k, v in w0.items()}
    x, y = data.records()
    for _ in range(steps):
        _, g = batch_loss_and_grad(model, w, x, y)
        e = extra(w, w0)
        w = {k: w[k] - lr * (g[k] + e[k]) for k in w}
    return {k: w[k] - w0[k] for k in w}


def test_fedprox_adds_mu_times_the_distance_to_the_global_model():
    model, data = tiny_model(), tiny_data()
    algo = FedProx(mu=0.7, **COMMON)
    got = algo.local_update(ctx(model), params_of(model), data, _task()).update
    want = _manual_sgd(model, data, 2, 0.5, lambda w, w0: {k: 0.7 * (w[k] - w0[k]) for k in w})
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    # μ = 0 is plain SGD: the second step differs from FedProx's.
    plain = FedProx(mu=0.0, **COMMON).local_update(ctx(model), params_of(model), data, _task())
    assert not torch.allclose(plain.update["weight"], got["weight"])


def test_scaffold_client_step_uses_c_minus_c_i_and_the_server_updates_option_ii():
    model, data = tiny_model(), tiny_data()
    corr = {k: torch.full_like(v, 0.1) for k, v in params_of(model).items()}
    payload = {f"corr.{k}": v for k, v in corr.items()}
    algo = Scaffold(num_clients=4, global_lr=1.0, **COMMON)
    got = algo.local_update(ctx(model), params_of(model), data, _task(payload=payload)).update
    want = _manual_sgd(model, data, 2, 0.5, lambda w, w0: corr)
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    # Option II by hand: c_i+ = c_i − c − Δ/(Kη); c += (1/N) Σ Δc_i.
    c_i, c = {"a": torch.tensor([1.0])}, {"a": torch.tensor([0.5])}
    delta = {"a": torch.tensor([-2.0])}
    assert scaffold_control_update(c_i, c, delta, 4, 0.25)["a"].item() == pytest.approx(2.5)
    w = {"a": torch.tensor([0.0])}
    algo = Scaffold(num_clients=4, global_lr=2.0, **COMMON)
    tasks = [ClientTask(client_id=i, round_idx=0, local_steps=2, lr=0.5) for i in (0, 1)]
    results = [
        ClientResult(0, {"a": torch.tensor([1.0])}, 1.0, 1),
        ClientResult(1, {"a": torch.tensor([3.0])}, 3.0, 3),
    ]
    new = algo.aggregate(w, tasks, results)
    assert new["a"].item() == pytest.approx(2.0 * (0.25 * 1 + 0.75 * 3))  # w + η_g Σ p_i Δ_i
    assert algo.c_i[0]["a"].item() == pytest.approx(-1.0)  # 0 − 0 − 1/(2·0.5)
    assert algo.c_i[1]["a"].item() == pytest.approx(-3.0)
    assert algo.c["a"].item() == pytest.approx((-1.0 - 3.0) / 4)
    plan = algo.plan(1, [0], torch.tensor([10]).numpy())
    assert plan[0].payload["corr.a"].item() == pytest.approx(-1.0 - (-1.0))  # c − c_0


def test_feddyn_local_gradient_and_server_state():
    model, data = tiny_model(), tiny_data()
    h = {k: torch.full_like(v, 0.2) for k, v in params_of(model).items()}
    algo = FedDyn(alpha=0.3, num_clients=4, **COMMON)
    payload = {f"h.{k}": v for k, v in h.items()}
    got = algo.local_update(ctx(model), params_of(model), data, _task(payload=payload)).update
    want = _manual_sgd(
        model, data, 2, 0.5, lambda w, w0: {k: 0.3 * (w[k] - w0[k]) - h[k] for k in w}
    )
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    algo = FedDyn(alpha=0.5, num_clients=4, **COMMON)
    w = {"a": torch.tensor([1.0])}
    results = [
        ClientResult(0, {"a": torch.tensor([2.0])}, 1.0, 1),
        ClientResult(1, {"a": torch.tensor([4.0])}, 1.0, 1),
    ]
    new = algo.aggregate(w, [], results)
    # h = −(α/N)(2 + 4) = −0.75; w = 1 + mean Δ − h/α = 1 + 3 + 1.5
    assert algo.h["a"].item() == pytest.approx(-0.75)
    assert new["a"].item() == pytest.approx(5.5)
    assert algo.h_i[1]["a"].item() == pytest.approx(-0.5 * 4.0)


def test_qffl_step_by_hand_and_q_zero_is_the_uniform_mean():
    w = {"a": torch.tensor([1.0, 0.0])}
    deltas = [{"a": torch.tensor([0.5, 0.0])}, {"a": torch.tensor([0.0, -1.0])}]
    new = qffl_step(w, deltas, [2.0, 0.5], q=1.0, lr=0.5, eps=0.0)
    # L = 2: Δw_1 = (−1, 0), Δw_2 = (0, 2); h = ‖Δw‖² + L·F
    num = 2.0 * torch.tensor([-1.0, 0.0]) + 0.5 * torch.tensor([0.0, 2.0])
    den = (1.0 + 2 * 2.0) + (4.0 + 2 * 0.5)
    torch.testing.assert_close(new["a"], w["a"] - num / den)
    uniform = qffl_step(w, deltas, [2.0, 0.5], q=0.0, lr=0.5, eps=0.0)
    torch.testing.assert_close(uniform["a"], w["a"] + (deltas[0]["a"] + deltas[1]["a"]) / 2)
    # The non-private algorithm reads F_k(w_t) from the first batch's loss.
    algo = QFFL(qffl_q=1.0, **COMMON)
    results = [
        ClientResult(i, d, 1.0, 1, metrics={"first_batch_loss": f})
        for i, (d, f) in enumerate(zip(deltas, [2.0, 0.5], strict=True))
    ]
    torch.testing.assert_close(algo.aggregate(w, [], results)["a"], new["a"], atol=1e-6, rtol=0)


def test_dp_variants_with_no_correction_are_dp_sgd_bit_for_bit():
    model, data = tiny_model(), tiny_data(60)
    task = ClientTask.dp_sgd(
        client_id=0,
        round_idx=0,
        local_steps=3,
        lr=0.5,
        sampling_rate=0.3,
        clip_norm=0.5,
        noise_multiplier=1.0,
    )
    dp = DPFedAvg(
        clients_per_round=1,
        local_steps=3,
        lr=0.5,
        clip_norm=0.5,
        noise_multiplier=1.0,
        sampling_rate=0.3,
    )
    ref = dp.local_update(ctx(model, 3), params_of(model), data, task).update
    prox = DPFedProx(
        mu=0.0,
        clip_norm=0.5,
        noise_multiplier=1.0,
        **{**COMMON, "local_steps": 3, "sampling_rate": 0.3},
    )
    got = prox.local_update(ctx(model, 3), params_of(model), data, task).update
    for k in ref:
        assert torch.equal(ref[k], got[k])


def test_weighted_variance_by_hand():
    # p = (0.25, 0.75), mean = 0.25·1 + 0.75·3 = 2.5, Ψ = 0.25·2.25 + 0.75·0.25 = 0.75
    assert weighted_variance([1.0, 3.0], [1.0, 3.0]) == pytest.approx(0.75)
    assert weighted_variance([1.0, float("nan"), 3.0], [1.0, 5.0, 3.0]) == pytest.approx(0.75)


@pytest.mark.parametrize("name", NAMES)
def test_every_algorithm_runs_end_to_end_and_private_ones_charge_the_ledger(name):
    cfg = small_config(
        experiment__algorithm={
            "name": name,
            "rounds": 2,
            "local_steps": 1,
            "fedfdp": {"local_mode": "steps"},
        }
    )
    exp = build_experiment(cfg)
    summary = run_experiment(exp, None)
    assert summary["rounds_completed"] == 2
    assert summary["final_test_accuracy"] is not None
    assert summary["private"] == name.startswith(("dp_", "fedfdp"))
    if summary["private"]:
        assert summary["epsilon_max"] > 0


def test_first_batch_loss_is_the_loss_at_the_start_model():
    model, data = tiny_model(), tiny_data()
    res = QFFL(**COMMON).local_update(ctx(model), params_of(model), data, _task())
    want = float(F.cross_entropy(model(data.records()[0]), data.records()[1]).detach())
    assert res.metrics["first_batch_loss"] == pytest.approx(want, rel=1e-5)
