"""Single-release calibrations (raydpfl.privacy.accounting.single_release) against
independent formulas."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm

from raydpfl.privacy.accounting.single_release import (
    gaussian_sigma_analytic,
    gaussian_sigma_classic,
    gaussian_sigma_zcdp,
    laplace_scale,
    zcdp_epsilon,
    zcdp_rho,
)


def _gaussian_delta(sigma: float, sensitivity: float, eps: float) -> float:
    """Balle & Wang 2018, Theorem 8, written with scipy.stats (not the module's code)."""
    a, b = sensitivity / (2 * sigma), eps * sigma / sensitivity
    return norm.cdf(a - b) - math.exp(eps) * norm.cdf(-a - b)


@pytest.mark.parametrize("eps,delta,sens", [(0.5, 1e-5, 1.0), (1.0, 1e-6, 2.0), (8.0, 1e-5, 0.3)])
def test_the_analytic_gaussian_is_the_smallest_sigma_that_certifies_delta(eps, delta, sens):
    sigma = gaussian_sigma_analytic(sens, eps, delta)
    assert _gaussian_delta(sigma, sens, eps) <= delta
    assert _gaussian_delta(sigma * (1 - 1e-6), sens, eps) > delta


def test_the_classic_gaussian_is_theorem_a1_and_never_below_the_analytic():
    sigma = gaussian_sigma_classic(2.0, 0.5, 1e-5)
    assert sigma == pytest.approx(math.sqrt(2 * math.log(1.25e5)) * 2.0 / 0.5, rel=1e-15)
    assert sigma >= gaussian_sigma_analytic(2.0, 0.5, 1e-5)
    with pytest.raises(ValueError, match="epsilon < 1"):
        gaussian_sigma_classic(1.0, 1.0, 1e-5)


@pytest.mark.parametrize("eps,delta", [(0.1, 1e-5), (1.0, 1e-6), (10.0, 1e-3)])
def test_zcdp_rho_inverts_the_bun_steinke_conversion(eps, delta):
    rho = zcdp_rho(eps, delta)
    assert rho + 2 * math.sqrt(rho * math.log(1 / delta)) == pytest.approx(eps, rel=1e-12)
    assert zcdp_epsilon(rho, delta) == pytest.approx(eps, rel=1e-12)
    # sigma = Δ/sqrt(2ρ) is ρ-zCDP: Δ²/(2σ²) = ρ
    sigma = gaussian_sigma_zcdp(3.0, rho)
    assert 3.0**2 / (2 * sigma**2) == pytest.approx(rho, rel=1e-12)


def test_laplace_scale_and_bad_input_name_the_argument():
    assert laplace_scale(2.0, 0.5) == 4.0
    for call, name in [
        (lambda: laplace_scale(0.0, 1.0), "sensitivity"),
        (lambda: laplace_scale(1.0, math.inf), "epsilon"),
        (lambda: zcdp_rho(1.0, 1.0), "delta"),
        (lambda: zcdp_epsilon(-1.0, 1e-5), "rho"),
    ]:
        with pytest.raises(ValueError, match=name):
            call()
