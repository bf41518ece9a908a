"""The round loop on the local backend: ledger discipline, determinism, learning."""

import json

import numpy as np
import pytest

from raydpfl.experiment.build import build_experiment, run_experiment
from tests.conftest import small_config


def test_ledger_is_charged_once_per_participation_and_matches_epsilons():
    exp = build_experiment(small_config())

    summary = run_experiment(exp, None)

    ledger = exp.ledger
    total_steps = sum(ledger.steps(c) for c in range(12))
    assert total_steps == 4 * 4 * 3  # rounds × cohort × τ
    assert summary["epsilon_max"] == pytest.approx(max(ledger.epsilon(c) for c in range(12)))
    assert summary["epsilon_max"] <= 50.0


def test_tasks_beyond_a_client_budget_are_refused_and_the_run_stops_when_all_are_spent():
    # 3 steps of σ=1, q=0.1 cost ε=2.61 (RDP), 6 steps 3.03: a budget of 2.8 allows one round.
    config = small_config(
        experiment__algorithm={
            "name": "dp_fedavg",
            "rounds": 20,
            "clients_per_round": 12,
            "local_steps": 3,
            "lr": 0.5,
        },
        experiment__privacy={"epsilon": 2.8, "noise_multiplier": 1.0, "sampling_rate": 0.1},
    )
    exp = build_experiment(config)

    summary = run_experiment(exp, None)

    assert summary["rounds_completed"] == 1
    assert summary["stop_reason"] == "privacy budget exhausted for every client"
    assert all(exp.ledger.steps(c) == 3 for c in range(12))
    assert summary["epsilon_max"] <= 2.8


def test_refused_clients_do_not_train_but_others_do():
    config = small_config(
        experiment__algorithm={
            "name": "dp_fedavg",
            "rounds": 6,
            "clients_per_round": 8,
            "local_steps": 3,
            "lr": 0.5,
        },
        experiment__privacy={"epsilon": 2.8},
    )
    exp = build_experiment(config)

    run_experiment(exp, None)

    assert all(exp.ledger.steps(c) in (0, 3) for c in range(12))
    assert max(exp.ledger.epsilon(c) for c in range(12)) <= 2.8


def test_same_seed_gives_identical_model_and_other_seed_differs():
    a = run_experiment(build_experiment(small_config()), None)
    b = run_experiment(build_experiment(small_config()), None)
    c = run_experiment(
        build_experiment(small_config(runtime={"seed": 1, "progress": False})), None
    )

    assert a["model_sha256"] == b["model_sha256"]
    assert a["ledger_sha256"] == b["ledger_sha256"]
    assert a["model_sha256"] != c["model_sha256"]


def test_calibrated_noise_never_overshoots_the_budget():
    config = small_config(
        experiment__privacy={"epsilon": 3.0, "noise_multiplier": None, "sampling_rate": 0.1}
    )
    exp = build_experiment(config)

    summary = run_experiment(exp, None)

    assert exp.metadata["privacy"]["noise_calibrated"] is True
    assert summary["stop_reason"] == "completed all rounds"
    assert summary["epsilon_max"] <= 3.0


def test_run_directory_holds_every_promised_output(tmp_path):
    exp = build_experiment(small_config())

    run_experiment(exp, tmp_path)

    import pyarrow.parquet as pq

    rounds = pq.read_table(tmp_path / "rounds.parquet").to_pandas()
    clients = pq.read_table(tmp_path / "clients.parquet").to_pandas()
    summary = json.loads((tmp_path / "summary.json").read_text())
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    for col in [
        "round",
        "test_accuracy",
        "test_loss",
        "epsilon_max",
        "epsilon_mean",
        "local_steps",
        "wall_seconds",
    ]:
        assert col in rounds.columns
    for col in ["round", "client_id", "test_accuracy", "test_loss", "epsilon", "num_examples"]:
        assert col in clients.columns
    for key in [
        "final_test_accuracy",
        "best_test_accuracy",
        "epsilon_max",
        "delta",
        "accountant",
        "rounds_completed",
        "wall_seconds",
        "model_sha256",
        "unaccounted_releases",
    ]:
        assert key in summary
    assert list(rounds["round"]) == [1, 2, 3, 4]
    assert len(clients) == 4 * 12
    assert summary["epsilon_max"] == pytest.approx(rounds["epsilon_max"].iloc[-1])
    assert np.allclose(clients[clients["round"] == 4]["epsilon"].max(), summary["epsilon_max"])
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "model.pt").exists()
    assert ledger["delta"] == 1e-5
    import torch

    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert set(state) == {"linear.weight", "linear.bias"}
