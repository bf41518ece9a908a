"""Issue 19 on the server and the workers: a CSR index table trains exactly like the
tuple of arrays it replaces, and the rows' ε figures are the full recomputation's."""

from __future__ import annotations

import dataclasses

import numpy as np

from raydpfl.data.federated import IndexTable
from raydpfl.experiment.build import build_experiment, run_experiment
from tests.conftest import small_config


def _config():
    return small_config(
        experiment__data={
            "num_clients": 30,
            "client_test_fraction": 0.0,
            "synthetic": {"min_samples": 20, "max_samples": 60},
        },
        experiment__algorithm={"rounds": 3, "clients_per_round": 12, "local_steps": 2},
        experiment__privacy={"epsilon": 5.0, "sampling_rate": 0.3},  # 2nd turn refused
    )


def test_index_table_and_tuple_give_the_same_model_and_ledger():
    exp = build_experiment(_config())
    assert isinstance(exp.dataset.client_train, IndexTable)
    table = run_experiment(exp, None)
    fresh = build_experiment(_config())  # a fresh ledger: the first run charged its own
    as_tuples = dataclasses.replace(
        fresh.dataset,
        client_train=tuple(a.copy() for a in fresh.dataset.client_train),
        client_test=tuple(a.copy() for a in fresh.dataset.client_test),
    )
    tuples = run_experiment(dataclasses.replace(fresh, dataset=as_tuples), None)
    assert table["model_sha256"] == tuples["model_sha256"]
    assert table["ledger_sha256"] == tuples["ledger_sha256"]


def test_round_rows_equal_the_full_recomputation():
    exp = build_experiment(_config())
    rows = []
    summary = run_experiment(exp, None, on_round=rows.append)
    assert any(r["clients_refused"] for r in rows), "the budget must refuse some tasks"
    # The ledger rebuilt from its record, every client's ε read from it: brute force.
    ledger = type(exp.ledger).from_dict(exp.ledger.to_dict())
    eps = np.array([ledger.epsilon(c) for c in range(exp.dataset.num_clients)])
    assert summary["epsilon_max"] == float(eps.max())
    assert summary["epsilon_mean"] == float(eps.mean())
    assert rows[-1]["epsilon_max"] == float(eps.max())
    assert rows[-1]["epsilon_mean"] == float(eps.mean())
