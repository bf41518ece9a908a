"""The small DPFL-BCS run shared by the DPFL-BCS, PRIVATEFL and regression tests (not a
test module)."""

from __future__ import annotations

import numpy as np

from tests.conftest import override

#: Clients of `bcs_args`'s population.
BCS_CLIENTS = 8


def bcs_args(**kw) -> dict:
    """Keyword arguments of a small `DpflBcs` (or subclass): 8 clients with budgets and
    sizes drawn from a fixed seed, 12 rounds, 3 stage-1 rounds, Gaussian; `kw` overrides."""
    rng = np.random.default_rng(0)
    args = dict(
        clients_per_round=3,
        rounds=12,
        lr=0.1,
        lr_decay_tau=200.0,
        clip_norm=2.0,
        mechanism="gaussian",
        epsilons=rng.uniform(0.5, 4.0, BCS_CLIENTS),
        deltas=rng.uniform(1e-5, 1e-4, BCS_CLIENTS),
        train_sizes=rng.integers(50, 300, BCS_CLIENTS),
        num_params=100,
        stage1_rounds=3,
    )
    args.update(kw)
    return args


def bcs_config(name: str, **sections) -> dict:
    """A raw config: `name` (a DPFL-BCS-section algorithm) on 10 digits clients with the
    linear model for 8 rounds; `sections` override parts as `tests.conftest.override`
    does (``experiment__algorithm__dpfl_bcs={...}`` merges into the section)."""
    raw = {
        "experiment": {
            "name": "bcs-test",
            "data": {
                "dataset": "digits",
                "num_clients": 10,
                "partition": {"kind": "dirichlet", "alpha": 3.0},
                "client_test_fraction": 0.0,
            },
            "model": {"name": "bcs_linear"},
            "algorithm": {
                "name": name,
                "rounds": 8,
                "clients_per_round": 4,
                "lr": 0.5,
                "eval_every": 8,
                "evaluate_clients": False,
                "dpfl_bcs": {"stage1_rounds": 3, "epsilon_min": 1.0, "epsilon_max": 8.0},
            },
            "privacy": {"clip_norm": 5.0},
        },
        "runtime": {"backend": "local", "seed": 0, "progress": False, "cpus_per_worker": 1},
    }
    return override(raw, **sections)
