"""A registered algorithm's options: ``options:`` or its section, one config either way."""

import dataclasses

import pytest

from raydpfl import registry
from raydpfl.config import ConfigError, config_from_dict


def _algorithm(**algorithm):
    return config_from_dict({"experiment": {"algorithm": algorithm}}).experiment.algorithm


def test_a_papers_section_and_options_are_one_config_with_defaults_filled_in():
    by_section = _algorithm(name="ali_dpfl", ali_dpfl={"gamma": 5})
    by_options = _algorithm(name="ali_dpfl", options={"gamma": 5})

    assert by_section == by_options
    assert by_section.options["gamma"] == 5.0 and by_section.options["tau_max"] == 100
    assert by_section.typed_options().gamma == 5.0


def test_the_same_key_given_both_ways_must_agree():
    assert _algorithm(name="ali_dpfl", ali_dpfl={"gamma": 5}, options={"gamma": 5})
    with pytest.raises(ConfigError, match="gamma given twice"):
        _algorithm(name="ali_dpfl", ali_dpfl={"gamma": 5}, options={"gamma": 6})


def test_another_algorithms_section_is_checked_then_left_out():
    # A FedFDP preset runs its baselines with --set algorithm.name=...: the section stays
    # valid, is checked, and is not part of the config of the algorithm that runs.
    algo = _algorithm(name="dp_fedavg", fedfdp={"lam": 0.5})
    assert algo.options == {}
    with pytest.raises(ConfigError) as e:
        _algorithm(name="dp_fedavg", fedfdp={"lam": -1})
    assert e.value.field == "experiment.algorithm.fedfdp.lam"


def test_a_bad_option_names_its_section():
    with pytest.raises(ConfigError) as e:
        _algorithm(name="rc_dpfl", rc_dpfl={"batch_size": 0})
    assert e.value.field == "experiment.algorithm.rc_dpfl.batch_size"


@dataclasses.dataclass(frozen=True)
class _Options:
    momentum: float = 0.0


def test_a_users_algorithm_may_declare_a_section_like_a_paper():
    registry.register(
        "algorithm",
        "_sectioned",
        "raydpfl.algorithms.dp_fedavg:DPFedAvg",
        options=_Options,
        section="_sectioned",
    )
    try:
        algo = _algorithm(name="_sectioned", _sectioned={"momentum": 0.9})
        assert algo.options == {"momentum": 0.9}
    finally:
        registry.unregister("algorithm", "_sectioned")


def test_the_seed_papers_register_through_the_plugin_entry_points():
    from importlib.metadata import entry_points

    plugins = {e.name: e.value for e in entry_points(group=registry.PLUGIN_GROUP)}
    assert plugins["ali_dpfl"] == "raydpfl.papers.ali_dpfl:register"
    assert {"ali_dpfl", "fedfdp", "dpfl_bcs", "rc_dpfl"} <= set(plugins)
    assert registry.get("algorithm", "fedfdp").section == "fedfdp"
    assert "regression" in registry.get("model", "bcs_linreg").tags


@pytest.mark.parametrize("first", ["raydpfl.papers.rc_dpfl", "raydpfl.papers.fedfdp.options"])
def test_a_paper_imported_before_the_config_still_registers(first):
    # The registry calls a paper's register() while raydpfl.config may be loading; a paper
    # imported first must not leave itself half-initialised for that call.
    import subprocess
    import sys

    code = (
        f"import {first}; from raydpfl.config import config_from_dict; "
        "c = config_from_dict({'experiment': {'algorithm': {'name': 'rc_dpfl'}}}); "
        "print(c.experiment.algorithm.options['num_clusters'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.split() == ["4"]
