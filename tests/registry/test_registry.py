"""The one registry: built-ins are in it, a user's algorithm, model or dataset registers
once and is then named in a config like a built-in (options validated, errors named)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint

import numpy as np
import pytest
from torch import nn

import raydpfl
from raydpfl import registry
from raydpfl.algorithms import DPFedAvg
from raydpfl.config import ConfigError, config_from_dict
from raydpfl.config.schema import (
    BUILTIN_ALGORITHMS,
    BUILTIN_DATASETS,
    BUILTIN_MODELS,
    shipped_names,
)
from raydpfl.data.datasets import ArrayDataset, load_dataset
from raydpfl.models.zoo import LogisticRegression

BASE = {
    "experiment": {
        "data": {"dataset": "digits", "num_clients": 6, "partition": {"kind": "iid"}},
        "model": {"name": "mlp", "hidden": 16},
        "algorithm": {"rounds": 2, "clients_per_round": 3, "local_steps": 2, "lr": 0.5},
        "privacy": {"epsilon": 8.0, "delta": 1e-4, "sampling_rate": 0.2},
    },
    "runtime": {"backend": "local", "seed": 0, "progress": False},
}


def _config(**sections):
    import json

    raw = json.loads(json.dumps(BASE))
    for section, values in sections.items():
        raw["experiment"][section].update(values)
    return raw


@pytest.fixture
def clean_registry():
    """Whatever a test registers is removed afterwards."""
    before = {kind: set(registry.names(kind)) for kind in registry.KINDS}
    yield
    for kind in registry.KINDS:
        for name in set(registry.names(kind)) - before[kind]:
            registry.unregister(kind, name)


def test_every_built_in_name_is_in_the_one_registry():
    import raydpfl.experiment.builders
    import raydpfl.models  # noqa: F401

    builtin = {
        kind: {n for n in registry.names(kind) if registry.get(kind, n).builtin}
        for kind in ("algorithm", "model")
    }
    assert builtin["algorithm"] == set(shipped_names("algorithm"))
    assert builtin["model"] == set(shipped_names("model"))
    # The core's own names, then the seed papers' (registered through the plugin group).
    assert set(BUILTIN_ALGORITHMS) == {"fedavg", "dp_fedavg"}
    assert {"ali_dpfl", "fedfdp", "dpfl_bcs", "rc_dpfl"} <= builtin["algorithm"]
    assert set(BUILTIN_MODELS) < builtin["model"]
    for name in shipped_names("algorithm"):
        assert callable(registry.get("algorithm", name).load())
    assert set(BUILTIN_DATASETS) >= {"digits", "synthetic"}


@dataclass(frozen=True)
class MomentumOptions:
    momentum: float = 0.9
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.momentum < 1:
            raise ConfigError("momentum", f"must be in [0, 1), got {self.momentum}")


class Momentum(DPFedAvg):
    name = "test_momentum"

    def __init__(self, *, momentum: float, server_lr: float, **dp_fedavg) -> None:
        super().__init__(**dp_fedavg)
        self.momentum, self.server_lr = momentum, server_lr


def test_a_registered_algorithm_is_built_from_its_name_and_options(clean_registry):
    raydpfl.register_algorithm("test_momentum", options=MomentumOptions)(Momentum)
    raw = _config(algorithm={"name": "test_momentum", "options": {"momentum": 0.5}})
    from raydpfl.experiment import build_experiment

    exp = build_experiment(config_from_dict(raw))
    algo = exp.algorithm
    assert isinstance(algo, Momentum)
    assert (algo.momentum, algo.server_lr) == (0.5, 1.0)  # options, then their defaults
    assert (algo.clients_per_round, algo.local_steps, algo.lr) == (3, 2, 0.5)
    assert (algo.clip_norm, algo.sampling_rate, algo.noise_multiplier) == (1.0, 0.2, 1.0)
    assert exp.ledger is not None and exp.ledger.epsilon_budget == 8.0
    result = raydpfl.run_simulation(raw)
    assert result.summary["algorithm"] == "test_momentum"
    assert 0 < result.epsilon <= 8.0


def test_a_null_sigma_is_calibrated_for_a_registered_algorithm(clean_registry):
    raydpfl.register_algorithm("test_momentum", options=MomentumOptions)(Momentum)
    from raydpfl.experiment import build_experiment
    from raydpfl.privacy.accounting.calibration import noise_multiplier_for

    raw = _config(
        algorithm={"name": "test_momentum"}, privacy={"noise_multiplier": None, "epsilon": 3.0}
    )
    exp = build_experiment(config_from_dict(raw))
    want = noise_multiplier_for(3.0, 1e-4, 0.2, 2 * 2, "rdp")  # rounds × local_steps steps
    assert exp.algorithm.noise_multiplier == pytest.approx(want)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"momentun": 0.5}, r"^experiment\.algorithm\.options\.momentun: unknown key"),
        ({"momentum": "high"}, r"^experiment\.algorithm\.options\.momentum: must be a number"),
        ({"momentum": 1.5}, r"^experiment\.algorithm\.options\.momentum: must be in \[0, 1\)"),
    ],
)
def test_bad_options_of_a_registered_algorithm_are_named(clean_registry, options, message):
    raydpfl.register_algorithm("test_momentum", options=MomentumOptions)(Momentum)
    from raydpfl.experiment import build_experiment

    raw = _config(algorithm={"name": "test_momentum", "options": options})
    with pytest.raises(ConfigError, match=message):
        build_experiment(config_from_dict(raw))


def test_names_are_checked_against_the_registry(clean_registry):
    with pytest.raises(ConfigError, match=r"^experiment\.algorithm\.name: must be one of .*"):
        config_from_dict(_config(algorithm={"name": "test_momentum"}))
    raydpfl.register_algorithm("test_momentum")(Momentum)
    config_from_dict(_config(algorithm={"name": "test_momentum"}))  # now it is known
    with pytest.raises(registry.RegistryError, match="already registered"):
        raydpfl.register_algorithm("test_momentum")(DPFedAvg)
    with pytest.raises(ConfigError, match=r"^experiment\.algorithm\.options: is for registered"):
        config_from_dict(_config(algorithm={"name": "dp_fedavg", "options": {"x": 1}}))


@dataclass(frozen=True)
class WidthOptions:
    width: int = 8


def _tiny_mlp(input_shape, num_classes, width: int = 8) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(int(np.prod(input_shape)), width),
        nn.ReLU(),
        nn.Linear(width, num_classes),
    )


def test_a_registered_model_with_options_is_named_in_the_config(clean_registry):
    raydpfl.register_model("test_tiny_mlp", options=WidthOptions)(_tiny_mlp)
    raw = _config(model={"name": "test_tiny_mlp", "options": {"width": 5}})
    result = raydpfl.run_simulation(raw)
    assert result.params["1.weight"].shape == (5, 64)
    bad = _config(model={"name": "test_tiny_mlp", "options": {"depth": 2}})
    with pytest.raises(ConfigError, match=r"^experiment\.model\.options\.depth: unknown key"):
        raydpfl.run_simulation(bad)


def test_a_registered_model_must_be_dp_compatible(clean_registry):
    raydpfl.register_model("test_bn")(
        lambda shape, k: nn.Sequential(nn.Flatten(), nn.BatchNorm1d(64))
    )
    with pytest.raises(ConfigError, match=r"^model: .*BatchNorm"):
        raydpfl.run_simulation(_config(model={"name": "test_bn"}))


def test_a_registered_dataset_is_partitioned_like_a_built_in(clean_registry):
    digits = load_dataset("digits")

    @raydpfl.register_dataset("test_even_digits")
    def even_digits(root):
        keep, keep_test = digits.y_train % 2 == 0, digits.y_test % 2 == 0
        return ArrayDataset(
            name="test_even_digits",
            x_train=digits.x_train[keep],
            y_train=digits.y_train[keep],
            x_test=digits.x_test[keep_test],
            y_test=digits.y_test[keep_test],
            num_classes=10,
            input_shape=digits.input_shape,
        )

    result = raydpfl.run_simulation(_config(data={"dataset": "test_even_digits"}))
    assert result.summary["dataset"] == "test_even_digits"
    assert result.summary["final_test_accuracy"] is not None


def test_entry_points_register_names_lazily(clean_registry, monkeypatch):
    """A third-party package's entry point: the name is known at once, the object is
    imported when it is built."""
    import importlib.metadata

    # Any importable object serves: here the zoo's logistic regression under a new name.
    point = EntryPoint("test_ep_model", "raydpfl.models.zoo:LogisticRegression", "raydpfl.models")
    real = importlib.metadata.entry_points

    def entry_points(**kw):
        return [point] if kw.get("group") == "raydpfl.models" else real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", set())
    assert "test_ep_model" in registry.names("model")
    assert registry.get("model", "test_ep_model").load() is LogisticRegression
    result = raydpfl.run_simulation(_config(model={"name": "test_ep_model"}))
    assert {t.shape for t in result.params.values()} == {(10, 64), (10,)}


def test_the_cli_names_what_a_plugin_file_registers(clean_registry, tmp_path, capsys):
    """`raydpfl run --plugin FILE`: the example's algorithm and model, named in YAML."""
    import json
    from pathlib import Path

    import yaml

    from raydpfl.cli.main import main

    example = Path(__file__).resolve().parents[2] / "examples" / "dp_fedavg_server_momentum.py"
    raw = _config(
        algorithm={"name": "dp_fedavg_server_momentum", "options": {"momentum": 0.5}},
        model={"name": "small_cnn"},
    )
    raw["experiment"]["model"].pop("hidden")
    config = tmp_path / "momentum.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(config)]) == 2  # unknown names without the plugin
    assert "experiment.model.name: must be one of" in capsys.readouterr().err
    out = tmp_path / "run"
    args = ["run", str(config), "--plugin", str(example), "--out", str(out), "--no-progress"]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "dp_fedavg_server_momentum"
    assert main(["validate", str(config), "--plugin", "no_such_module_xyz"]) == 2
    assert "--plugin: cannot import 'no_such_module_xyz'" in capsys.readouterr().err


def test_a_models_options_are_read_off_its_factory_when_it_has_no_dataclass(tmp_path):
    from raydpfl.config import ConfigError
    from raydpfl.experiment.plugins import registered_model_factory

    def wide_mlp(input_shape, num_classes, hidden: int = 16, dropout: float | None = None):
        return nn.Sequential(
            nn.Flatten(), nn.Linear(int(np.prod(input_shape)), hidden),
            nn.ReLU(), nn.Linear(hidden, num_classes),
        )  # fmt: skip

    registry.register("model", "_wide_mlp", wide_mlp)
    try:
        factory = registered_model_factory("_wide_mlp", {"hidden": 7}, (1, 4, 4), 3)
        assert factory()[1].out_features == 7
        with pytest.raises(ConfigError) as e:
            registered_model_factory("_wide_mlp", {"hiden": 7}, (1, 4, 4), 3)
        assert e.value.field == "experiment.model.options.hiden"
        with pytest.raises(ConfigError, match="must be an integer"):
            registered_model_factory("_wide_mlp", {"hidden": "big"}, (1, 4, 4), 3)
    finally:
        registry.unregister("model", "_wide_mlp")
