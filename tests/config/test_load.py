import dataclasses
from pathlib import Path

import pytest

from raydpfl.config import Config, ConfigError, config_from_dict, dump_config, load_config

CONFIGS = sorted(
    p
    for p in Path(__file__).resolve().parents[2].joinpath("configs").glob("**/*.yaml")
    if "tune" not in __import__("yaml").safe_load(p.read_text())  # sweeps: tests/tune
)


def _err(raw, overrides=()):
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, overrides)
    return info.value


def test_defaults_build_a_valid_tree():
    config = config_from_dict({})

    assert isinstance(config, Config)
    assert config.experiment.privacy.delta == 1e-5


def test_exponent_without_dot_loads_as_float(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("experiment:\n  privacy:\n    delta: 1e-5\n    epsilon: 2\n")

    config = load_config(path)

    assert config.experiment.privacy.delta == 1e-5
    assert isinstance(config.experiment.privacy.delta, float)
    assert isinstance(config.experiment.privacy.epsilon, float)


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"experiment": {"privacy": {"epsilon": 0}}}, "experiment.privacy.epsilon", "> 0"),
        ({"experiment": {"privacy": {"epsilon": -1}}}, "experiment.privacy.epsilon", "> 0"),
        ({"experiment": {"privacy": {"delta": 1}}}, "experiment.privacy.delta", "(0, 1)"),
        ({"experiment": {"privacy": {"delta": 0}}}, "experiment.privacy.delta", "(0, 1)"),
        (
            {"experiment": {"privacy": {"sampling_rate": 0}}},
            "experiment.privacy.sampling_rate",
            "[1e-06, 1]",
        ),
        (
            {"experiment": {"privacy": {"sampling_rate": 1.5}}},
            "experiment.privacy.sampling_rate",
            "[1e-06, 1]",
        ),
        ({"experiment": {"privacy": {"clip_norm": -1}}}, "experiment.privacy.clip_norm", "> 0"),
        (
            {"experiment": {"privacy": {"noise_multiplier": 0}}},
            "experiment.privacy.noise_multiplier",
            "in [0.01, 1e+06]",
        ),
        (
            {"experiment": {"privacy": {"accountant": "gdp"}}},
            "experiment.privacy.accountant",
            "rdp, prv",
        ),
        (
            {"experiment": {"algorithm": {"clients_per_round": 101}}},
            "experiment.algorithm.clients_per_round",
            "data.num_clients (100)",
        ),
        ({"experiment": {"algorithm": {"rounds": 0}}}, "experiment.algorithm.rounds", ">= 1"),
        (
            {"experiment": {"algorithm": {"name": "fednova"}}},
            "experiment.algorithm.name",
            "dp_fedavg",
        ),
        (
            {"experiment": {"data": {"partition": {"alpha": 0}}}},
            "experiment.data.partition.alpha",
            "> 0",
        ),
        (
            {"experiment": {"data": {"client_test_fraction": 1.0}}},
            "experiment.data.client_test_fraction",
            "[0, 1)",
        ),
        ({"runtime": {"workers": 0}}, "runtime.workers", ">= 1"),
        ({"runtime": {"backend": "spark"}}, "runtime.backend", "local"),
    ],
)
def test_out_of_range_values_are_rejected_with_field_and_allowed(raw, field, words):
    err = _err(raw)

    assert err.field == field
    assert words in str(err)
    assert "\n" not in str(err)


def test_unknown_key_is_rejected_and_lists_allowed_keys():
    err = _err({"experiment": {"privacy": {"epsilonn": 2}}})

    assert err.field == "experiment.privacy.epsilonn"
    assert "allowed here" in str(err) and "epsilon" in str(err)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"experiment": {"algorithm": {"rounds": "ten"}}}, "experiment.algorithm.rounds"),
        ({"experiment": {"algorithm": {"rounds": 2.5}}}, "experiment.algorithm.rounds"),
        ({"experiment": {"algorithm": {"rounds": True}}}, "experiment.algorithm.rounds"),
        ({"experiment": {"privacy": {"epsilon": "big"}}}, "experiment.privacy.epsilon"),
        ({"experiment": {"privacy": []}}, "experiment.privacy"),
        ({"runtime": {"progress": "yes"}}, "runtime.progress"),
    ],
)
def test_wrong_types_are_rejected(raw, field):
    assert _err(raw).field == field


def test_dotted_overrides_with_and_without_experiment_prefix():
    config = config_from_dict(
        {},
        [
            "privacy.epsilon=2",
            "experiment.algorithm.rounds=7",
            "runtime.seed=3",
            "privacy.noise_multiplier=null",
        ],
    )

    assert config.experiment.privacy.epsilon == 2.0
    assert config.experiment.algorithm.rounds == 7
    assert config.runtime.seed == 3
    assert config.experiment.privacy.noise_multiplier is None


def test_unquoted_on_off_are_the_words_not_booleans(tmp_path):
    # YAML 1.1 reads `on` / `off` as true / false; a choice field that offers the words
    # takes them as written, in a file and in an override.
    path = tmp_path / "c.yaml"
    path.write_text("runtime:\n  vectorise_clients: off\n")
    assert load_config(path).runtime.vectorise_clients == "off"
    assert config_from_dict({}, ["runtime.vectorise_clients=on"]).runtime.vectorise_clients == "on"
    # a field without those words still refuses a boolean, naming the choices
    assert "must be one of" in str(_err({}, ["runtime.engine=on"]))


def test_bad_overrides_are_rejected():
    assert "key=value" in str(_err({}, ["privacy.epsilon"]))
    assert _err({}, ["privacy.nope=1"]).field == "experiment.privacy.nope"
    assert _err({}, ["privacy.epsilon=-3"]).field == "experiment.privacy.epsilon"


def test_missing_file_and_bad_yaml_are_config_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiment: [unclosed\n")

    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_load_and_round_trip(path):
    config = load_config(path)

    again = config_from_dict(__import__("yaml").safe_load(dump_config(config)))

    assert again == config
    assert dataclasses.asdict(again) == dataclasses.asdict(config)


def test_aggregation_groups_must_cover_the_ray_workers_only():
    """Fewer groups than workers would leave a Ray worker idle; the local backend has one
    worker whatever `workers` says (a GPU run may want one big vectorised group)."""
    ray_err = _err({"runtime": {"backend": "ray", "workers": 4, "aggregation_groups": 2}})
    local = config_from_dict(
        {"runtime": {"backend": "local", "workers": 4, "aggregation_groups": 1}}
    )

    assert ray_err.field == "runtime.aggregation_groups" and "Ray worker" in str(ray_err)
    assert local.runtime.aggregation_groups == 1
    assert _err({"runtime": {"backend": "local", "aggregation_groups": 0}}).field == (
        "runtime.aggregation_groups"
    )
