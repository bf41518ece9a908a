"""Private runs on small real data must learn: accuracy clearly above chance."""

import numpy as np
import pytest

from raydpfl.config import config_from_dict
from raydpfl.experiment.build import build_experiment, run_experiment
from tests.conftest import FASHION_MNIST_DIR, small_config


def _run(raw):
    exp = build_experiment(config_from_dict(raw))
    return exp, run_experiment(exp, None)


def test_dp_fedavg_on_synthetic_beats_the_majority_class():
    config = small_config(experiment__algorithm={"rounds": 15, "clients_per_round": 6})
    exp = build_experiment(config)

    summary = run_experiment(exp, None)

    majority = np.bincount(exp.dataset.y_test).max() / len(exp.dataset.y_test)
    assert summary["final_test_accuracy"] > majority + 0.25
    assert summary["epsilon_max"] <= config.experiment.privacy.epsilon


@pytest.mark.slow  # a whole training (12-16 s on 2 cores)
def test_dp_fedavg_on_digits_learns_under_a_spent_budget():
    raw = {
        "experiment": {
            "data": {"dataset": "digits", "num_clients": 10, "partition": {"kind": "iid"}},
            "model": {"name": "mlp", "hidden": 64},
            "algorithm": {"rounds": 15, "clients_per_round": 5, "local_steps": 5, "lr": 1.0},
            "privacy": {
                "epsilon": 10.0,
                "delta": 1e-4,
                "noise_multiplier": 0.8,
                "sampling_rate": 0.2,
            },
        },
        "runtime": {"progress": False},
    }

    _, summary = _run(raw)

    assert summary["final_test_accuracy"] > 0.6  # chance is 0.1
    assert 0 < summary["epsilon_max"] <= 10.0


@pytest.mark.slow  # a whole training (12-16 s on 2 cores)
def test_nonprivate_fedavg_on_digits_learns_and_reports_no_epsilon():
    raw = {
        "experiment": {
            "data": {
                "dataset": "digits",
                "num_clients": 10,
                "partition": {"kind": "dirichlet", "alpha": 1.0},
            },
            "model": {"name": "mlp", "hidden": 64},
            "algorithm": {
                "name": "fedavg",
                "rounds": 10,
                "clients_per_round": 5,
                "local_steps": 10,
                "lr": 0.1,
                "batch_size": 16,
            },
        },
        "runtime": {"progress": False},
    }

    _, summary = _run(raw)

    assert summary["final_test_accuracy"] > 0.8
    assert summary["private"] is False and summary["epsilon_max"] is None


@pytest.mark.slow  # a whole training (about 17 s on 2 cores)
@pytest.mark.skipif(not FASHION_MNIST_DIR.exists(), reason="Debian dataset-fashion-mnist absent")
def test_dp_fedavg_cnn_on_fashion_mnist_learns():
    raw = {
        "experiment": {
            "data": {
                "dataset": "fashion_mnist",
                "num_clients": 20,
                "partition": {"kind": "dirichlet", "alpha": 0.5},
                "client_test_fraction": 0.0,
            },
            "model": {"name": "fedavg_cnn"},
            "algorithm": {
                "rounds": 3,
                "clients_per_round": 4,
                "local_steps": 5,
                "lr": 0.5,
                "eval_every": 3,
            },
            "privacy": {"epsilon": 10.0, "noise_multiplier": 1.0, "sampling_rate": 0.02},
        },
        "runtime": {"progress": False},
    }

    exp, summary = _run(raw)

    assert exp.dataset.x.shape[1:] == (1, 28, 28)
    assert summary["final_test_accuracy"] > 0.35  # chance is 0.1
    assert summary["epsilon_max"] <= 10.0


def test_rounds_table_keeps_columns_that_appear_only_on_evaluated_rounds(tmp_path):
    import pyarrow.parquet as pq

    config = small_config(experiment__algorithm={"rounds": 4, "eval_every": 2})
    exp = build_experiment(config)
    (tmp_path / "run").mkdir()

    run_experiment(exp, tmp_path / "run")

    table = pq.read_table(tmp_path / "run" / "rounds.parquet").to_pydict()
    assert table["round"] == [1, 2, 3, 4]
    for column in ("client_accuracy_mean", "fair_psi", "fair_acc_worst", "fair_acc_worst10"):
        values = table[column]
        assert values[0] is None and values[2] is None  # rounds 1 and 3 were not evaluated
        assert values[1] is not None and values[3] is not None
