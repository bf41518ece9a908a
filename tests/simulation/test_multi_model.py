"""Several models in one run: the prefixed layout, per-task model selection, per-client
evaluation, resume, and bit-identical results on the Ray backend (RC-DPFL on digits)."""

import numpy as np
import pytest
import torch

from raydpfl.algorithms.multi_model import (
    ALL_MODELS,
    GLOBAL_MODEL,
    is_multi_model,
    join_models,
    model_params,
)
from raydpfl.config import config_from_dict
from raydpfl.data.cluster_shift import ClusteredDataset
from raydpfl.experiment.build import build_experiment, make_local_backend, run_experiment
from raydpfl.simulation.outputs import model_sha256


def rc_config(name="rc_dpfl", rounds=3, backend="local", workers=1, rc=None, privacy=None):
    return config_from_dict(
        {
            "experiment": {
                "name": "rc-test",
                "data": {
                    "dataset": "digits",
                    "num_clients": 6,
                    "cluster_shift": {"kind": "rotation", "cluster_sizes": "2,2,2"},
                },
                "model": {"name": "rc_cnn"},
                "algorithm": {
                    "name": name,
                    "rounds": rounds,
                    "clients_per_round": 6,
                    "lr": 0.1,
                    "rc_dpfl": {
                        "num_clusters": 3,
                        "batch_size": 16,
                        "gmm_stage_rounds": 1,
                        **(rc or {}),
                    },
                },
                "privacy": {
                    "epsilon": 8.0,
                    "delta": 1e-3,
                    "clip_norm": 1.0,
                    "noise_multiplier": 1.2,
                    **(privacy or {}),
                },
            },
            "runtime": {
                "backend": backend,
                "workers": workers,
                "cpus_per_worker": 1,
                "seed": 3,
                "progress": False,
            },
        }
    )


def test_prefixed_layout_round_trips_and_keeps_the_single_model_case_unprefixed():
    a = {"w": torch.ones(2), "b": torch.zeros(1)}
    b = {"w": torch.full((2,), 2.0), "b": torch.ones(1)}
    flat = join_models([a, b], ["m0", "m1"])
    assert list(flat) == ["m0/w", "m0/b", "m1/w", "m1/b"]
    assert is_multi_model(flat) and not is_multi_model(a)
    assert torch.equal(model_params(flat, "m1")["w"], b["w"])
    assert model_params(a, GLOBAL_MODEL) == a
    with pytest.raises(KeyError):
        model_params(flat, "m2")


def test_worker_starts_each_task_from_its_model_and_scores_clients_with_theirs():
    exp = build_experiment(rc_config())
    worker = make_local_backend(exp).worker
    names = list(exp.init_params)
    models = [{n: t + k for n, t in exp.init_params.items()} for k in range(3)]
    flat = join_models(models, ["m0", "m1", "m2"])
    worker.load_params(flat, "m2")
    assert all(torch.equal(worker.params[n], models[2][n]) for n in names)
    worker.load_params(exp.init_params)  # the single-model path is unchanged
    assert all(torch.equal(worker.params[n], exp.init_params[n]) for n in names)

    mixed = worker.evaluate_clients(flat, [0, 1], ["m0", "m1"])
    alone = [
        worker.evaluate_clients(model_params(flat, k), [c])[0] for c, k in ((0, "m0"), (1, "m1"))
    ]
    assert mixed == alone

    # model_key="*" hands the client half every model (read-only), here to pick a cluster.
    from raydpfl.papers.rc_dpfl.algorithm import assign_task

    task = assign_task(0, 0, None)
    assert task.model_key == ALL_MODELS and task.privacy_cost is None
    exp.algorithm.num_models = 3
    result = worker.run_task(flat, task)
    assert result.metrics["cluster"] in (0.0, 1.0, 2.0)
    assert all(torch.equal(flat[f"m0/{n}"], models[0][n]) for n in names)  # not modified


def test_rc_dpfl_run_scores_clients_with_their_cluster_models_and_pools_the_central_figure():
    from raydpfl.experiment.build import make_server

    exp = build_experiment(rc_config(rounds=3))
    assert isinstance(exp.dataset, ClusteredDataset)
    assert sorted(np.bincount(exp.dataset.clusters).tolist()) == [2, 2, 2]
    server = make_server(exp)
    with make_local_backend(exp) as backend:
        summary = server.run(backend)
        keys = exp.algorithm.evaluation_model_keys(6)
        per = backend.evaluate_clients(server.params, list(range(6)), keys)
    assert set(keys) <= {"m0", "m1", "m2"} and is_multi_model(server.params)
    assert summary["rounds_completed"] == 3
    assert summary["epsilon_max"] <= 8.0
    assert any("loss_based_cluster_choice" in r for r in summary["unaccounted_releases"])
    assert summary["privacy"]["true_clusters"] == list(exp.dataset.clusters)
    # The pooled central accuracy is the example-weighted mean of the per-client ones.
    pooled = sum(e.correct for e in per) / sum(e.num_examples for e in per)
    assert server.rows[-1]["test_accuracy"] == pytest.approx(pooled)
    assert summary["model_sha256"] == model_sha256(server.params)
    assert "cluster_accuracy" in server.rows[-1] and "gmm_max_overlap" in server.rows[0]


def test_multi_model_checkpoint_resumes_to_the_same_models(tmp_path):
    from raydpfl.experiment.build import make_server
    from raydpfl.simulation.outputs import RunWriter

    def cfg():
        base = rc_config(rounds=3)
        import dataclasses

        rt = dataclasses.replace(base.runtime, checkpoint_every=1)
        return dataclasses.replace(base, runtime=rt)

    full = run_experiment(build_experiment(cfg()), None)
    exp = build_experiment(cfg())
    (tmp_path / "run").mkdir()
    writer = RunWriter(tmp_path / "run")
    server = make_server(exp, writer)
    with make_local_backend(exp) as backend:
        for r in range(2):  # "crash" after round 2; checkpoints after rounds 1 and 2
            server.run_round(backend, r)
    server.close_outputs()
    exp2 = build_experiment(cfg())
    resumed = make_server(exp2, RunWriter(tmp_path / "run"), resume=True)
    assert resumed.rounds_completed == 2  # round 3 (a loss-based one) is left to run
    with make_local_backend(exp2) as backend:
        summary = resumed.run(backend)
    assert summary["model_sha256"] == full["model_sha256"]
    assert summary["ledger_sha256"] == full["ledger_sha256"]


@pytest.mark.ray
def test_rc_dpfl_is_bit_identical_on_ray_and_local():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        local = run_experiment(build_experiment(rc_config(rounds=2)), None)
        remote = run_experiment(
            build_experiment(rc_config(rounds=2, backend="ray", workers=2)), None
        )
    finally:
        if started:
            ray.shutdown()
    assert remote["model_sha256"] == local["model_sha256"]
    assert remote["ledger_sha256"] == local["ledger_sha256"]
    assert remote["final_test_accuracy"] == local["final_test_accuracy"]
    assert np.isfinite(local["final_test_accuracy"])
