"""Tests for raydpfl.privacy.accounting.calibration."""

from __future__ import annotations

import pytest

from raydpfl.privacy.accounting.accountants import compute_epsilon
from raydpfl.privacy.accounting.calibration import (
    MAX_STEPS_CAP,
    epsilon_for,
    max_steps_for,
    noise_multiplier_for,
)

DELTA = 1e-5


def test_noise_multiplier_opacus_v4_rdp_steps():
    # opacus test_get_noise_multiplier_rdp_steps: eps=8, delta=1e-5, q=0.04, 2000 steps.
    sigma = noise_multiplier_for(8.0, DELTA, 0.04, 2000, "rdp")

    assert 1.3562 <= sigma <= 1.3575
    assert epsilon_for(sigma, 0.04, 2000, DELTA, "rdp") <= 8.0


@pytest.mark.parametrize(
    ("target", "q", "steps"),
    [(1.0, 0.01, 1000), (3.0, 0.05, 778), (8.0, 0.04, 2250), (0.5, 1.0, 1), (10.0, 0.02, 200)],
)
def test_noise_multiplier_round_trip_is_conservative_and_tight(target, q, steps):
    precision = 1e-3

    sigma = noise_multiplier_for(target, DELTA, q, steps, "rdp", precision=precision)

    assert compute_epsilon([(sigma, q, steps)], DELTA, "rdp") <= target
    assert compute_epsilon([(sigma - precision, q, steps)], DELTA, "rdp") > target


def test_noise_multiplier_round_trip_dp_rdp():
    sigma = noise_multiplier_for(3.0, DELTA, 0.05, 778, "dp_rdp", precision=1e-2)

    assert epsilon_for(sigma, 0.05, 778, DELTA, "dp_rdp") <= 3.0
    assert epsilon_for(sigma - 1e-2, 0.05, 778, DELTA, "dp_rdp") > 3.0


def test_noise_multiplier_identity_mechanism_needs_no_noise():
    assert noise_multiplier_for(1.0, DELTA, 0.0, 100) == 0.0
    assert noise_multiplier_for(1.0, DELTA, 0.1, 0) == 0.0


def test_noise_multiplier_unreachable_target_raises():
    with pytest.raises(ValueError, match="sigma_max"):
        noise_multiplier_for(1e-3, DELTA, 1.0, 1000, sigma_max=2.0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"target_epsilon": 0.0}, "target_epsilon"),
        ({"target_epsilon": -1.0}, "target_epsilon"),
        ({"target_epsilon": float("inf")}, "target_epsilon"),
        ({"delta": 0.0}, "delta"),
        ({"sampling_rate": 1.1}, "sampling_rate"),
        ({"steps": -3}, "steps"),
        ({"accountant": "gdp"}, "accountant"),
        ({"sigma_max": 0.0}, "sigma_max"),
        ({"precision": -1e-3}, "precision"),
    ],
)
def test_noise_multiplier_invalid_inputs(kwargs, name):
    args = {"target_epsilon": 1.0, "delta": DELTA, "sampling_rate": 0.1, "steps": 10}
    args.update(kwargs)

    with pytest.raises(ValueError, match=name):
        noise_multiplier_for(**args)


@pytest.mark.parametrize(
    ("target", "sigma", "q", "accountant"),
    [(3.0, 1.1, 0.015, "rdp"), (8.0, 1.1, 0.015, "rdp"), (2.0, 1.0, 0.05, "dp_rdp")],
)
def test_max_steps_for_is_largest_feasible(target, sigma, q, accountant):
    # ALI-DPFL setting (sigma=1.1, q=0.015): only the defining property is asserted.
    steps = max_steps_for(target, DELTA, sigma, q, accountant)

    assert steps >= 1
    assert epsilon_for(sigma, q, steps, DELTA, accountant) <= target
    assert epsilon_for(sigma, q, steps + 1, DELTA, accountant) > target


def test_max_steps_for_with_prior_history():
    prior = [(2.0, 0.02, 300), (1.5, 0.01, 100)]

    steps = max_steps_for(3.0, DELTA, 1.1, 0.015, "rdp", history=prior)

    assert compute_epsilon([*prior, (1.1, 0.015, steps)], DELTA, "rdp") <= 3.0
    assert compute_epsilon([*prior, (1.1, 0.015, steps + 1)], DELTA, "rdp") > 3.0
    assert steps < max_steps_for(3.0, DELTA, 1.1, 0.015, "rdp")


def test_max_steps_for_returns_zero_when_one_step_exceeds():
    assert max_steps_for(0.1, DELTA, 0.5, 1.0) == 0
    assert max_steps_for(1.0, DELTA, 0.0, 0.1) == 0


def test_max_steps_for_returns_zero_when_history_already_exceeds():
    assert max_steps_for(1.0, DELTA, 5.0, 0.001, history=[(0.5, 1.0, 10)]) == 0


def test_max_steps_for_cap_is_reported():
    with pytest.warns(RuntimeWarning, match="cap"):
        steps = max_steps_for(1.0, DELTA, 1.0, 0.0)

    assert steps == MAX_STEPS_CAP


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"target_epsilon": 0.0}, "target_epsilon"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"sampling_rate": -0.5}, "sampling_rate"),
        ({"delta": 2.0}, "delta"),
        ({"history": [(1.0, 0.1, -1)]}, "steps"),
    ],
)
def test_max_steps_for_invalid_inputs(kwargs, name):
    args = {"target_epsilon": 1.0, "delta": DELTA, "noise_multiplier": 1.0, "sampling_rate": 0.1}
    args.update(kwargs)

    with pytest.raises(ValueError, match=name):
        max_steps_for(**args)


def test_epsilon_for_matches_compute_epsilon():
    assert epsilon_for(1.5, 0.04, 2250, DELTA) == compute_epsilon([(1.5, 0.04, 2250)], DELTA)


def test_epsilon_for_invalid_steps():
    with pytest.raises(ValueError, match="steps"):
        epsilon_for(1.0, 0.1, 1.5, DELTA)
