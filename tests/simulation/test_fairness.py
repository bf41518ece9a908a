"""Fairness metrics on hand-computed inputs (shared/specs/fedfdp.md §3.2, §11 A11)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raydpfl.simulation.fairness import (
    fairness_metrics,
    psi,
    weighted_mean_and_variance,
    worst_fraction_mean,
    worst_fraction_size,
)


def test_psi_is_the_p_weighted_variance_of_client_losses():
    # p = [1/4, 1/4, 1/2], F = 1/4 + 2/4 + 4/2 = 2.75,
    # Ψ = (1.75² + 0.75²)/4 + 1.25²/2 = 0.765625 + 0.140625 + 0.78125.
    assert psi([1.0, 2.0, 4.0], [10, 10, 20]) == pytest.approx(1.6875, rel=1e-15)
    assert psi([1.0, 2.0, 4.0]) == pytest.approx(14 / 9, rel=1e-15)  # uniform p
    assert psi([3.0, 3.0, 3.0], [1, 2, 3]) == 0.0
    assert psi([5.0, 1.0], [1, 0]) == 0.0  # a zero-weight client does not count


def test_psi_of_a_diverged_client_is_infinite():
    assert psi([1.0, math.inf], [1, 1]) == math.inf
    assert psi([1.0, math.nan]) == math.inf
    with pytest.raises(ValueError, match="-inf"):
        psi([1.0, -math.inf])


def test_weighted_mean_and_variance_by_hand():
    mean, var = weighted_mean_and_variance([0.9, 0.5, 0.7], [1, 1, 2])

    assert mean == pytest.approx(0.7)  # 0.225 + 0.125 + 0.35
    assert var == pytest.approx(0.02)  # (0.04 + 0.04)/4 + 0


@pytest.mark.parametrize(
    ("n", "k"), [(1, 1), (9, 1), (10, 1), (11, 2), (20, 2), (25, 3), (30, 3), (50, 5), (100, 10)]
)
def test_worst_ten_percent_is_the_ceiling_of_n_over_ten(n, k):
    assert worst_fraction_size(n) == k
    assert worst_fraction_size(n) == (n + 9) // 10


def test_worst_fraction_size_is_not_fooled_by_rounding():
    assert math.ceil(0.07 * 100) == 8  # 0.07·100 = 7.000000000000001
    assert worst_fraction_size(100, fraction=0.07) == 7


def test_worst_fraction_mean_by_hand():
    values = np.arange(20, dtype=float)[::-1] / 20  # 0.95 .. 0.0

    assert worst_fraction_mean(values) == pytest.approx(0.025)  # mean of 0.0 and 0.05
    assert worst_fraction_mean([0.3, 0.1, 0.2]) == pytest.approx(0.1)
    assert worst_fraction_mean([0.4, 0.1, 0.2, 0.3], fraction=0.5) == pytest.approx(0.15)
    assert worst_fraction_size(10, fraction=0.3) == 3


def test_fairness_metrics_dictionary():
    out = fairness_metrics(
        losses=[1.0, 2.0, 4.0, 1.0], accuracies=[0.9, 0.5, 0.7, 0.8], weights=[1, 1, 2, 0]
    )

    assert out == pytest.approx(
        {
            "psi": 1.6875,
            "loss_mean": 2.75,
            "acc_mean": 0.725,
            "acc_var": 0.021875,  # (0.175² + 0.225² + 0.025² + 0.075²)/4
            "acc_std": math.sqrt(0.021875),
            "acc_mean_weighted": 0.7,
            "acc_var_weighted": 0.02,
            "acc_std_weighted": math.sqrt(0.02),
            "acc_worst": 0.5,
            "acc_worst10": 0.5,  # N = 4 → the single worst client
        },
        rel=1e-12,
    )
    assert all(type(v) is float for v in out.values())
    assert set(fairness_metrics(losses=[1.0, 2.0])) == {"psi", "loss_mean"}
    assert "psi" not in fairness_metrics(accuracies=[1.0, 2.0])
    assert fairness_metrics(losses=[1.0, math.inf])["loss_mean"] == math.inf


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "losses, accuracies"),
        ({"losses": []}, "non-empty"),
        ({"losses": [[1.0, 2.0]]}, "1-D"),
        ({"losses": ["a"]}, "real"),
        ({"losses": [1.0, 2.0], "accuracies": [0.5]}, "differ in length"),
        ({"losses": [1.0, 2.0], "weights": [1.0]}, "weights has 1"),
        ({"losses": [1.0, 2.0], "weights": [1.0, -1.0]}, ">= 0"),
        ({"losses": [1.0, 2.0], "weights": [0.0, 0.0]}, "positive sum"),
        ({"accuracies": [0.5, math.nan]}, "finite"),
        ({"losses": [1.0, math.inf], "weights": [1.0, -1.0]}, ">= 0"),
    ],
)
def test_bad_inputs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fairness_metrics(**kwargs)


def test_worst_fraction_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_clients"):
        worst_fraction_size(0)
    with pytest.raises(ValueError, match="fraction"):
        worst_fraction_size(10, fraction=0.0)
    with pytest.raises(ValueError, match="fraction"):
        worst_fraction_mean([1.0], fraction=math.nan)
