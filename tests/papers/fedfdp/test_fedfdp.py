"""FedFDP: fair clipping, the private loss upload, both mechanisms on the ledger, λ*."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from raydpfl.algorithms.base import ClientResult, ClientTask
from raydpfl.algorithms.dp_fedavg import DPFedAvg
from raydpfl.config import ConfigError
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.papers.fedfdp.accounting import max_rounds, max_rounds_paper
from raydpfl.papers.fedfdp.algorithm import FairClipRule, FedFDP
from raydpfl.papers.fedfdp.convergence import BoundConstants, DegenerateBoundWarning
from raydpfl.papers.fedfdp.loss_upload import LossUpload, release_loss
from raydpfl.privacy.accounting.accountants import compute_epsilon
from raydpfl.privacy.accounting.ledger import PrivacyCost
from raydpfl.privacy.per_sample.dpsgd import PerSampleGradients, per_sample_norms
from tests.conftest import small_config
from tests.papers.fedfdp.fedfdp_helpers import ctx, params_of, tiny_data, tiny_model


def _upload(**kw) -> LossUpload:
    args = dict(
        noise_multiplier=5.0,
        sampling_rate=0.5,
        clip_init=2.5,
        clip_floor=1e-3,
        clip_multiplier=1.0,
    )
    return LossUpload(**{**args, **kw})


def _fedfdp(**kw) -> FedFDP:
    args = dict(
        lam=0.0,
        loss_upload=_upload(),
        clients_per_round=1,
        lr=0.5,
        local_steps=2,
        sampling_rate=0.3,
        clip_norm=0.5,
        noise_multiplier=1.0,
    )
    return FedFDP(**{**args, **kw})


def _train_task(lam: float, global_loss: float, clip: float = 0.5) -> ClientTask:
    return ClientTask.dp_sgd(
        client_id=0,
        round_idx=0,
        local_steps=2,
        lr=0.5,
        sampling_rate=0.3,
        clip_norm=clip,
        noise_multiplier=1.0,
        extras={"lam": lam, "global_loss": global_loss},
    )


@pytest.mark.parametrize("mode", ["abs", "descent", "zero"])
@pytest.mark.parametrize("lam", [0.0, 0.5, 5.0, 100.0])
def test_fair_clip_factor_never_lets_a_sample_above_c_in_dp_modes(mode, lam):
    model, data = tiny_model(), tiny_data()
    params = params_of(model)
    engine = PerSampleGradients(model)
    grads, losses = engine._per_sample_grad_and_loss(params, data.records()[0], data.records()[1])
    clip = 0.05
    rule = FairClipRule(global_loss=3.0, lam=lam, clip_norm=clip, mode=mode)
    weights = rule(per_sample_norms(grads), losses)
    scaled = {k: g * weights.view(-1, *[1] * (g.dim() - 1)) for k, g in grads.items()}
    assert (per_sample_norms(scaled) <= clip).all()
    assert not rule.negative_weight
    if lam >= 5.0:  # F = 3 above every loss here: some fairness factors are negative
        assert rule.negative_scale > 0


def test_lambda_zero_is_dp_fedavg_bit_for_bit():
    model, data = tiny_model(), tiny_data(60)
    task = _train_task(0.0, 1.7)
    ref = DPFedAvg(
        clients_per_round=1,
        local_steps=2,
        lr=0.5,
        clip_norm=0.5,
        noise_multiplier=1.0,
        sampling_rate=0.3,
    )
    a = ref.local_update(ctx(model, 4), params_of(model), data, task).update
    b = _fedfdp().local_update(ctx(model, 4), params_of(model), data, task).update
    for k in a:
        assert torch.equal(a[k], b[k])


def test_paper_rule_marks_the_run_not_dp_when_a_weight_goes_negative():
    from raydpfl.algorithms.base import direct_context
    from raydpfl.privacy.mechanisms.kernel import UNBOUNDED_NOTE

    model, data = tiny_model(), tiny_data(60)
    algo = _fedfdp(clip_mode="paper")
    train = _train_task(50.0, 5.0)
    # the run-level opt-out the builder sets for clip_mode: paper (a worker reads it)
    paper_ctx = direct_context(
        model, data, train, torch.Generator().manual_seed(0), unbounded_weight_rules=True
    )
    res = algo.local_update(paper_ctx, params_of(model), data, train)
    assert res.metrics["negative_weight"] == 1.0
    assert UNBOUNDED_NOTE in paper_ctx.privacy.receipt().notes  # the platform lists it
    # without the opt-out the same rule is refused at its first step
    from raydpfl.privacy.per_sample.dpsgd import SensitivityError

    with pytest.raises(SensitivityError, match="FairClipRule"):
        algo.local_update(ctx(model), params_of(model), tiny_data(60), train)
    assert not any("NOT DIFFERENTIALLY" in s for s in algo.unaccounted_releases())
    task = ClientTask(client_id=0, round_idx=3, local_steps=2, lr=0.5)
    algo.aggregate(params_of(model), [task], [res])
    assert any("NOT DIFFERENTIALLY PRIVATE" in s for s in algo.unaccounted_releases())
    # The safe rule under the same λ never does.
    safe = _fedfdp().local_update(ctx(model), params_of(model), data, _train_task(50.0, 5.0))
    assert safe.metrics["negative_weight"] == 0.0


def test_paper_rule_needs_the_explicit_flag():
    with pytest.raises(ConfigError, match="clip_mode"):
        small_config(experiment__algorithm={"name": "fedfdp", "fedfdp": {"clip_mode": "paper"}})
    small_config(
        experiment__algorithm={
            "name": "fedfdp",
            "fedfdp": {"clip_mode": "paper", "allow_not_dp": True},
        }
    )


def _loss_task(clip: float, sigma: float, q: float = 1.0) -> ClientTask:
    return ClientTask.dp_sgd(
        client_id=0,
        round_idx=0,
        local_steps=0,
        lr=0.0,
        invocations=1,  # one loss query
        sampling_rate=q,
        noise_multiplier=sigma,
        kind="loss",
        clip_norm=clip,
    )


def test_loss_release_clips_to_the_bound_and_adds_gaussian_noise_sigma_l_c_l():
    model, data = tiny_model(), tiny_data(50)
    losses = torch.nn.functional.cross_entropy(
        model(data.records()[0]), data.records()[1], reduction="none"
    ).detach()
    clip = float(losses.median())
    # q = 1: the batch is every record; without noise the release is Σ min(ℓ, C_l) / |D|.
    r = release_loss(ctx(model), params_of(model), data, _loss_task(clip, 1e-12))
    assert r.metrics["noisy_loss"] == pytest.approx(float(losses.clamp(max=clip).mean()), rel=1e-5)
    assert r.metrics["noisy_loss"] <= clip
    assert r.metrics["raw_loss"] == pytest.approx(float(losses.mean()), rel=1e-5)
    # Noise: std σ_l·C_l / (q·|D|) over independent streams.
    draws = [
        release_loss(ctx(model, s), params_of(model), data, _loss_task(clip, 4.0)).metrics[
            "noisy_loss"
        ]
        for s in range(120)
    ]
    assert np.std(draws) == pytest.approx(4.0 * clip / 50, rel=0.25)
    assert np.mean(draws) == pytest.approx(float(losses.clamp(max=clip).mean()), abs=0.04)
    # The payload model (the client's local model) is used when present.
    shifted = {f"w.{k}": 3.0 * v for k, v in params_of(model).items()}
    task = _loss_task(100.0, 1e-12)
    task = ClientTask(**{**task.__dict__, "payload": shifted})
    r2 = release_loss(ctx(model), params_of(model), data, task)
    assert r2.metrics["raw_loss"] != pytest.approx(r.metrics["raw_loss"])


def test_adaptive_loss_bound_follows_the_release_with_a_floor():
    up = _upload(clip_floor=0.01, clip_multiplier=1.0)
    assert up.bound(3) == 2.5
    up.update(
        [
            ClientResult(3, {}, 1.0, 1, metrics={"noisy_loss": 1.2}),
            ClientResult(4, {}, 1.0, 1, metrics={"noisy_loss": -0.4}),
        ]
    )
    assert up.bound(3) == pytest.approx(1.2)
    assert up.bound(4) == pytest.approx(0.01)
    assert up.task(4, 0, None).privacy_cost == PrivacyCost(5.0, 0.5, 1)


def test_server_aggregates_released_losses_with_data_weights():
    algo = _fedfdp()
    followups = [
        ClientResult(0, {}, 1.0, 1, metrics={"noisy_loss": 1.0, "raw_loss": 1.0}),
        ClientResult(1, {}, 3.0, 3, metrics={"noisy_loss": 3.0, "raw_loss": 3.0}),
    ]
    out = algo.after_round(0, {}, followups)
    assert algo.global_loss == pytest.approx(2.5)
    assert out["fedfdp_psi_local_trainbatch"] == pytest.approx(0.75)
    assert algo.plan(1, [0], np.array([10]))[0].extras["global_loss"] == pytest.approx(2.5)


def _fedfdp_config(**fedfdp):
    return small_config(
        experiment__algorithm={
            "name": "fedfdp",
            "rounds": 50,
            "clients_per_round": 4,
            "local_steps": 2,
            "fedfdp": {"lam": 0.2, **fedfdp},
        },
        experiment__privacy={"epsilon": 4.0, "noise_multiplier": 1.5, "sampling_rate": 0.2},
        experiment__algorithm__eval_every=100,
        experiment__data__num_clients=4,
    )


def test_both_mechanisms_are_charged_and_the_budget_sets_the_rounds():
    exp = build_experiment(_fedfdp_config())
    t_full = max_rounds(
        4.0,
        1e-5,
        sampling_rate=0.2,
        noise_multiplier=1.5,
        loss_noise_multiplier=5.0,
        local_steps=2,
    )
    meta = exp.metadata["privacy"]
    assert meta["rounds_budget_full"] == t_full < 50
    assert meta["rounds_budget_paper_model_only"] == max_rounds_paper(
        4.0, 1e-5, sampling_rate=0.2, noise_multiplier=1.5, local_steps=2
    )
    summary = run_experiment(exp, None)
    assert summary["rounds_completed"] == t_full
    history = exp.ledger.history(0)
    assert PrivacyCost(1.5, 0.2, 2) in history and PrivacyCost(5.0, 0.2, 1) in history
    assert len(history) == 2 * t_full
    # Independent computation: T·τ gradient steps and T loss releases, composed.
    want = compute_epsilon([(1.5, 0.2, 2 * t_full), (5.0, 0.2, t_full)], 1e-5, "rdp")
    assert exp.ledger.epsilon(0) == pytest.approx(want, rel=1e-9)
    assert (
        want
        <= 4.0
        < compute_epsilon([(1.5, 0.2, 2 * t_full + 2), (5.0, 0.2, t_full + 1)], 1e-5, "rdp")
    )


def test_paper_round_count_overshoots_and_the_ledger_reports_the_true_epsilon():
    exp = build_experiment(_fedfdp_config(rounds_from_budget="paper_model_only"))
    meta = exp.metadata["privacy"]
    assert meta["epsilon_at_paper_rounds"] > 4.0
    assert "budget_note" in meta


def test_lambda_numeric_mode_warns_on_the_degenerate_bound_and_goes_to_zero():
    constants = BoundConstants(
        L=10,
        mu=1,
        G=0.1,
        Gamma=0.5,
        Q0=-1.0,
        Q1=2.0,
        dist0_sq=100,
        sigma=2.0,
        C=0.1,
        d=582026,
        B_hat=34,
    )
    algo = _fedfdp(lam=0.3, lambda_mode="numeric", bound_constants=constants)
    with pytest.warns(DegenerateBoundWarning):
        algo.after_round(
            0, {}, [ClientResult(0, {}, 1.0, 1, metrics={"noisy_loss": 1.0, "raw_loss": 1.0})]
        )
    assert algo.lam == 0.0
    closed = _fedfdp(lam=0.3, lambda_mode="closed_form", bound_constants=constants)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateBoundWarning)
        closed.after_round(0, {}, [])
    assert closed.lam == 0.3  # closed form has no interior optimum: λ kept


def test_lambda_is_a_plain_config_field_and_bad_values_are_config_errors():
    exp = build_experiment(_fedfdp_config(lam=0.7))
    assert exp.algorithm.lam == 0.7
    for bad in ({"lam": -1.0}, {"loss_noise_multiplier": 0.0}, {"lambda_mode": "magic"}):
        with pytest.raises(ConfigError, match="fedfdp"):
            _fedfdp_config(**bad)
    with pytest.raises(ConfigError, match="noise_multiplier"):
        build_experiment(
            small_config(
                experiment__algorithm={"name": "fedfdp"},
                experiment__privacy={"noise_multiplier": None},
            )
        )
    assert math.isfinite(exp.metadata["privacy"]["epsilon_at_paper_rounds"])


def test_server_state_round_trips_through_json_for_resume():
    import json

    algo = _fedfdp(lam=0.4)
    algo.after_round(
        2,
        {},
        [ClientResult(5, {}, 2.0, 2, metrics={"noisy_loss": 0.8, "raw_loss": 0.9})],
    )
    state = json.loads(json.dumps(algo.state_dict()))
    fresh = _fedfdp(lam=0.0)
    fresh.load_state_dict(state)
    assert (fresh.lam, fresh.global_loss, fresh.rounds_done) == (0.4, 0.8, 3)
    assert fresh.loss_upload.bound(5) == pytest.approx(0.8)
