"""The Ray backend: same results as the local backend, placement, faults, deadlines."""

import dataclasses
import time

import pytest
import torch

from raydpfl.config import ConfigError, config_from_dict
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.simulation.backend import RoundTimeoutError, WorkerLostError
from tests.conftest import FASHION_MNIST_DIR, small_config

pytestmark = pytest.mark.ray


def _config(backend="ray", workers=2, cpus=1.0, experiment__privacy=None, **runtime):
    return small_config(
        **({"experiment__privacy": experiment__privacy} if experiment__privacy else {}),
        runtime={
            "backend": backend,
            "workers": workers,
            "cpus_per_worker": cpus,
            "progress": False,
            **runtime,
        },
    )


def test_ray_matches_local_bit_for_bit_with_1_2_and_4_workers(ray_session):
    """Also the central evaluation, which the Ray backend spreads over its workers (the
    test set's 4 batches: 4, 2 + 2 and 1 + 1 + 1 + 1 per worker): every round's test
    loss is the same float as the local backend's at the workers' one thread."""
    local_rows: list[dict] = []
    local = run_experiment(
        build_experiment(_config(backend="local", threads=1)), None, on_round=local_rows.append
    )

    rows: dict[int, list[dict]] = {n: [] for n in (1, 2, 4)}
    runs = {
        n: run_experiment(
            build_experiment(_config(workers=n, cpus=1.0)), None, on_round=rows[n].append
        )
        for n in (1, 2, 4)
    }

    assert len(local_rows) == 4
    for n, summary in runs.items():
        assert summary["model_sha256"] == local["model_sha256"], f"{n} workers"
        assert summary["ledger_sha256"] == local["ledger_sha256"], f"{n} workers"
        assert summary["final_test_accuracy"] == local["final_test_accuracy"]
        assert [r["test_loss"] for r in rows[n]] == [r["test_loss"] for r in local_rows]
        assert [r["test_accuracy"] for r in rows[n]] == [r["test_accuracy"] for r in local_rows]


@pytest.mark.parametrize("sampler", ["ziggurat", "boxmuller"])
def test_a_counter_noise_sampler_is_bit_identical_on_both_backends(ray_session, sampler):
    """The numba samplers' streams (privacy.noise_sampler) are keyed by the client's
    seeded stream only, so the worker that trains a client does not matter."""
    privacy = {"noise_sampler": sampler}
    local = run_experiment(
        build_experiment(small_config(experiment__privacy=privacy, runtime__progress=False)), None
    )
    ray = run_experiment(build_experiment(_config(experiment__privacy=privacy)), None)

    assert ray["model_sha256"] == local["model_sha256"]
    assert ray["ledger_sha256"] == local["ledger_sha256"]
    assert ray["privacy"]["noise_source"] == local["privacy"]["noise_source"]


def test_workers_share_a_declared_gpu_in_quarters(ray_session):
    from raydpfl.backends.ray.runner import start_server

    exp = build_experiment(_config(workers=4, cpus=0.5, gpus_per_worker=0.25))
    host, _ref = start_server(exp, None)
    try:
        placements = ray_session.get(host.placements.remote())
    finally:
        ray_session.get(host.close.remote())
        ray_session.kill(host)

    assert len(placements) == 4
    assert len({p["pid"] for p in placements}) == 4
    assert all(p["gpu_ids"] == ["0"] for p in placements)
    assert all(p["cuda_visible_devices"] == "0" for p in placements)
    assert all(p["device"] == "cpu" and p["torch_threads"] == 1 for p in placements)


def test_asking_for_more_gpus_than_the_cluster_has_fails_before_any_actor(ray_session):
    exp = build_experiment(_config(workers=4, cpus=0.5, gpus_per_worker=0.5))

    with pytest.raises(ConfigError, match=r"runtime\.gpus_per_worker"):
        run_experiment(exp, None)


def test_killed_worker_is_restarted_and_the_round_result_does_not_change(ray_session):
    from raydpfl.backends.ray.runner import start_server

    config = small_config(
        experiment__algorithm={"rounds": 3, "local_steps": 30},
        runtime={"backend": "ray", "workers": 2, "progress": False},
    )
    reference = run_experiment(build_experiment(config), None)
    exp = build_experiment(config)
    host, _ref = start_server(exp, None)
    try:
        ray_session.get(host.run_round.remote(0))
        victim = ray_session.get(host.worker_handles.remote())[0]
        in_flight = host.run_round.remote(1)
        time.sleep(0.3)  # let the round reach the workers
        ray_session.kill(victim, no_restart=False)
        ray_session.get(in_flight)
        ray_session.get(host.run_round.remote(2))
        placements = ray_session.get(host.placements.remote())
        summary = ray_session.get(host.finish.remote())
    finally:
        ray_session.get(host.close.remote())
        ray_session.kill(host)

    assert placements[0]["restarted"] is True
    assert summary["model_sha256"] == reference["model_sha256"]
    assert summary["ledger_sha256"] == reference["ledger_sha256"]  # charged once per task


def test_a_dead_worker_without_restarts_is_a_clear_error(ray_session):
    from raydpfl.backends.ray.runner import start_server

    exp = build_experiment(_config(max_restarts=0))
    host, _ref = start_server(exp, None)
    try:
        victim = ray_session.get(host.worker_handles.remote())[0]
        ray_session.kill(victim, no_restart=True)
        with pytest.raises(WorkerLostError, match="max_restarts=0"):
            ray_session.get(host.run_round.remote(0))
    finally:
        ray_session.get(host.close.remote())
        ray_session.kill(host)


def test_a_round_past_its_deadline_stops_with_a_clear_error(ray_session):
    exp = build_experiment(_config(round_timeout_s=0.001))

    with pytest.raises(RoundTimeoutError, match=r"runtime\.round_timeout_s"):
        run_experiment(exp, None)


def test_a_thousand_clients_never_travel_as_a_thousand_updates(ray_session):
    config = small_config(
        experiment__data={
            "num_clients": 1000,
            "synthetic": {"alpha": 0.5, "beta": 0.5, "min_samples": 20, "max_samples": 40},
        },
        experiment__algorithm={"rounds": 2, "clients_per_round": 200, "local_steps": 2},
        runtime={"backend": "ray", "workers": 2, "aggregation_groups": 8, "progress": False},
    )
    exp = build_experiment(config)

    summary = run_experiment(exp, None)

    assert summary["rounds_completed"] == 2
    assert summary["updates_received_max"] <= 8


def test_per_client_results_come_back_in_plan_order_and_equal_local(ray_session):
    from raydpfl.backends.ray.backend import RayBackend
    from raydpfl.experiment.build import make_local_backend

    exp = build_experiment(_config(workers=2))
    rt = exp.config.runtime
    tasks = exp.algorithm.plan(0, [7, 1, 4, 10, 2], exp.dataset.train_sizes())
    dataset_ref = ray_session.put(exp.dataset)
    ray_backend = RayBackend(
        (exp.algorithm, exp.model_spec, [dataset_ref], rt.seed, rt.device, rt.engine),
        exp.dataset.train_sizes(),
        num_workers=2,
        cpus_per_worker=1.0,
        gpus_per_worker=0.0,
        max_restarts=0,
        round_timeout_s=600.0,
    )
    try:
        remote = ray_backend.run_tasks(exp.init_params, tasks)
        remote_eval = ray_backend.evaluate_clients(exp.init_params, [3, 0, 11])
    finally:
        ray_backend.close()
    with make_local_backend(exp) as local_backend:
        local = local_backend.run_tasks(exp.init_params, tasks)
        local_eval = local_backend.evaluate_clients(exp.init_params, [3, 0, 11])

    assert [r.client_id for r in remote] == [7, 1, 4, 10, 2]
    for a, b in zip(remote, local, strict=True):
        assert all(torch.equal(a.update[k], b.update[k]) for k in a.update)
        assert a.weight == b.weight
    assert remote_eval == local_eval


@pytest.mark.skipif(not FASHION_MNIST_DIR.exists(), reason="Debian dataset-fashion-mnist absent")
def test_cnn_is_bit_identical_on_both_backends_whatever_the_callers_threads(ray_session):
    # FedAvgCNN's CPU kernels reduce differently with 1 and 2 threads; both backends must
    # train with the worker's thread count, not the calling process's (2 in the tests).
    raw = {
        "experiment": {
            "data": {"dataset": "fashion_mnist", "num_clients": 30, "client_test_fraction": 0.0},
            "model": {"name": "fedavg_cnn"},
            "algorithm": {"rounds": 2, "clients_per_round": 4, "local_steps": 2, "lr": 0.1},
            "privacy": {"noise_multiplier": 1.0, "sampling_rate": 0.03},
        },
        "runtime": {"progress": False, "cpus_per_worker": 1},
    }
    assert torch.get_num_threads() == 2

    summaries = [
        run_experiment(build_experiment(config_from_dict(raw, [f"runtime.backend={b}"])), None)
        for b in ("local", "ray")
    ]

    assert summaries[0]["model_sha256"] == summaries[1]["model_sha256"]


def test_ali_dpfl_with_its_mu_follow_ups_is_bit_identical_on_ray_and_local(ray_session):
    from tests.papers.ali_dpfl.test_ali_dpfl import _ali_config

    summaries = {}
    for backend in ("local", "ray"):
        base = _ali_config()
        config = config_from_dict(
            {
                "experiment": dataclasses.asdict(base.experiment),
                "runtime": {"backend": backend, "workers": 2, "progress": False},
            }
        )
        summaries[backend] = run_experiment(build_experiment(config), None)

    assert summaries["ray"]["model_sha256"] == summaries["local"]["model_sha256"]
    assert summaries["ray"]["ledger_sha256"] == summaries["local"]["ledger_sha256"]


def _server_actor_pids() -> list[int]:
    """Processes of this session's Ray instance hosting a ServerHost actor."""
    import os

    import psutil

    found = []
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if any("ServerHost" in part for part in proc.cmdline()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
def test_a_killed_server_actor_is_restarted_from_its_checkpoint(ray_session, tmp_path):
    import os
    import signal

    rounds = {"experiment__algorithm": {"rounds": 5}}
    reference = run_experiment(build_experiment(small_config(**rounds)), None)
    config = small_config(
        **rounds,
        runtime={"backend": "ray", "workers": 2, "progress": False, "checkpoint_every": 2},
    )
    killed: list[int] = []

    def kill_the_server_after_round_3(row):
        if row["round"] == 3 and not killed:
            pids = _server_actor_pids()
            assert len(pids) == 1, pids
            os.kill(pids[0], signal.SIGKILL)  # the process, not a Ray call
            killed.append(pids[0])

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = run_experiment(
        build_experiment(config), run_dir, on_round=kill_the_server_after_round_3
    )

    assert killed
    assert summary["resumed_from_round"] == 2  # the checkpoint after round 2
    assert summary["rounds_completed"] == 5
    assert summary["model_sha256"] == reference["model_sha256"]
    assert summary["ledger_sha256"] == reference["ledger_sha256"]  # round 3 charged once


def test_a_dead_server_without_a_checkpoint_is_a_clear_error(ray_session):
    from raydpfl.simulation.backend import ServerLostError

    config = _config(checkpoint_every=None)

    def kill(row):
        import os
        import signal

        for pid in _server_actor_pids():
            os.kill(pid, signal.SIGKILL)

    with pytest.raises(ServerLostError, match="no checkpoint to continue from"):
        run_experiment(build_experiment(config), None, on_round=kill)
