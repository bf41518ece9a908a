"""The Python sweep API: `raydpfl.run_sweep(config, space, ...)` returns the results table,
with the user's algorithm class and model factory in every trial."""

from __future__ import annotations

import pytest
import torch

import raydpfl
from raydpfl import registry
from raydpfl.algorithms import DPFedAvg
from raydpfl.config import ConfigError

CONFIG = {
    "experiment": {
        "name": "python-sweep",
        "data": {
            "dataset": "digits",
            "num_clients": 6,
            "partition": {"kind": "iid"},
            "client_test_fraction": 0.2,
        },
        "algorithm": {"rounds": 2, "clients_per_round": 3, "local_steps": 1},
        "privacy": {"epsilon": 50.0, "delta": 1e-3, "noise_multiplier": 1.0, "sampling_rate": 0.2},
    },
    "runtime": {"backend": "local", "seed": 5},
}
SPACE = {"algorithm.lr": {"grid": [0.1, 0.5]}}


class NotebookDPFedAvg(DPFedAvg):
    """A user's algorithm class, never registered by hand."""


def small_mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10)
    )


@pytest.fixture
def clean_registry():
    before = set(registry.names("algorithm"))
    yield
    for name in set(registry.names("algorithm")) - before:
        registry.unregister("algorithm", name)


@pytest.mark.slow  # a real Ray Tune sweep
@pytest.mark.ray
def test_a_tiny_sweep_from_python_returns_its_table_with_the_users_objects(clean_registry):
    seen = []

    result = raydpfl.run_sweep(
        CONFIG,
        SPACE,
        algorithm=NotebookDPFedAvg,
        model=small_mlp,
        max_concurrent_trials=1,
        server_cpus=0.5,
        on_progress=seen.append,
    )

    rows = result.table.to_pylist()
    assert [r["status"] for r in rows] == ["completed", "completed"]
    assert [r["experiment.algorithm.lr"] for r in rows] == [0.1, 0.5]
    assert result.sweep_dir is None  # kept only in memory
    best = max(rows, key=lambda r: r["metric_last"])
    assert result.summary["best_trial"] == best["trial_id"]
    assert result.best_config.experiment.algorithm.name == "NotebookDPFedAvg"
    assert result.best_config.experiment.algorithm.lr == best["experiment.algorithm.lr"]
    assert seen[-1]["done"] == seen[-1]["total"] == 2
    # Each trial is the simulation of its config with the same objects, bit for bit.
    for r in rows:
        overrides = [
            "algorithm.name=NotebookDPFedAvg",
            f"algorithm.lr={r['experiment.algorithm.lr']}",
        ]
        alone = raydpfl.run_simulation(CONFIG, overrides=overrides, model=small_mlp)
        assert alone.model_sha256 == r["model_sha256"]


def test_an_algorithm_instance_is_refused_before_any_work():
    instance = NotebookDPFedAvg(
        clients_per_round=3,
        local_steps=1,
        lr=0.1,
        clip_norm=1.0,
        noise_multiplier=1.0,
        sampling_rate=0.2,
    )

    with pytest.raises(ConfigError, match=r"^algorithm: .*pass the class NotebookDPFedAvg"):
        raydpfl.run_sweep(CONFIG, SPACE, algorithm=instance)


def test_a_bad_space_is_a_named_config_error():
    with pytest.raises(
        ConfigError, match=r"^tune\.space\.experiment\.algorithm\.lrr: .*did you mean .lr."
    ):
        raydpfl.run_sweep(CONFIG, {"algorithm.lrr": {"grid": [0.1]}})


def test_a_sweep_that_ran_python_objects_is_not_resumed_without_them(tmp_path, capsys):
    import json

    import yaml

    from raydpfl.cli.main import main

    sweep_dir = tmp_path / "sweep"
    (sweep_dir / "trials").mkdir(parents=True)
    (sweep_dir / "sweep.yaml").write_text(yaml.safe_dump({**CONFIG, "tune": {"space": SPACE}}))
    recorded = f"python:{__name__}.small_mlp"
    state = {"format": 1, "plugins": [], "objects": {"model": recorded}, "trials": []}
    (sweep_dir / "sweep_state.json").write_text(json.dumps(state))

    code = main(["tune", "--resume", str(sweep_dir)])

    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"ran the model {__name__}.small_mlp from Python" in err
    assert "raydpfl.resume_sweep(" in err
    with pytest.raises(ConfigError, match="not the config entry"):
        raydpfl.resume_sweep(sweep_dir)
    with pytest.raises(ConfigError, match="from Python, not .*torch.nn"):
        raydpfl.resume_sweep(sweep_dir, model=torch.nn.Identity)
