"""The Ray backend: same results as the local backend, placement, faults, deadlines."""

import time

import pytest

from raydpfl.backends.base import RoundTimeoutError, WorkerLostError
from raydpfl.config import ConfigError
from raydpfl.simulation.build import build_experiment, run_experiment
from tests.conftest import small_config

pytestmark = pytest.mark.ray


def _config(backend="ray", workers=2, cpus=1.0, **runtime):
    return small_config(
        runtime={
            "backend": backend,
            "workers": workers,
            "cpus_per_worker": cpus,
            "progress": False,
            **runtime,
        },
    )


def test_ray_matches_local_bit_for_bit_with_1_2_and_4_workers(ray_session):
    local = run_experiment(build_experiment(_config(backend="local")), None)

    runs = {
        n: run_experiment(build_experiment(_config(workers=n, cpus=1.0)), None) for n in (1, 2, 4)
    }

    for n, summary in runs.items():
        assert summary["model_sha256"] == local["model_sha256"], f"{n} workers"
        assert summary["ledger_sha256"] == local["ledger_sha256"], f"{n} workers"
        assert summary["final_test_accuracy"] == local["final_test_accuracy"]


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
