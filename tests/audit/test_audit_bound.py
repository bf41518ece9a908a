"""The one-run audit bound (Steinke, Nasr & Jagielski 2023) against independent values."""

import math

import numpy as np
import pytest

from raydpfl.audit.bound import correct_guesses, epsilon_lower_bound, p_value


def _binom_sf(v, r, q):
    """P[Binomial(r, q) >= v] by exact summation (no scipy)."""
    return sum(math.comb(r, i) * q**i * (1 - q) ** (r - i) for i in range(v, r + 1))


def _p_value_direct(m, r, v, eps, delta):
    """The paper's δ > 0 p-value written out term by term."""
    q = math.exp(eps) / (1 + math.exp(eps))
    pmf = [math.comb(r, i) * q**i * (1 - q) ** (r - i) for i in range(r + 1)]
    alpha = max(sum(pmf[v - i : v]) / i for i in range(1, v + 1))
    return min(_binom_sf(v, r, q) + 2 * m * delta * alpha, 1.0)


@pytest.mark.parametrize("r", [1, 10, 40, 200])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_all_correct_guesses_give_the_closed_form(r, confidence):
    # (e^ε/(1+e^ε))^r = 1 − confidence  ⇔  ε = logit((1 − confidence)^(1/r))
    t = (1 - confidence) ** (1 / r)
    expected = math.log(t / (1 - t))

    got = epsilon_lower_bound(1000, r, r, delta=0.0, confidence=confidence)

    assert got == pytest.approx(max(expected, 0.0), abs=1e-5)


@pytest.mark.parametrize(
    ("m", "r", "v", "eps", "delta"),
    [
        (1000, 200, 161, 1.0, 1e-5),
        (200, 40, 38, 1.4, 1e-3),
        (100, 20, 12, 0.3, 0.0),
        (50, 50, 50, 2.0, 1e-4),
        (1000, 100, 70, 0.0, 1e-6),
    ],
)
def test_p_value_matches_the_papers_formula_term_by_term(m, r, v, eps, delta):
    assert p_value(m, r, v, eps, delta) == pytest.approx(
        _p_value_direct(m, r, v, eps, delta), rel=1e-9, abs=1e-12
    )


def test_the_bound_is_where_the_p_value_crosses_the_level():
    m, r, v, delta = 1000, 200, 161, 1e-5
    lb = epsilon_lower_bound(m, r, v, delta=delta, confidence=0.95)

    assert lb > 0
    assert p_value(m, r, v, lb - 1e-4, delta) < 0.05 <= p_value(m, r, v, lb + 1e-4, delta)


def test_chance_level_guessing_bounds_nothing_and_delta_only_loosens():
    assert epsilon_lower_bound(1000, 200, 100, confidence=0.95) == 0.0
    assert epsilon_lower_bound(1000, 0, 0, confidence=0.95) == 0.0
    tight = epsilon_lower_bound(200, 40, 38, delta=0.0)
    loose = epsilon_lower_bound(200, 40, 38, delta=1e-3)
    assert 0 < loose < tight


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5, 1.5])
def test_confidence_must_be_inside_the_unit_interval(confidence):
    with pytest.raises(ValueError, match="confidence"):
        epsilon_lower_bound(10, 5, 5, confidence=confidence)


def test_guesses_take_the_top_and_bottom_scores():
    scores = np.array([0.1, 5.0, -3.0, 2.0, 0.0, -1.0])
    included = np.array([False, True, False, False, True, True])
    rng = np.random.default_rng(0)

    # top 2: indices 1 (in, right), 3 (out, wrong); bottom 2: 2 (out, right), 5 (in, wrong)
    assert correct_guesses(scores, included, 2, 2, rng) == 2
    assert correct_guesses(scores, included, 1, 1, rng) == 2
    with pytest.raises(ValueError):
        correct_guesses(scores, included, 4, 3, rng)
