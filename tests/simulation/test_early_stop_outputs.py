"""A run that stops early (every client's budget spent) on a round `eval_every` skipped
still ends with its final round scored and every client's ε and size in clients.parquet,
with or without per-client scoring (the rows were missing: the outputs were closed before
the final model was scored)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from raydpfl.api import run_simulation
from tests.conftest import small_config


@pytest.mark.parametrize("client_test_fraction", [0.0, 0.2])
def test_the_last_round_of_an_early_stop_is_listed(tmp_path, client_test_fraction):
    config = small_config(
        experiment__algorithm={"rounds": 40, "eval_every": 7, "evaluate_clients": True},
        experiment__privacy={"epsilon": 3.3},  # stops after round 10
        experiment__data={"client_test_fraction": client_test_fraction},
    )
    result = run_simulation(config, run_dir=tmp_path / "run")
    done = result.summary["rounds_completed"]
    assert result.summary["stop_reason"] == "privacy budget exhausted for every client"
    assert 0 < done < 40 and done % 7 != 0  # it stops on a round eval_every skips
    clients = pq.read_table(tmp_path / "run" / "clients.parquet").to_pandas()
    last = clients[clients["round"] == done]
    assert sorted(last["client_id"]) == list(range(12))
    assert (last["epsilon"] > 0).all() and (last["num_examples"] > 0).all()
    rows = result.history.to_pandas()
    if client_test_fraction:
        assert last["num_test_examples"].gt(0).all()
        assert rows["client_accuracy_mean"].iloc[-1] == pytest.approx(last["test_accuracy"].mean())
    else:
        assert (last["num_test_examples"] == 0).all()
