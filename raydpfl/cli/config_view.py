"""What `raydpfl validate` prints: the resolved config, cut to the sections in use.

Every config carries every core data block (synthetic, cluster_shift) and the registered
entries' ``options``; a section is left out only when the run does not read it *and* it
holds nothing but defaults, so the printed YAML still loads back to the same config; a
block the user set but the run ignores stays visible (printing it is how they notice). A
seed paper's options are its algorithm's resolved ``options`` (its section folded in).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import yaml

from raydpfl.config.schema import Config

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
