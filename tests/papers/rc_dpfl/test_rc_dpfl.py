"""RC-DPFL's server and client halves and its baselines, on hand-made updates and data."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from raydpfl.algorithms.base import ClientContext, ClientData, ClientResult
from raydpfl.algorithms.multi_model import model_params
from raydpfl.config import ConfigError, config_from_dict
from raydpfl.papers.rc_dpfl.accounting import two_stage_epsilon
from raydpfl.papers.rc_dpfl.algorithm import RcDpfl, assign_task, cluster_sums
from raydpfl.papers.rc_dpfl.baselines import IfcaCDPFL, KMeansCDPFL, OracleCDPFL
from raydpfl.papers.rc_dpfl.metrics import hungarian_clustering_accuracy
from raydpfl.privacy.accounting.ledger import PrivacyLedger
from raydpfl.privacy.per_sample.engines import make_engine

N_CLIENTS, DIM = 12, 50


def common(n=N_CLIENTS, z=1.0, **kw):
    return dict(
        num_clients=n,
        lr=0.1,
        clip_norm=1.0,
        noise_multipliers=[z] * n,
        batch_size=8,
        local_epochs=1,
        seed=7,
        **kw,
    )


def synthetic_round1(truth, noise, seed=0):
    """Round-1 results: client i's update is its cluster's centre plus N(0, noise²)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(int(truth.max()) + 1, DIM)) * 3.0
    results = []
    for i, k in enumerate(truth):
        u = centres[k] + noise * rng.normal(size=DIM)
        results.append(
            ClientResult(
                i, {"w": torch.tensor(u, dtype=torch.float32)}, weight=10.0, num_examples=10
            )
        )
    return results


TRUTH = np.array([0, 1, 2, 1, 2, 1, 2, 0, 1, 2, 0, 1])


def test_gmm_stage_recovers_known_clusters_when_noise_is_low():
    algo = RcDpfl(num_models=3, rounds=20, true_clusters=TRUTH, **common())
    tasks = algo.plan(0, list(range(N_CLIENTS)), np.full(N_CLIENTS, 40))
    init = {"w": torch.zeros(DIM)}
    params = algo.aggregate(init, tasks, synthetic_round1(TRUTH, noise=0.01))
    assert hungarian_clustering_accuracy(TRUTH, algo.posteriors.argmax(1)) == 1.0
    assert np.allclose(algo.posteriors.max(1), 1.0)
    metrics = algo.after_round(0, {})
    assert metrics["gmm_cluster_accuracy"] == 1.0 and metrics["gmm_cluster_exact"] == 1.0
    assert metrics["cluster_accuracy"] == 1.0
    # Literal Algorithm 1: no aggregation in round 1, every cluster model is θ^init.
    assert sorted(params) == ["m0/w", "m1/w", "m2/w"]
    assert all(torch.equal(params[f"m{m}/w"], init["w"]) for m in range(3))
    # E_c from the authors' rule: int((1 − O)·E/2) = 10 for a separated mixture.
    assert algo.gmm_stage == 10 and metrics["gmm_stage_rounds"] == 10.0


def test_gmm_stage_cannot_recover_clusters_drowned_in_noise():
    algo = RcDpfl(num_models=3, rounds=20, **common())
    tasks = algo.plan(0, list(range(N_CLIENTS)), np.full(N_CLIENTS, 40))
    algo.aggregate({"w": torch.zeros(DIM)}, tasks, synthetic_round1(TRUTH, noise=100.0))
    assert hungarian_clustering_accuracy(TRUTH, algo.posteriors.argmax(1)) < 1.0


def test_pi_weighted_round1_init_moves_each_model_by_its_members_mean_update():
    algo = RcDpfl(num_models=3, rounds=20, round1_init="pi_weighted", **common())
    tasks = algo.plan(0, list(range(N_CLIENTS)), np.full(N_CLIENTS, 40))
    results = synthetic_round1(TRUTH, noise=0.01)
    params = algo.aggregate({"w": torch.zeros(DIM)}, tasks, results)
    hard = algo.posteriors.argmax(1)
    for m in range(3):
        members = [r.update["w"] for r in results if hard[r.client_id] == m]
        assert torch.allclose(params[f"m{m}/w"], torch.stack(members).mean(0), atol=1e-5)


def test_rounds_follow_algorithm_1_full_batch_then_sampled_then_loss_based():
    sizes = np.full(N_CLIENTS, 40)
    algo = RcDpfl(num_models=3, rounds=6, gmm_stage_rounds=2, **common(z=1.5))
    t0 = algo.plan(0, list(range(N_CLIENTS)), sizes)
    assert {(t.sampling_rate, t.local_steps, t.model_key) for t in t0} == {(1.0, 1, "global")}
    assert t0[0].privacy_cost.as_triple() == (1.5, 1.0, 1)
    params = algo.aggregate({"w": torch.zeros(DIM)}, t0, synthetic_round1(TRUTH, noise=0.5))
    algo.after_round(0, {})
    draws = []
    for r in (1, 2):  # rounds 2..E_c+1: fresh draws from π, no follow-ups until round E_c+1
        tasks = algo.plan(r, list(range(N_CLIENTS)), sizes)
        assert tasks[0].sampling_rate == 8 / 40 and tasks[0].local_steps == 5
        assert tasks[0].privacy_cost.as_triple() == (1.5, 0.2, 5)
        draws.append([t.model_key for t in tasks])
        done = [ClientResult(i, {}, 40.0, 40) for i in range(N_CLIENTS)]
        follow = algo.followup_tasks(r, tasks, done, params)
        assert len(follow) == (0 if r < 2 else N_CLIENTS)
    # Reproducible: the same seed draws the same assignments.
    again = RcDpfl(num_models=3, rounds=6, gmm_stage_rounds=2, **common(z=1.5))
    again.aggregate({"w": torch.zeros(DIM)}, t0, synthetic_round1(TRUTH, noise=0.5))
    assert [t.model_key for t in again.plan(1, list(range(N_CLIENTS)), sizes)] == draws[0]
    # Loss stage: the clients' choices become the assignment of the next round.
    choices = [ClientResult(i, {}, 0.0, 40, {"cluster": float(i % 3)}) for i in range(N_CLIENTS)]
    algo.after_round(2, {}, choices)
    tasks = algo.plan(3, list(range(N_CLIENTS)), sizes)
    assert [t.model_key for t in tasks] == [f"m{i % 3}" for i in range(N_CLIENTS)]
    assert algo.evaluation_model_keys(N_CLIENTS) == [f"m{i % 3}" for i in range(N_CLIENTS)]
    assert any("loss_based" in r for r in algo.unaccounted_releases())
    state = algo.state_dict()
    restored = RcDpfl(num_models=3, rounds=6, **common(z=1.5))
    restored.load_state_dict(state)
    assert restored.state_dict() == state


def test_private_selection_is_charged_and_frozen_after_its_rounds():
    algo = RcDpfl(
        num_models=3,
        rounds=6,
        gmm_stage_rounds=1,
        selection_epsilon=0.25,
        selection_rounds=2,
        **common(),
    )
    algo.gmm_stage = 1
    sent = [algo.followup_tasks(r, [], [ClientResult(0, {}, 1.0, 40)], {}) for r in (1, 2, 3, 4)]
    assert [len(s) for s in sent] == [1, 1, 0, 0]
    cost = sent[0][0].privacy_cost
    assert cost.as_triple() == (2.0 / 0.25, 1.0, 1)  # RDP α·ε²/8 of the exponential mechanism
    assert sent[0][0].mechanisms[0].mechanism.epsilon == 0.25
    assert not any("loss_based" in r for r in algo.unaccounted_releases())


def test_per_cluster_aggregation_weights_by_hand():
    models = [{"w": torch.tensor([0.0])}, {"w": torch.tensor([10.0])}, {"w": torch.tensor([5.0])}]
    results = [
        ClientResult(0, {"w": torch.tensor([1.0])}, weight=1.0, num_examples=1),
        ClientResult(1, {"w": torch.tensor([3.0])}, weight=3.0, num_examples=3),
        ClientResult(2, {"w": torch.tensor([-2.0])}, weight=2.0, num_examples=2),
    ]
    out = cluster_sums(models, np.array([0, 0, 1]), results)
    assert out[0]["w"].item() == pytest.approx((1 * 1 + 3 * 3) / 4)  # w_i = N_i / Σ N_j
    assert out[1]["w"].item() == pytest.approx(8.0)
    assert out[2]["w"].item() == 5.0  # empty cluster keeps its model


def test_two_stage_charges_compose_to_an_independent_rdp_computation():
    from opacus.accountants import RDPAccountant

    n, b, rounds, z, delta = 40, 8, 5, 1.3, 1e-3
    algo = RcDpfl(num_models=3, rounds=rounds, gmm_stage_rounds=1, **common(z=z))
    ledger = PrivacyLedger("rdp", delta, 100.0)
    for r in range(rounds):
        for t in algo.plan(r, [0], np.array([n] * N_CLIENTS))[:1]:
            ledger.charge(0, t.privacy_cost)
        if r == 0:
            algo.gmm_stage = 1
    acc = RDPAccountant()
    acc.history = [(z, 1.0, 1), (z, b / n, (rounds - 1) * math.ceil(n / b))]
    independent = acc.get_epsilon(delta)
    ours = ledger.epsilons([0])[0]
    assert ours == pytest.approx(two_stage_epsilon(z, delta, n, b, total_rounds=rounds), rel=1e-9)
    # Opacus uses its own order grid and conversion: agree to within 2%, and the two-stage
    # schedule costs more than b-batches in every round.
    assert ours == pytest.approx(independent, rel=0.02)
    assert ours > two_stage_epsilon(z, delta, n, b, total_rounds=rounds, first_stage_rounds=0)


def test_kmeans_baseline_recovers_separable_clusters_and_averages_post_training_models():
    algo = KMeansCDPFL(num_models=3, true_clusters=TRUTH, **common())
    tasks = algo.plan(0, list(range(N_CLIENTS)), np.full(N_CLIENTS, 40))
    results = synthetic_round1(TRUTH, noise=0.01)
    params = algo.aggregate({"w": torch.ones(DIM)}, tasks, results)
    assert algo.after_round(0, {})["cluster_accuracy"] == 1.0
    for m in range(3):
        members = [r.update["w"] for r in results if algo.assignment[r.client_id] == m]
        assert torch.allclose(params[f"m{m}/w"], 1.0 + torch.stack(members).mean(0), atol=1e-5)


def test_oracle_trains_each_true_cluster_separately():
    algo = OracleCDPFL(clusters=TRUTH.tolist(), **common())
    tasks = algo.plan(1, list(range(N_CLIENTS)), np.full(N_CLIENTS, 40))
    assert [t.model_key for t in tasks] == [f"m{k}" for k in TRUTH]
    assert algo.evaluation_model_keys(N_CLIENTS) == [f"m{k}" for k in TRUTH]


def _client(x, y):
    model = nn.Linear(2, 2, bias=False)
    model.requires_grad_(False)
    ctx = ClientContext(
        model=model,
        clipping=make_engine(model, "auto"),
        generator=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    return ctx, ClientData(0, x, y, torch.arange(len(y)))


def test_clients_pick_the_model_with_the_lowest_train_loss():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    y = torch.tensor([0, 1, 0])
    good, bad = torch.eye(2) * 5, -torch.eye(2) * 5
    flat = {"m0/weight": bad, "m1/weight": good, "m2/weight": bad * 2}
    ctx, data = _client(x, y)
    algo = RcDpfl(num_models=3, rounds=4, **common(n=1))
    assert algo.local_update(ctx, flat, data, assign_task(0, 3, None)).metrics["cluster"] == 1.0
    # The private variant with a huge ε_select is the noiseless argmax of accuracies.
    assert algo.local_update(ctx, flat, data, assign_task(0, 3, 1e6)).metrics["cluster"] == 1.0
    # f-CDPFL's round 1: the client itself picks its initial model, then trains it.
    ifca = IfcaCDPFL(init_models=[{"weight": bad}, {"weight": good}], **common(n=1))
    task = ifca.plan(0, [0], np.array([3]))[0]
    params = {"weight": torch.zeros(2, 2)}
    result = ifca.local_update(ctx, params, data, task)
    assert result.metrics["cluster"] == 1.0
    assert torch.allclose(params["weight"], good + result.update["weight"])
    assert model_params(flat, "m1")["weight"] is good


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        (
            {"data": {"cluster_shift": {"kind": "rotation", "cluster_sizes": "3,x"}}},
            "experiment.data.cluster_shift.cluster_sizes",
        ),
        (
            {"data": {"cluster_shift": {"kind": "rotation", "cluster_sizes": "1,1,1,1,1"}}},
            "experiment.data.cluster_shift.cluster_sizes",
        ),
        ({"algorithm": {"rc_dpfl": {"batch_size": 0}}}, "experiment.algorithm.rc_dpfl.batch_size"),
        (
            {"algorithm": {"rc_dpfl": {"gmm_feature_space": "raw"}}},
            "experiment.algorithm.rc_dpfl.scaler",
        ),
    ],
)
def test_bad_config_names_the_field(patch, field):
    raw = {"experiment": {"algorithm": {"name": "rc_dpfl"}}}
    for section, value in patch.items():
        raw["experiment"].setdefault(section, {}).update(value)
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"num_clients": 5}, "experiment.data.num_clients"),
        ({"clients_per_round": 3}, "experiment.algorithm.clients_per_round"),
        (
            {"accountant": "prv", "selection_privacy": "gumbel"},
            "experiment.algorithm.rc_dpfl.selection_privacy",
        ),
        ({"noise_multiplier": 0.3}, "experiment.privacy.noise_multiplier"),
    ],
)
def test_data_dependent_config_errors_come_before_training(overrides, field):
    from raydpfl.experiment.build import build_experiment

    raw = {
        "experiment": {
            "data": {
                "dataset": "digits",
                "num_clients": overrides.get("num_clients", 6),
                "cluster_shift": {"kind": "label", "cluster_sizes": "2,2,2"},
            },
            "model": {"name": "rc_cnn"},
            "algorithm": {
                "name": "rc_dpfl",
                "rounds": 3,
                "clients_per_round": overrides.get(
                    "clients_per_round", overrides.get("num_clients", 6)
                ),
                "rc_dpfl": {
                    "num_clusters": 3,
                    "batch_size": 16,
                    "selection_privacy": overrides.get("selection_privacy", "none"),
                },
            },
            "privacy": {
                "epsilon": 2.0,
                "delta": 1e-3,
                "accountant": overrides.get("accountant", "rdp"),
                "noise_multiplier": overrides.get("noise_multiplier"),
            },
        },
        "runtime": {"backend": "local"},
    }
    with pytest.raises(ConfigError) as err:
        build_experiment(config_from_dict(raw))
    assert err.value.field == field


def test_mr_mtl_pulls_the_personal_model_towards_the_mean_and_averages_them():
    from raydpfl.papers.rc_dpfl.baselines import MrMtl

    algo = MrMtl(reg_weight=5.0, **{**common(n=2, z=0.0), "clip_norm": 1e-12})
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    ctx, data = _client(x, torch.tensor([0, 1, 0]))
    own, mean = torch.eye(2) * 4, torch.zeros(2, 2)
    flat = {"c0/weight": own, "c1/weight": own * 0, "mean/weight": mean}
    task = algo.plan(1, [0], np.array([3]))[0]
    task = type(task)(
        **{**{f: getattr(task, f) for f in task.__dataclass_fields__}, "local_steps": 1}
    )
    assert task.model_key == "*"
    result = algo.local_update(ctx, flat, data, task)
    # Data gradient clipped to ~0, no noise: θ ← θ − η·λ(θ − θ̄) = θ − 0.5·(θ − θ̄).
    assert torch.allclose(own + result.update["weight"], (own + mean) / 2, atol=1e-6)
    new = algo.aggregate(flat, [task], [result])
    assert torch.allclose(new["c0/weight"], own / 2, atol=1e-6)
    assert torch.allclose(new["mean/weight"], own / 2, atol=1e-6)  # only client 0 reported
    assert algo.evaluation_model_keys(2) == ["c0", "c1"]
