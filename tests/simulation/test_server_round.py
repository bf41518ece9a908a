"""The server half's round (`ServerRound`): an `aggregate` override that takes
``server_round`` gets the round index, the run's seeded per-round streams and `emit` into
the round's row; an override written without it still runs. Client dropout after charge:
the charged clients stay charged, the lost ones are not run, the same clients drop on
every run and every backend layout, and algorithms that cannot average what arrives
refuse it in one line naming the field."""

from __future__ import annotations

import pytest

from raydpfl.algorithms.base import server_stream
from raydpfl.api import run_simulation
from raydpfl.config import ConfigError
from raydpfl.experiment.build import build_experiment, make_local_backend
from raydpfl.simulation.experiment import make_server
from tests.conftest import small_config


def _config(**algorithm):
    section = {
        "name": "dp_fedavg",
        "rounds": 3,
        "local_steps": 1,
        "clients_per_round": 6,
        "eval_every": 3,
        "evaluate_clients": False,
        **algorithm,
    }
    return small_config(experiment__algorithm=section, runtime={"seed": 7, "progress": False})


def test_an_aggregate_that_takes_the_round_gets_index_streams_and_emit():
    exp = build_experiment(_config())
    algo = exp.algorithm
    algo.linear_aggregation = False
    seen = []
    base = algo.aggregate

    def aggregate(params, tasks, results, server_round=None):
        seen.append((server_round.index, server_round.seed, server_round.rng("ties").random()))
        server_round.emit("updates_seen", len(results))
        return base(params, tasks, results)

    algo.aggregate = aggregate
    server = make_server(exp)
    with make_local_backend(exp) as backend:
        for r in range(3):
            assert server.run_round(backend, r)
    assert [(i, s) for i, s, _ in seen] == [(0, 7), (1, 7), (2, 7)]
    assert [u for *_, u in seen] == [server_stream(7, r, "ties").random() for r in range(3)]
    assert [row["updates_seen"] for row in server.rows] == [6.0, 6.0, 6.0]


def test_an_override_without_the_keyword_still_runs_to_the_same_model():
    plain = run_simulation(_config())
    exp = build_experiment(_config())
    real = exp.algorithm.aggregate_sum
    exp.algorithm.aggregate_sum = lambda params, tasks, total: real(params, tasks, total)
    server = make_server(exp)
    with make_local_backend(exp) as backend:
        summary = server.run(backend)
    assert summary["model_sha256"] == plain.summary["model_sha256"]


def test_dropout_charges_every_dispatched_client_and_runs_only_the_arrived():
    full = run_simulation(_config())
    dropped = run_simulation(_config(dropout=0.5))
    again = run_simulation(_config(dropout=0.5))
    rows = dropped.history.to_pandas()
    assert (rows["clients_dropped"] > 0).any()
    assert list(rows["clients_trained"] + rows["clients_dropped"]) == [6, 6, 6]
    # the charges are those of the run without dropout: every dispatched client paid
    assert dropped.summary["ledger_sha256"] == full.summary["ledger_sha256"]
    assert dropped.summary["model_sha256"] == again.summary["model_sha256"]
    assert dropped.summary["model_sha256"] != full.summary["model_sha256"]
    assert "clients_dropped" not in full.history.column_names


def test_who_drops_is_the_rounds_own_stream_not_the_aggregation_layout():
    one = run_simulation(_config(dropout=0.3), overrides=["runtime.aggregation_groups=1"])
    many = run_simulation(_config(dropout=0.3), overrides=["runtime.aggregation_groups=6"])
    assert list(one.history["clients_dropped"]) == list(many.history["clients_dropped"])
    assert one.summary["ledger_sha256"] == many.summary["ledger_sha256"]


def test_client_level_dp_fedavg_takes_dropout_with_central_noise():
    section = {"name": "dp_fedavg_client", "rounds": 2, "clients_per_round": 6,
               "local_steps": 1, "dropout": 0.5, "evaluate_clients": False}  # fmt: skip
    run = run_simulation(small_config(experiment__algorithm=section))
    full = run_simulation(small_config(experiment__algorithm={**section, "dropout": 0.0}))
    rows = run.history.to_pandas()
    sampled = list(full.history.to_pandas()["clients_trained"])  # Poisson: varies by round
    assert list(rows["clients_trained"] + rows["clients_dropped"]) == sampled
    assert rows["clients_dropped"].sum() > 0
    assert run.summary["ledger_sha256"] == full.summary["ledger_sha256"]


@pytest.mark.parametrize(
    "section,match",
    [
        ({"name": "dp_fedavg", "dropout": 1.0}, r"must be in \[0, 1\)"),
        ({"name": "dp_fedavg", "dropout": -0.1}, r"must be in \[0, 1\)"),
        ({"name": "ali_dpfl", "dropout": 0.1}, "is for fedavg, dp_fedavg"),
        (
            {
                "name": "dp_fedavg_client",
                "dropout": 0.1,
                "options": {"noise": "distributed", "sampling": "fixed"},
            },
            "options.noise: central",
        ),
    ],
)
def test_dropout_is_refused_in_one_line_where_it_cannot_hold(section, match):
    with pytest.raises(ConfigError, match=match) as err:
        small_config(experiment__algorithm=section)
    assert err.value.field == "experiment.algorithm.dropout"
    assert "\n" not in str(err.value)
