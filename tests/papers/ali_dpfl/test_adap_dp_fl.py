"""Adap DP-FL: adaptive clip bounds, the σ schedule, the noisy loss query, the ε stop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raydpfl.algorithms.base import ClientContext, ClientData, ClientResult, ClientTask
from raydpfl.models import build_model
from raydpfl.papers.ali_dpfl.adap_dp_fl import (
    DP_LOSS,
    AdapDpFl,
    adaptive_clip_norm,
    loss_decreased,
)
from raydpfl.privacy.accounting.accountants import compute_epsilon
from raydpfl.privacy.accounting.ledger import PrivacyCost, PrivacyLedger
from raydpfl.privacy.per_sample.engines import make_engine


def _algo(**kw) -> AdapDpFl:
    args = dict(
        clients_per_round=2,
        rounds_budget=1000,
        local_steps=3,
        lr=0.5,
        sampling_rate=0.2,
        clip_norm=1.0,
        noise_multiplier=1.5,
        noise_decay=0.8,
        epsilon=3.0,
        delta=1e-5,
        num_params=10,
        loss_source="metric",
        loss_key="val_loss",
    )
    args.update(kw)
    return AdapDpFl(**args)


def _result(cid: int, norm: float, sq_norm: float | None = None, n: int = 50) -> ClientResult:
    return ClientResult(
        client_id=cid,
        update={"w": torch.zeros(2)},
        weight=float(n),
        num_examples=n,
        metrics={
            "noisy_grad_norm": norm,
            "noisy_grad_sq_norm": norm**2 if sq_norm is None else sq_norm,
        },
    )


def _round(algo, round_idx, cohort, norms, loss=None, dp_losses=None):
    """One server round with scripted client statistics; returns (tasks, after_round)."""
    tasks = algo.plan(round_idx, cohort, np.full(4, 50))
    results = [_result(c, norms[c]) for c in cohort]
    new = algo.aggregate({"w": torch.zeros(2)}, tasks, results)
    follow = algo.followup_tasks(round_idx, tasks, results, new)
    replies = []
    if dp_losses is not None:
        replies = [ClientResult(t.client_id, {}, 50.0, 50, {"dp_loss": dp_losses}) for t in follow]
    metrics = {} if loss is None else {"val_loss": loss}
    return tasks, follow, algo.after_round(round_idx, metrics, replies)


def test_loss_decreased_needs_patience_strict_decreases():
    assert loss_decreased([5, 4, 3, 2, 1], 4)
    assert not loss_decreased([4, 3, 2, 1], 4)  # only 3 decreases
    assert not loss_decreased([5, 4, 4, 2, 1], 4)  # a tie breaks the run
    assert loss_decreased([9, 1, 5, 4, 3, 2, 1], 4)  # only the last window counts


def test_sigma_decays_only_after_patience_consecutive_decreases():
    algo = _algo(patience=4, noise_decay=0.8)
    losses = [5.0, 4.0, 3.0, 2.0, 1.0, 0.9, 1.5, 1.4, 1.3, 1.2, 1.1]
    # Decreases complete a window of 4 at the 5th loss, again at the 6th (sliding), then
    # the rise at the 7th needs 4 fresh decreases (the 11th loss).
    expect_next = [1.5, 1.5, 1.5, 1.5, 1.2, 0.96, 0.96, 0.96, 0.96, 0.96, 0.768]
    used, nxt = [], []
    for k, loss in enumerate(losses):
        tasks, _, out = _round(algo, k, [0, 1], {0: 1.0, 1: 1.0}, loss=loss)
        used.append(tasks[0].noise_multiplier)
        assert tasks[0].privacy_cost.noise_multiplier == tasks[0].noise_multiplier
        nxt.append(out["noise_multiplier_next"])
    np.testing.assert_allclose(nxt, expect_next, rtol=1e-12)
    np.testing.assert_allclose(used, [1.5, *expect_next[:-1]], rtol=1e-12)


def test_sigma_floor_and_missing_loss():
    algo = _algo(patience=1, noise_decay=0.5, min_noise_multiplier=1.0)
    for k, loss in enumerate([3.0, 2.0, 1.0, float("nan"), 0.5]):
        _round(algo, k, [0], {0: 1.0}, loss=loss)
    assert algo.sigma == 1.0  # 1.5 → 0.75 floored to 1.0
    assert algo.losses == [3.0, 2.0, 1.0, 0.5]  # NaN is not recorded


def test_clip_bound_is_per_client_and_follows_last_rounds_noisy_norm():
    algo = _algo(clip_factor=0.5)
    # Round 1: clients 0, 1 start at C = 1; they report noisy-gradient norms 4 and 0.6.
    tasks, _, out = _round(algo, 0, [0, 1], {0: 4.0, 1: 0.6})
    assert [t.clip_norm for t in tasks] == [1.0, 1.0]
    assert out["clip_norm_mean"] == 1.0
    # Round 2: C_k = α·s_k for the returning clients; client 2 is new and starts at C.
    tasks, _, _ = _round(algo, 1, [1, 2], {1: 0.2, 2: 3.0})
    assert [t.clip_norm for t in tasks] == pytest.approx([0.3, 1.0])
    # Round 3: client 0 skipped round 2 and keeps its bound from round 1.
    tasks, _, _ = _round(algo, 2, [0, 1, 2], {0: 1.0, 1: 1.0, 2: 1.0})
    assert [t.clip_norm for t in tasks] == pytest.approx([2.0, 0.1, 1.5])


def test_debiased_clip_estimate_and_clamps():
    kw = dict(clip_norm=2.0, noise_multiplier=1.0, expected_batch=10.0, num_params=25)
    noise_sq = 25 * (1.0 * 2.0 / 10.0) ** 2  # d(σC/(q|D|))² = 1
    assert adaptive_clip_norm(
        mean_noisy_norm=9.0, mean_noisy_sq_norm=noise_sq + 0.49, estimator="debiased", **kw
    ) == pytest.approx(0.7)
    assert adaptive_clip_norm(mean_noisy_norm=9.0, mean_noisy_sq_norm=0.0, **kw) == 9.0
    assert (
        adaptive_clip_norm(mean_noisy_norm=9.0, mean_noisy_sq_norm=0.0, clip_max=3.0, **kw) == 3.0
    )
    # All noise: the debiased norm is 0 → keep the old bound, unless clip_min floors it.
    assert (
        adaptive_clip_norm(mean_noisy_norm=1.0, mean_noisy_sq_norm=0.5, estimator="debiased", **kw)
        is None
    )
    assert adaptive_clip_norm(
        mean_noisy_norm=1.0, mean_noisy_sq_norm=0.5, estimator="debiased", clip_min=0.1, **kw
    ) == pytest.approx(0.1)


def _client(n_features=3, n_classes=2, n=40, seed=0):
    torch.manual_seed(seed)
    model = build_model("logreg", (n_features,), n_classes)
    model.requires_grad_(False)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x = torch.randn(n, n_features) * 3
    y = torch.randint(0, n_classes, (n,))
    return model, params, ClientData(0, x, y, torch.arange(n))


def _ctx(model, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return ClientContext(model, make_engine(model), gen, torch.device("cpu"))


def test_client_reports_the_noisy_gradient_norms_of_its_steps():
    algo = _algo(lr=0.1, sampling_rate=1.0)
    model, params, data = _client()
    start = {k: v.clone() for k, v in params.items()}
    task = ClientTask.dp_sgd(
        0, 0, local_steps=3, lr=0.1, sampling_rate=1.0, clip_norm=0.05, noise_multiplier=0.0
    )

    # σ = 0 and q = 1: each step's noisy gradient is the mean of clipped gradients; all
    # per-sample norms exceed C = 0.05, so each has norm ≤ C.
    result = algo.local_update(_ctx(model), params, data, task)

    s = result.metrics["noisy_grad_norm"]
    assert 0 < s <= 0.05 + 1e-6
    assert result.metrics["noisy_grad_sq_norm"] >= s**2 - 1e-12
    total = math.sqrt(sum(float((params[k] - start[k]).pow(2).sum()) for k in params))
    assert float(result.update["linear.weight"].norm()) > 0
    assert total <= 3 * 0.1 * s + 1e-6  # ‖Δ‖ ≤ η·Σ‖g̃_s‖


def test_dp_loss_query_is_the_clipped_mean_loss_plus_scaled_noise():
    model, params, data = _client()
    task = ClientTask.dp_sgd(
        0,
        0,
        local_steps=0,
        lr=0.0,
        invocations=1,  # one loss query
        sampling_rate=1.0,
        clip_norm=0.3,
        kind=DP_LOSS,
        noise_multiplier=0.0,
    )
    algo = _algo()
    logits = data.records()[0] @ params["linear.weight"].T + params["linear.bias"]
    per = torch.nn.functional.cross_entropy(logits, data.records()[1], reduction="none")

    clean = algo.local_update(_ctx(model), params, data, task).metrics["dp_loss"]
    assert clean == pytest.approx(float(per.clamp(max=0.3).mean()), rel=1e-5)

    noisy_task = ClientTask.dp_sgd(
        0,
        0,
        local_steps=0,
        lr=0.0,
        invocations=1,
        sampling_rate=1.0,
        clip_norm=0.3,
        noise_multiplier=2.0,
        kind=DP_LOSS,
    )
    noisy = algo.local_update(_ctx(model, seed=5), params, data, noisy_task).metrics["dp_loss"]
    # Replay the stream: the Poisson draw (q = 1 keeps every record), then the noise.
    gen = torch.Generator().manual_seed(5)
    torch.rand(data.num_examples, generator=gen)
    xi = float(torch.randn((), generator=gen))
    # noise std σ_ℓ·L on the sum, divided by q_ℓ·|D| = 40
    assert noisy == pytest.approx(clean + 2.0 * 0.3 * xi / 40, rel=1e-5)
    assert noisy != pytest.approx(clean, abs=1e-6)


def test_dp_followup_is_charged_and_drives_the_schedule():
    algo = _algo(loss_source="dp_followup", patience=1, loss_sampling_rate=0.5)
    algo.loss_noise_multiplier = 4.0
    _, follow, out = _round(algo, 0, [0, 1], {0: 1.0, 1: 1.0}, dp_losses=2.0)
    assert [t.kind for t in follow] == [DP_LOSS, DP_LOSS]
    assert follow[0].privacy_cost == PrivacyCost(4.0, 0.5, 1)
    assert out["schedule_loss"] == 2.0 and algo.sigma == 1.5
    _, _, out = _round(algo, 1, [0, 1], {0: 1.0, 1: 1.0}, dp_losses=1.0)
    assert algo.sigma == pytest.approx(1.2)
    assert algo.history == [(1.5, 0.2, 3), (4.0, 0.5, 1), (1.5, 0.2, 3), (4.0, 0.5, 1)]


def _drive(algo: AdapDpFl, ledger: PrivacyLedger, loss_source: str) -> int:
    """Runs the server half until it stops, charging every task before 'dispatch' like the
    server does; the loss falls every round, so σ keeps decaying."""
    rng = np.random.default_rng(0)
    k = 0
    while algo.stop_reason() is None:
        cohort = algo.select(k, 4, rng)
        tasks = algo.plan(k, cohort, np.full(4, 50))
        for t in tasks:
            ledger.charge(t.client_id, t.privacy_cost)  # raises if over budget
        results = [_result(c, 1.0) for c in cohort]
        new = algo.aggregate({"w": torch.zeros(2)}, tasks, results)
        follow = algo.followup_tasks(k, tasks, results, new)
        for t in follow:
            ledger.charge(t.client_id, t.privacy_cost)
        replies = [ClientResult(t.client_id, {}, 50.0, 50, {"dp_loss": 10.0 - k}) for t in follow]
        algo.after_round(k, {"val_loss": 10.0 - k}, replies)
        k += 1
    return k


@pytest.mark.parametrize("loss_source", ["metric", "dp_followup"])
def test_varying_sigma_composes_within_budget_and_stops_at_it(loss_source):
    eps, delta = 2.0, 1e-5
    algo = _algo(
        clients_per_round=4,
        epsilon=eps,
        delta=delta,
        noise_multiplier=2.0,
        noise_decay=0.85,
        patience=2,
        sampling_rate=0.05,
        loss_source=loss_source,
    )
    ledger = PrivacyLedger("rdp", delta, eps)

    rounds = _drive(algo, ledger, loss_source)

    assert rounds > 3
    assert "privacy budget" in algo.stop_reason()
    sigmas = [c.noise_multiplier for c in ledger.history(0) if c.steps == 3]
    assert len(set(sigmas)) > 2 and sigmas == sorted(sigmas, reverse=True)  # σ decayed
    # The ledger composed the varying σ: every client is within ε, and the next round's
    # training cost at the current σ would exceed it.
    assert ledger.max_epsilon() <= eps
    assert ledger.max_epsilon() == pytest.approx(algo.epsilon_with(), rel=1e-12)
    next_round = PrivacyCost(algo.sigma, algo.sampling_rate, algo.local_steps)
    assert ledger.would_exceed(0, next_round)
    assert compute_epsilon([*algo.history, next_round.as_triple()], delta, "rdp") > eps
    if loss_source == "dp_followup":
        assert any(c.steps == 1 for c in ledger.history(0))


def test_no_loss_query_is_bought_when_no_round_could_use_it():
    # σ never decays here, so the run ends exactly when a round no longer fits; the loss
    # query of the last round would be wasted budget and must not be sent.
    algo = _algo(
        clients_per_round=4,
        epsilon=2.0,
        noise_multiplier=2.0,
        patience=1000,
        sampling_rate=0.05,
        loss_source="dp_followup",
    )
    ledger = PrivacyLedger("rdp", 1e-5, 2.0)

    rounds = _drive(algo, ledger, "dp_followup")

    kinds = [c.steps for c in ledger.history(0)]
    assert kinds == [3, 1] * (rounds - 1) + [3]


def test_adap_dp_fl_runs_from_a_config_and_needs_an_initial_sigma():
    import pytest

    from raydpfl.config import ConfigError
    from raydpfl.experiment.build import build_experiment, run_experiment
    from tests.conftest import small_config

    config = small_config(
        experiment__algorithm={"name": "adap_dp_fl", "rounds": 4, "clients_per_round": 4},
        experiment__privacy={"epsilon": 8.0, "noise_multiplier": 1.0},
    )
    summary = run_experiment(build_experiment(config), None)
    assert summary["rounds_completed"] == 4
    assert summary["epsilon_max"] <= 8.0
    with pytest.raises(ConfigError, match="noise_multiplier"):
        build_experiment(
            small_config(
                experiment__algorithm={"name": "adap_dp_fl"},
                experiment__privacy={"noise_multiplier": None},
            )
        )
