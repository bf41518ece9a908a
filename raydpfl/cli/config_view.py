"""What `raydpfl validate` prints: the resolved config, cut to the sections in use.

Every config carries every paper's options block (ALI-DPFL, FedFDP, DPFL-BCS, ...), so
the full tree is 170+ lines of which a run reads a few dozen. A section is left out only
when the run does not read it *and* it holds nothing but defaults, so the printed YAML
still loads back to the same config; a block the user set but the algorithm ignores stays
visible (printing it is how they notice).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import yaml

from raydpfl.config.schema import Config
from raydpfl.papers.dpfl_bcs.options import NAMES as BCS_NAMES
from raydpfl.papers.fedfdp.options import NAMES as FEDFDP_NAMES
from raydpfl.papers.rc_dpfl.options import NAMES as RC_NAMES

#: experiment.algorithm.<block> → the algorithms that read it (their builders do).
ALGORITHM_BLOCKS: dict[str, frozenset[str]] = {
    "ali_dpfl": frozenset({"ali_dpfl", "dp_fedavg_fixed_tau"}),
    "pe_dpfl": frozenset({"pe_dpfl"}),
    "adap_dp_fl": frozenset({"adap_dp_fl"}),
    "fedfdp": frozenset(FEDFDP_NAMES),
    "dpfl_bcs": frozenset(BCS_NAMES),
    "rc_dpfl": frozenset(RC_NAMES),
}

#: experiment.data.<block> → whether the run reads it, given the data section.
DATA_BLOCKS: dict[str, Callable[[Any], bool]] = {
    "synthetic": lambda data: data.dataset == "synthetic",
    "cluster_shift": lambda data: data.cluster_shift.kind != "none",
}


def config_in_use(config: Config) -> tuple[dict[str, Any], list[str]]:
    """The config as a plain tree without the unused default sections, and their paths."""
    tree = dataclasses.asdict(config)
    default = dataclasses.asdict(Config())
    exp, dflt = tree["experiment"], default["experiment"]
    hidden: list[str] = []

    def drop(section: str, key: str, used: bool) -> None:
        node, base = exp[section], dflt[section]
        if not used and node[key] == base[key]:
            del node[key]
            hidden.append(f"experiment.{section}.{key}")

    name = config.experiment.algorithm.name
    for block, users in ALGORITHM_BLOCKS.items():
        drop("algorithm", block, name in users)
    for block, used in DATA_BLOCKS.items():
        drop("data", block, used(config.experiment.data))
    for section in ("data", "model", "algorithm"):  # registered entries' options only
        drop(section, "options", bool(getattr(config.experiment, section).options))
    return tree, hidden


def render(config: Config, everything: bool = False) -> tuple[str, list[str]]:
    """The YAML `validate` prints and the sections it left out (none with `everything`)."""
    if everything:
        tree, hidden = dataclasses.asdict(config), []
    else:
        tree, hidden = config_in_use(config)
    return yaml.safe_dump(tree, sort_keys=False), hidden
