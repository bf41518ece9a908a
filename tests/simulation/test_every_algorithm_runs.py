"""Every algorithm the config accepts runs two rounds end to end on the local backend.

On the CPU in CI; on a GPU where one is visible (``RAYDPFL_TEST_DEVICE`` overrides), which
is how the device bugs of the GPU path were found: results handed back on the wrong
device, constants kept on the CPU by a client half, and so on.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from raydpfl.config import ConfigError, config_from_dict, schema
from raydpfl.experiment.build import build_experiment, make_local_backend, make_server
from tests.conftest import small_config
from tests.papers.dpfl_bcs.dpfl_bcs_helpers import bcs_config

DEVICE = os.environ.get("RAYDPFL_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
ALGORITHMS = schema.shipped_names("algorithm")


def _candidates(name: str):
    """Small configs to try, in order, until one suits the algorithm."""
    two = {"experiment__algorithm__rounds": 2, "runtime__device": DEVICE}
    yield lambda: small_config(experiment__algorithm__name=name, **two)
    # clustered algorithms train every client every round
    yield lambda: small_config(
        experiment__algorithm__name=name, experiment__algorithm__clients_per_round=12, **two
    )
    for mechanism in ("gaussian", "laplace"):  # the DPFL-BCS section's algorithms
        yield lambda mechanism=mechanism: config_from_dict(
            bcs_config(
                name,
                experiment__algorithm__rounds=4,
                experiment__algorithm__eval_every=2,
                experiment__algorithm__dpfl_bcs={"stage1_rounds": 2, "mechanism": mechanism},
                experiment__data__client_test_fraction=0.2,
                runtime__device=DEVICE,
            )
        )


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_algorithm_trains_on_the_device(name):
    errors = []
    for make in _candidates(name):
        try:
            exp = build_experiment(make())
            break
        except ConfigError as e:
            errors.append(str(e))
    else:
        pytest.skip(f"{name} needs data no small config here builds: {errors[-1]}")

    server = make_server(exp)
    server.run(make_local_backend(exp))

    assert server.rounds_completed >= 1
    # the server's parameters stay on the CPU whatever device the clients trained on
    assert all(t.device.type == "cpu" for t in server.params.values())
    assert all(torch.isfinite(t).all() for t in server.params.values())
    assert any(math.isfinite(r.get("test_loss", math.nan)) for r in server.rows)
