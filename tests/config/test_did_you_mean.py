"""A mistyped key or name is refused in one line that names the closest allowed word."""

from __future__ import annotations

import pytest

from raydpfl.cli.main import main
from raydpfl.config import ConfigError, config_from_dict, did_you_mean
from raydpfl.tune.spec import parse_sweep


@pytest.mark.parametrize(
    ("raw", "field", "suggestion"),
    [
        ({"algorithm": {"lrr": 0.1}}, "experiment.algorithm.lrr", "'lr'"),
        (
            {"privacy": {"noise_multiplir": 1.0}},
            "experiment.privacy.noise_multiplir",
            "'noise_multiplier'",
        ),
        ({"algorithm": {"name": "dp_fedvg"}}, "experiment.algorithm.name", "'dp_fedavg'"),
        ({"model": {"name": "logrge"}}, "experiment.model.name", "'logreg'"),
        ({"data": {"dataset": "fashion_mnst"}}, "experiment.data.dataset", "'fashion_mnist'"),
        (
            {"data": {"partition": {"kind": "dirichlett"}}},
            "experiment.data.partition.kind",
            "'dirichlet'",
        ),
    ],
)
def test_a_near_miss_names_the_word_meant(raw, field, suggestion):
    with pytest.raises(ConfigError) as e:
        config_from_dict({"experiment": raw})

    assert e.value.field == field
    assert f"(did you mean {suggestion}?)" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_word_close_to_nothing_gets_no_guess_but_the_plugin_hint():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"experiment": {"algorithm": {"name": "my_own_thing"}}})

    assert "did you mean" not in str(e.value)
    assert "--plugin FILE" in str(e.value)


def test_did_you_mean_picks_the_closest_and_ignores_non_strings():
    assert did_you_mean("clip_nrom", ["clip_norm", "epsilon"]) == " (did you mean 'clip_norm'?)"
    assert did_you_mean("zzzz", ["clip_norm", "epsilon"]) == ""
    assert did_you_mean(3, ["clip_norm"]) == ""


def test_tune_section_keys_and_metrics_get_suggestions():
    base = {"experiment": {"data": {"dataset": "synthetic"}}}
    with pytest.raises(
        ConfigError,
        match=r"^tune\.num_sample: unknown key \(did you mean "
        r"'num_samples'\?\)",
    ):
        parse_sweep({**base, "tune": {"num_sample": 2, "space": {}}})
    with pytest.raises(ConfigError, match=r"did you mean 'test_accuracy'\?"):
        parse_sweep({**base, "tune": {"metric": "test_acuracy", "space": {}}})


def test_the_cli_prints_the_suggestion_in_its_one_line_and_exits_2(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("experiment:\n  data: {dataset: synthetic}\n  algorithm: {name: fedavgg}\n")

    code = main(["validate", str(config), "--no-data"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "experiment.algorithm.name" in err and "(did you mean 'fedavg'?)" in err
