"""Laplace, declared-(ε, δ) and zCDP accounting (issue 6), against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

from raydpfl.privacy.accounting.accountants import (
    compute_epsilon,
    compute_epsilon_extended,
    laplace_rdp,
)
from raydpfl.privacy.accounting.ledger import PrivacyCost


def _renyi_laplace_numeric(b: float, alpha: float) -> float:
    # D_α(Lap(0, b) ‖ Lap(1, b)) by quadrature: (1/(α−1)) log ∫ p^α q^{1−α}.
    def integrand(x: float) -> float:
        log_p = -abs(x) / b - math.log(2 * b)
        log_q = -abs(x - 1) / b - math.log(2 * b)
        return math.exp(alpha * log_p + (1 - alpha) * log_q)

    val = sum(
        integrate.quad(integrand, lo, hi, limit=200)[0]
        for lo, hi in ((-np.inf, 0.0), (0.0, 1.0), (1.0, np.inf))
    )
    return math.log(val) / (alpha - 1)


@pytest.mark.parametrize("b", [0.5, 2.0, 10.0])
def test_laplace_rdp_is_mironovs_closed_form(b):
    orders = [1.5, 2.0, 5.0, 20.0]
    closed = laplace_rdp(b, orders)
    numeric = [_renyi_laplace_numeric(b, a) for a in orders]
    np.testing.assert_allclose(closed, numeric, rtol=1e-6)
    # Never above the pure-DP bound 1/b.
    assert np.all(closed <= 1 / b + 1e-12)


@pytest.mark.parametrize("accountant", ["rdp", "dp_rdp", "pld", "zcdp"])
def test_laplace_composition_never_exceeds_basic_composition(accountant):
    history = [("laplace", 4.0, 10)]  # 10 releases, each 0.25-DP
    eps = compute_epsilon_extended(history, 1e-5, accountant)
    assert 0 < eps <= 2.5 + 1e-12
    # At δ = 0 only pure composition applies: exactly Σ 1/b.
    assert compute_epsilon_extended(history, 0.0, accountant) == pytest.approx(2.5, rel=1e-12)


def test_one_laplace_release_is_tight_under_pld():
    eps = compute_epsilon_extended([("laplace", 2.0, 1)], 1e-6, "pld")
    assert eps == pytest.approx(0.5, abs=2e-3)


def test_prv_refuses_laplace_with_a_clear_error():
    with pytest.raises(ValueError, match="Laplace"):
        compute_epsilon_extended([("laplace", 1.0, 1)], 1e-5, "prv")


def test_gaussian_only_history_is_unchanged():
    history = [(1.1, 0.05, 30), (0.9, 0.1, 5)]
    for acc in ("rdp", "dp_rdp"):
        assert compute_epsilon_extended(history, 1e-5, acc) == compute_epsilon(history, 1e-5, acc)
    history = [(1.1, 1.0, 3), (2.0, 1.0, 2)]  # full batch: fast under PLD
    for acc in ("rdp", "pld"):
        assert compute_epsilon_extended(history, 1e-5, acc) == compute_epsilon(history, 1e-5, acc)


def test_zcdp_accountant_is_the_bun_steinke_conversion():
    sigma, steps, delta = 3.0, 7, 1e-5
    rho = steps / (2 * sigma**2)
    expected = rho + 2 * math.sqrt(rho * math.log(1 / delta))
    assert compute_epsilon_extended([(sigma, 1.0, steps)], delta, "zcdp") == pytest.approx(
        expected, rel=1e-12
    )
    with pytest.raises(ValueError, match="sampling_rate"):
        compute_epsilon_extended([(sigma, 0.5, steps)], delta, "zcdp")


def test_declared_releases_compose_basically():
    history = [("approx_dp", 0.1, 1e-6, 5), ("approx_dp", 0.2, 2e-6, 1)]
    assert compute_epsilon_extended(history, 7e-6, "rdp") == pytest.approx(0.7)
    # Their δ's exceed the target: nothing can be certified.
    assert compute_epsilon_extended(history, 6e-6, "rdp") == math.inf
    # Mixed with a Gaussian: the Gaussian is accounted at the remaining δ, then added.
    mixed = [*history, (2.0, 1.0, 3)]
    gauss_part = compute_epsilon([(2.0, 1.0, 3)], 1e-5 - 7e-6, "rdp")
    assert compute_epsilon_extended(mixed, 1e-5, "rdp") == pytest.approx(0.7 + gauss_part)


def test_privacy_cost_new_mechanisms_validate_and_round_trip():
    lap = PrivacyCost(2.0, 1.0, 1, "laplace")
    approx = PrivacyCost(5.0, 1.0, 1, "approx_dp", epsilon=0.1, delta=1e-7)
    for cost in (lap, approx):
        assert PrivacyCost.from_dict(cost.to_dict()) == cost
    assert "epsilon" not in PrivacyCost(1.0, 0.1, 1).to_dict()
    with pytest.raises(ValueError, match="sampling_rate"):
        PrivacyCost(2.0, 0.5, 1, "laplace")
    with pytest.raises(ValueError, match="epsilon"):
        PrivacyCost(2.0, 1.0, 1, "approx_dp")
    with pytest.raises(ValueError, match="approx_dp"):
        PrivacyCost(2.0, 1.0, 1, "laplace", epsilon=0.1, delta=0.0)
