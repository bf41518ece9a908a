"""Every algorithm name the config accepts is built by some builder."""

from __future__ import annotations

import typing

from raydpfl.algorithms import ALGORITHMS
from raydpfl.config.dpfl_bcs import NAMES as BCS_NAMES
from raydpfl.config.schema import AlgorithmName


def test_every_config_name_is_a_registered_class_or_a_bcs_name():
    names = set(typing.get_args(AlgorithmName))

    assert names == set(ALGORITHMS) | set(BCS_NAMES)
    for name, cls in ALGORITHMS.items():
        assert cls.name == name
