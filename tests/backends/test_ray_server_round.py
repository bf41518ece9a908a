"""Client dropout after charge on Ray: the workers run only the clients that arrive, and
the run ends with the local backend's model and ledger bit for bit."""

from __future__ import annotations

import pytest

from raydpfl.api import run_simulation
from tests.conftest import small_config


def _config(**algorithm):
    section = {"name": "dp_fedavg", "rounds": 3, "local_steps": 1, "clients_per_round": 6,
               "eval_every": 3, "evaluate_clients": False, **algorithm}  # fmt: skip
    return small_config(experiment__algorithm=section, runtime={"seed": 7, "progress": False})


@pytest.mark.ray
def test_ray_workers_drop_the_same_clients_to_the_same_model(ray_session):
    local = run_simulation(_config(dropout=0.4, server={"aggregator": "median"}))
    on_ray = run_simulation(
        _config(dropout=0.4, server={"aggregator": "median"}),
        overrides=["runtime.backend=ray", "runtime.workers=2"],
    )
    assert on_ray.summary["model_sha256"] == local.summary["model_sha256"]
    assert on_ray.summary["ledger_sha256"] == local.summary["ledger_sha256"]
