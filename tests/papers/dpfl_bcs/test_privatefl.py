"""PRIVATEFL and PRIVATEFL-BCS, DPFL-BCS's Table I baselines (papers/dpfl_bcs/privatefl.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from raydpfl.algorithms.base import ClientContext, ClientData
from raydpfl.config import ConfigError, config_from_dict
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.models import build_model
from raydpfl.papers.dpfl_bcs.algorithm import DpflBcs
from raydpfl.papers.dpfl_bcs.models import (
    TRANSFORM_SCALE,
    TRANSFORM_SHIFT,
    apply_input_transform,
    identity_input_transform,
)
from raydpfl.papers.dpfl_bcs.privatefl import PrivateFl, PrivateFlResult, client_key
from raydpfl.simulation.evaluation import evaluate, evaluation_params
from tests.conftest import release_scale, with_release_scale
from tests.papers.dpfl_bcs.dpfl_bcs_helpers import BCS_CLIENTS, bcs_args, bcs_config

N, FEATURES = BCS_CLIENTS, 6


def _args(**kw) -> dict:
    return bcs_args(**{"num_params": FEATURES * 3 + 3, **kw})


def _pfl(**kw) -> PrivateFl:
    return PrivateFl(input_shape=(FEATURES,), **_args(**kw))


def _client(n: int = 40, scale: float = 3.0):
    torch.manual_seed(0)
    model = build_model("bcs_linear", (FEATURES,), 3)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x = torch.randn(n, FEATURES) * scale
    y = torch.randint(0, 3, (n,))
    return model, params, ClientData(0, x, y, torch.arange(n))


def _ctx(model, seed: int = 1) -> ClientContext:
    return ClientContext(model, None, torch.Generator().manual_seed(seed), torch.device("cpu"))


def _task(algo, round_idx: int, client: int = 0, records: int = 40, **extras):
    """The algorithm's task for `client`, planned for the `records` a hand-built client
    holds (the platform checks the release's sensitivity against them)."""
    sizes = algo.sizes.copy()
    sizes[client] = records
    task = algo.plan(round_idx, [client], sizes)[0]
    if "noise_scale" in extras:
        task = with_release_scale(task, extras.pop("noise_scale"))
    if extras:
        task = dataclasses.replace(task, extras={**task.extras, **extras})
    return task


def test_transform_stays_with_its_client_and_never_enters_the_upload():
    a = _pfl(selection="uniform")
    model, params, data = _client()
    shared_names = set(params)
    task = _task(a, 0, client=2)
    assert set(task.payload) == {TRANSFORM_SCALE, TRANSFORM_SHIFT}  # shipped with the task
    res = a.local_update(_ctx(model), dict(params), data, task)
    assert isinstance(res, PrivateFlResult)
    assert set(res.update) == shared_names  # the upload: shared parameters only
    assert set(res.local_state) == {TRANSFORM_SCALE, TRANSFORM_SHIFT}
    ident = identity_input_transform((FEATURES,))
    assert not torch.equal(res.local_state[TRANSFORM_SHIFT], ident[TRANSFORM_SHIFT])  # trained

    new = a.aggregate(params, [task], [res])
    # The server keeps client 2's transformation; nobody else's moved.
    torch.testing.assert_close(
        a.transform_of(2)[TRANSFORM_SHIFT], res.local_state[TRANSFORM_SHIFT]
    )
    assert set(a.transforms) == {2}
    torch.testing.assert_close(a.transform_of(5)[TRANSFORM_SCALE], ident[TRANSFORM_SCALE])
    # The shared model moved by the (single) upload, and the transformation is not in it.
    for n in shared_names:
        torch.testing.assert_close(new[n], params[n] + res.update[n])
    assert {n for n in new if "/" not in n} == shared_names
    assert set(new) - shared_names == {
        f"{client_key(c)}/{t}" for c in range(N) for t in (TRANSFORM_SCALE, TRANSFORM_SHIFT)
    }
    # The next task of client 2 ships its own new transformation, not the identity.
    again = _task(a, 1, client=2)
    torch.testing.assert_close(again.payload[TRANSFORM_SHIFT], res.local_state[TRANSFORM_SHIFT])
    # A second aggregation ignores the evaluation copies in the broadcast dict.
    newer = a.aggregate(new, [again], [])
    assert set(newer) == set(new)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
@pytest.mark.parametrize("selection", ["uniform", "bcs"])
def test_frozen_identity_transform_gives_exactly_the_dpsgd_update(mechanism, selection):
    pfl = _pfl(mechanism=mechanism, selection=selection, train_transform=False)
    base = DpflBcs(**_args(mechanism=mechanism, selection=selection))
    model, params, data = _client()
    for round_idx in (0, 5):  # stage 1 (loss uploads under bcs) and stage 2
        t_pfl, t_base = _task(pfl, round_idx), _task(base, round_idx)
        assert t_pfl.extras == t_base.extras and t_pfl.mechanisms == t_base.mechanisms
        assert release_scale(t_pfl) > 0
        r_pfl = pfl.local_update(_ctx(model), dict(params), data, t_pfl)
        r_base = base.local_update(_ctx(model), dict(params), data, t_base)
        assert set(r_pfl.update) == set(r_base.update)
        for n in r_base.update:
            assert torch.equal(r_pfl.update[n], r_base.update[n]), n
        assert r_pfl.metrics == r_base.metrics
        ident = identity_input_transform((FEATURES,))
        for n, t in ident.items():  # frozen: no step, no noise
            assert torch.equal(r_pfl.local_state[n], t)
    # Training the transformation changes the shared update (the joint clip and draws).
    trained = _pfl(mechanism=mechanism, selection=selection)
    r_trained = trained.local_update(_ctx(model), dict(params), data, _task(trained, 5))
    assert not torch.equal(r_trained.update["linear.weight"], r_base.update["linear.weight"])


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_the_clip_covers_the_joint_gradient(mechanism):
    a = _pfl(mechanism=mechanism, clip_norm=0.5, selection="uniform")
    model, params, data = _client(n=1, scale=50.0)  # one record with a huge gradient
    task = _task(a, 5, records=1, noise_scale=0.0)
    res = a.local_update(_ctx(model), dict(params), data, task)
    ident = identity_input_transform((FEATURES,))
    joint = torch.cat(
        [-t.reshape(-1) for t in res.update.values()]
        + [(ident[n] - res.local_state[n]).reshape(-1) for n in ident]
    )
    shared_only = torch.cat([-t.reshape(-1) for t in res.update.values()])
    order = 1 if mechanism == "laplace" else 2
    assert float(joint.norm(p=order)) == pytest.approx(task.lr * 0.5, rel=1e-5)
    assert float(shared_only.norm(p=order)) < task.lr * 0.5 * (1 - 1e-3)  # γ, β took a share


def test_noise_reaches_the_transformation_with_the_task_scale():
    a = _pfl(selection="uniform")
    model, params, data = _client()
    clean = a.local_update(_ctx(model), dict(params), data, _task(a, 5, noise_scale=0.0))
    noisy = a.local_update(_ctx(model), dict(params), data, _task(a, 5, noise_scale=0.7))
    z = (noisy.local_state[TRANSFORM_SHIFT] - clean.local_state[TRANSFORM_SHIFT]).abs()
    assert float(z.min()) > 0  # every coordinate of the transformation is noised
    assert float(z.max()) < 0.7 * 6  # with the task's scale, not more


def test_evaluation_composes_the_shared_model_with_each_clients_transform():
    model, params, data = _client()
    transform = {
        TRANSFORM_SCALE: torch.linspace(0.5, 2.0, FEATURES),
        TRANSFORM_SHIFT: torch.linspace(-1.0, 1.0, FEATURES),
    }
    x, y = data.records()
    composed = evaluate(model, {**params, **transform}, x, y)
    by_hand = evaluate(
        model, params, x * transform[TRANSFORM_SCALE] + transform[TRANSFORM_SHIFT], y
    )
    assert composed == by_hand
    assert composed != evaluate(model, params, x, y)
    broadcast = {**params, **{f"c3/{n}": t for n, t in transform.items()}}
    chosen = evaluation_params(broadcast, "c3")
    assert set(chosen) == set(params) | set(transform)
    # Images: one scale per channel, one shift per element.
    img = identity_input_transform((3, 4, 4))
    img[TRANSFORM_SCALE] = torch.tensor([1.0, 2.0, 3.0])
    xi = torch.ones(2, 3, 4, 4)
    out, rest = apply_input_transform(xi, img)
    assert rest == {} and torch.equal(out[:, 2], torch.full((2, 4, 4), 3.0))


# ---- end to end -----------------------------------------------------------------------
def _config(name: str, **bcs) -> dict:
    # PRIVATEFL scores each client's personalised model on the client's own test split.
    return bcs_config(
        name,
        experiment__name="privatefl-test",
        experiment__data__client_test_fraction=0.2,
        experiment__algorithm__eval_every=4,
        experiment__algorithm__dpfl_bcs=bcs,
    )


@pytest.mark.parametrize("name", ["bcs_privatefl", "bcs_privatefl_bcs"])
@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_ledgers_never_exceed_the_client_budgets(name, mechanism):
    exp = build_experiment(config_from_dict(_config(name, mechanism=mechanism)))
    summary = run_experiment(exp, None)
    a, ledger = exp.algorithm, exp.ledger
    assert isinstance(a, PrivateFl) and a.name == name and a.mechanism == mechanism
    assert summary["rounds_completed"] == 8
    assert summary["final_test_accuracy"] is not None
    for c in range(a.n):
        assert ledger.epsilon(c) <= a.eps[c]
        assert ledger.delta_of(c) == (a.deltas[c] if mechanism == "gaussian" else 0.0)
        assert ledger.steps(c) == a.total_counts[c]  # every participation charged once
    trained = {c for c in range(a.n) if a.total_counts[c] > 0}
    assert set(a.transforms) == trained  # a transformation per client that trained
    # The same per-client charge as the uniform DP baseline of the same mechanism.
    if name == "bcs_privatefl":
        other = "bcs_dpsgd" if mechanism == "gaussian" else "bcs_dmldp"
        b = build_experiment(config_from_dict(_config(other, mechanism=mechanism))).algorithm
        np.testing.assert_array_equal(a.eps, b.eps)
        np.testing.assert_array_equal(a.tplan, b.tplan)
        np.testing.assert_allclose(a.multiplier, b.multiplier)


def _inclusion(algo, draws: int = 3000) -> np.ndarray:
    rng = np.random.default_rng(1)
    counts = np.zeros(algo.n)
    # Everyone with a plan is available again (the run spent the budgets).
    algo.stage_counts[:] = 0
    algo.rem_rho, algo.rem_eps = algo.rho_total.copy(), algo.eps.copy()
    algo.excluded[:] = False
    for _ in range(draws):
        counts[algo.select(20, algo.n, rng)] += 1
    return counts / draws


def test_privatefl_bcs_selects_by_the_bcs_probabilities_after_t0():
    exp = build_experiment(config_from_dict(_config("bcs_privatefl_bcs")))
    run_experiment(exp, None)
    a = exp.algorithm
    assert a.selection == "bcs" and a.stage == 2 and set(a.plan_history) == {"stage1", "stage2"}
    assert a.estimates  # the T0 estimates ran on the stage-1 loss uploads
    assert np.all(a.stage_counts <= a.tplan)
    horizon = a.rounds - a.t0
    np.testing.assert_allclose(a.probs, a.tplan / (a.k * horizon))  # p_n = T_n/(K(T − T0))
    freq = _inclusion(a)
    np.testing.assert_allclose(freq, np.minimum(1.0, a.k * a.probs), atol=0.03)
    assert a.tplan.min() != a.tplan.max()  # the plan is biased, so the test can fail
    uniform = build_experiment(config_from_dict(_config("bcs_privatefl"))).algorithm
    assert uniform.selection == "uniform"
    np.testing.assert_allclose(_inclusion(uniform), uniform.k / uniform.n, atol=0.03)


def test_privatefl_needs_client_test_splits():
    cfg = _config("bcs_privatefl")
    cfg["experiment"]["data"]["client_test_fraction"] = 0.0
    with pytest.raises(ConfigError, match=r"experiment\.data\.client_test_fraction"):
        build_experiment(config_from_dict(cfg))
