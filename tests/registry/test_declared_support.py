"""A plug-in declares what the core checks through `raydpfl.register_algorithm`'s keyword
arguments: dropout (its server averages what arrives), server (it takes a server
optimizer and aggregator) and audit support."""

from __future__ import annotations

import pytest

import raydpfl
from raydpfl import registry
from raydpfl.algorithms import DPFedAvg
from raydpfl.config import ConfigError, config_from_dict

BASE = {
    "experiment": {
        "data": {
            "dataset": "synthetic",
            "num_clients": 8,
            "synthetic": {
                "num_features": 10,
                "num_classes": 3,
                "min_samples": 40,
                "max_samples": 60,
            },
            "client_test_fraction": 0.2,
        },
        "model": {"name": "logreg"},
        "algorithm": {"rounds": 4, "clients_per_round": 6, "local_steps": 2, "lr": 0.3},
        "privacy": {"epsilon": 20.0, "delta": 1e-3, "noise_multiplier": 1.0, "sampling_rate": 0.2},
    },
    "runtime": {"backend": "local", "seed": 3, "progress": False},
}
DROPOUT_AND_SERVER = {
    "dropout": 0.3,
    "server": {"optimizer": "momentum", "lr": 0.5, "momentum": 0.8, "aggregator": "median"},
}


def _raw(name: str, **algorithm) -> dict:
    import json

    raw = json.loads(json.dumps(BASE))
    raw["experiment"]["algorithm"].update(name=name, **algorithm)
    return raw


@pytest.fixture
def plugin_names():
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister("algorithm", name)


def test_an_algorithm_that_does_not_declare_them_is_refused_dropout_and_server(plugin_names):
    @raydpfl.register_algorithm("undeclared_dpfedavg")
    class Undeclared(DPFedAvg):
        pass

    plugin_names.append("undeclared_dpfedavg")
    with pytest.raises(
        ConfigError,
        match=r"^experiment\.algorithm\.dropout: is for .*not "
        r"'undeclared_dpfedavg'",
    ):
        config_from_dict(_raw("undeclared_dpfedavg", dropout=0.3))
    with pytest.raises(
        ConfigError,
        match=r"^experiment\.algorithm\.server: is for .*not "
        r"'undeclared_dpfedavg'",
    ):
        config_from_dict(_raw("undeclared_dpfedavg", server=DROPOUT_AND_SERVER["server"]))


def test_a_plugin_opting_into_dropout_and_server_runs_as_the_built_in_does(plugin_names):
    @raydpfl.register_algorithm("declared_dpfedavg", dropout=True, server=True)
    class Declared(DPFedAvg):
        """DP-FedAvg as a user's subclass: same client half, same server."""

    plugin_names.append("declared_dpfedavg")
    entry = registry.get("algorithm", "declared_dpfedavg")
    assert {registry.DROPOUT_TAG, registry.SERVER_OPTIMIZER_TAG} <= entry.tags

    mine = raydpfl.run_simulation(_raw("declared_dpfedavg", **DROPOUT_AND_SERVER))
    builtin = raydpfl.run_simulation(_raw("dp_fedavg", **DROPOUT_AND_SERVER))
    plain = raydpfl.run_simulation(_raw("declared_dpfedavg", dropout=0.3))

    # The server settings reached the plug-in: the built-in's model bit for bit, and not
    # the model of the default server (plain mean, sgd at lr 1).
    assert mine.model_sha256 == builtin.model_sha256
    assert plain.model_sha256 != mine.model_sha256
    dropped = mine.history.column("clients_dropped").to_pylist()
    assert sum(dropped) > 0  # 30% of 24 dispatched updates lost, on the run's seed
    assert dropped == builtin.history.column("clients_dropped").to_pylist()


def test_only_dropout_opts_into_dropout_not_into_the_server(plugin_names):
    @raydpfl.register_algorithm("dropout_only", dropout=True)
    class DropoutOnly(DPFedAvg):
        pass

    plugin_names.append("dropout_only")
    assert config_from_dict(_raw("dropout_only", dropout=0.3)).experiment.algorithm.dropout == 0.3
    with pytest.raises(ConfigError, match=r"experiment\.algorithm\.server"):
        config_from_dict(_raw("dropout_only", server={"optimizer": "adam"}))


def test_audit_support_is_declared_and_checked(plugin_names):
    from raydpfl.audit.run import auditable, loop_auditable

    @raydpfl.register_algorithm("audited_dpfedavg", audit="dp_fedavg")
    class Audited(DPFedAvg):
        pass

    @raydpfl.register_algorithm("refused_audit", notes={"audit": "its noise is secret"})
    class Refused(DPFedAvg):
        pass

    plugin_names.extend(["audited_dpfedavg", "refused_audit"])
    assert auditable()["audited_dpfedavg"] == "record"
    assert "audited_dpfedavg" not in loop_auditable()
    assert "refused_audit" not in auditable()
    with pytest.raises(
        registry.RegistryError, match="audit must be one of dp_fedavg, dp_sgd_loop, client"
    ):
        raydpfl.register_algorithm("bad_audit", audit="white_box")
