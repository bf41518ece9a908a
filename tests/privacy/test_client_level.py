"""Client-level accounting and the population ledger (`raydpfl.privacy.accounting.client_level`).

Every ε is compared with an independent dp-accounting computation built here from the
events themselves, not from the module's helpers.
"""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting import pld
from dp_accounting.rdp import RdpAccountant

from raydpfl.privacy.accounting.client_level import (
    POPULATION,
    ClientLevelCost,
    ClientLevelLedger,
    client_level_epsilon,
    client_level_max_rounds,
    client_level_noise_multiplier,
)
from raydpfl.privacy.accounting.ledger import PrivacyCost

DELTA = 1e-5


def _dp_rdp_poisson(sigma: float, q: float, rounds: int) -> float:
    acc = RdpAccountant()
    acc.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), rounds
    )
    return acc.get_epsilon(DELTA)


def _pld_poisson(sigma: float, q: float, rounds: int) -> float:
    acc = pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), rounds
    )
    return acc.get_epsilon(DELTA)


def _rdp_without_replacement(sigma: float, n: int, k: int, rounds: int) -> float:
    """Replace-one adjacency: the clipped sum's sensitivity is 2S, so std/sensitivity = σ/2."""
    acc = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(
            n, k, dp_accounting.GaussianDpEvent(sigma / 2.0)
        ),
        rounds,
    )
    return acc.get_epsilon(DELTA)


@pytest.mark.parametrize("sigma,q,rounds", [(1.0, 0.1, 50), (0.8, 0.02, 300), (2.0, 1.0, 10)])
def test_poisson_epsilon_agrees_with_dp_accounting_and_is_never_below_pld(sigma, q, rounds):
    cost = ClientLevelCost(sigma, "poisson", 1000, sampling_rate=q, steps=rounds)
    ours_dp_rdp = client_level_epsilon([cost], DELTA, "dp_rdp")
    assert ours_dp_rdp == pytest.approx(_dp_rdp_poisson(sigma, q, rounds), rel=1e-9)
    ours_pld = client_level_epsilon([cost], DELTA, "pld")
    assert ours_pld == pytest.approx(_pld_poisson(sigma, q, rounds), rel=1e-6)
    # Every accountant is an upper bound: none reports below PLD's (tightest) value.
    reference = _pld_poisson(sigma, q, rounds)
    for accountant in ("rdp", "dp_rdp", "prv", "pld"):
        assert client_level_epsilon([cost], DELTA, accountant) >= reference * (1 - 1e-6)


@pytest.mark.parametrize("sigma,n,k,rounds", [(2.0, 100, 10, 20), (4.0, 1000, 50, 100)])
def test_fixed_size_sampling_is_the_without_replacement_event_under_replace_one(
    sigma, n, k, rounds
):
    cost = ClientLevelCost(sigma, "fixed", n, cohort_size=k, steps=rounds)
    expected = _rdp_without_replacement(sigma, n, k, rounds)
    assert client_level_epsilon([cost], DELTA, "rdp") == pytest.approx(expected, rel=1e-12)
    assert client_level_epsilon([cost], DELTA, "dp_rdp") == pytest.approx(expected, rel=1e-12)
    # Split into charges of one round each, the composition is the same.
    one = ClientLevelCost(sigma, "fixed", n, cohort_size=k, steps=1)
    assert client_level_epsilon([one] * rounds, DELTA, "rdp") == pytest.approx(expected)
    # The event is not the Poisson one at q = K/N with σ (that would under-count: 2S).
    poisson = client_level_epsilon(
        [ClientLevelCost(sigma, "poisson", n, sampling_rate=k / n, steps=rounds)], DELTA, "rdp"
    )
    assert expected > poisson


@pytest.mark.parametrize("accountant", ["pld", "prv"])
def test_fixed_size_sampling_refuses_accountants_that_cannot_account_it(accountant):
    cost = ClientLevelCost(2.0, "fixed", 100, cohort_size=10, steps=3)
    with pytest.raises(ValueError, match="fixed-size client sampling"):
        client_level_epsilon([cost], DELTA, accountant)


@pytest.mark.parametrize(
    "cost",
    [
        ClientLevelCost(0.0, "poisson", 100, sampling_rate=0.1, steps=1),
        ClientLevelCost(0.0, "fixed", 100, cohort_size=10, steps=1),
    ],
)
def test_no_noise_is_infinite_epsilon(cost):
    assert client_level_epsilon([cost], DELTA, "rdp") == math.inf


@pytest.mark.parametrize(
    "template",
    [
        ClientLevelCost(0.0, "poisson", 200, sampling_rate=0.05),
        ClientLevelCost(0.0, "fixed", 200, cohort_size=10),
    ],
)
def test_calibrated_sigma_spends_at_most_the_budget_and_a_bit_less_noise_would_not(template):
    rounds, target = 40, 3.0
    sigma = client_level_noise_multiplier(target, DELTA, template, rounds, "rdp")

    def eps(s: float) -> float:
        return client_level_epsilon(
            [
                ClientLevelCost(
                    s, template.sampling, 200, template.sampling_rate, template.cohort_size, rounds
                )
            ],
            DELTA,
            "rdp",
        )

    assert eps(sigma) <= target < eps(sigma - 2e-3)
    most = client_level_max_rounds(
        target,
        DELTA,
        template.with_steps(1).__class__(
            sigma, template.sampling, 200, template.sampling_rate, template.cohort_size
        ),
    )
    assert most >= rounds


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(sampling="poisson", sampling_rate=0.0), "sampling_rate"),
        (dict(sampling="poisson", sampling_rate=1.5), "sampling_rate"),
        (dict(sampling="fixed", cohort_size=101), "cohort_size"),
        (dict(sampling="fixed", cohort_size=0), "cohort_size"),
        (dict(sampling="uniform", sampling_rate=0.1), "sampling"),
    ],
)
def test_bad_costs_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ClientLevelCost(1.0, population=100, **kwargs)


# ---- the population ledger ---------------------------------------------------------------------
def _round(sigma: float = 2.0) -> ClientLevelCost:
    return ClientLevelCost(sigma, "poisson", 50, sampling_rate=0.2)


def test_the_ledger_charges_rounds_and_refuses_the_one_that_would_exceed_the_budget():
    per_round = client_level_epsilon([_round()], DELTA, "rdp")
    ledger = ClientLevelLedger("rdp", DELTA, 3.0, population=50)
    charged = 0
    while not ledger.would_exceed(POPULATION, _round()):
        ledger.charge(POPULATION, _round())
        charged += 1
    assert charged == client_level_max_rounds(3.0, DELTA, _round())
    assert charged > 1 and per_round < ledger.epsilon() <= 3.0
    assert ledger.epsilon_after(POPULATION, _round()) > 3.0
    with pytest.raises(ValueError, match="budget"):
        ledger.charge(POPULATION, _round())
    assert ledger.rounds() == charged  # nothing recorded by the refused charge
    # Every client holds the population's ε.
    assert list(ledger.epsilons(range(50))) == [ledger.epsilon()] * 50


def test_try_charge_charges_like_charge_and_refuses_without_recording():
    ledger = ClientLevelLedger("rdp", DELTA, 3.0, population=50)
    reference = ClientLevelLedger("rdp", DELTA, 3.0, population=50)
    while (eps := ledger.try_charge(POPULATION, _round())) is not None:
        assert eps == reference.charge(POPULATION, _round()) == ledger.epsilon()
    assert ledger.rounds() == reference.rounds() == client_level_max_rounds(3.0, DELTA, _round())
    assert ledger.try_charge(POPULATION, _round()) is None
    assert ledger.rounds() == reference.rounds()  # nothing recorded by the refusal


def test_the_ledger_never_mixes_units():
    ledger = ClientLevelLedger("rdp", DELTA, 3.0, population=50)
    record = PrivacyCost(noise_multiplier=1.0, sampling_rate=0.1, steps=3)
    with pytest.raises(ValueError, match="units never mix"):
        ledger.would_exceed(3, record)
    with pytest.raises(ValueError, match="population"):
        ledger.charge(3, _round())
    ledger.charge(POPULATION, _round())
    with pytest.raises(ValueError, match="one client-sampling scheme"):
        ledger.charge(POPULATION, ClientLevelCost(1.0, "fixed", 50, cohort_size=5))


def test_the_ledger_round_trips_through_its_dict_and_the_charge_log():
    from raydpfl.simulation.integrity import GENESIS, ChargeBatch, next_chain, rebuild_ledger

    ledger = ClientLevelLedger("rdp", DELTA, 10.0, population=50)
    batches, chain = [], GENESIS
    for r in range(4):
        ledger.charge(POPULATION, _round())
        charges = [[POPULATION, _round().to_dict()]]
        chain = next_chain(chain, r, charges)
        batches.append(ChargeBatch(r, charges, chain))
    back = ClientLevelLedger.from_dict(ledger.to_dict())
    assert back.to_dict() == ledger.to_dict() and back.sha256() == ledger.sha256()
    assert back.epsilon() == ledger.epsilon()
    rebuilt = rebuild_ledger(ClientLevelLedger("rdp", DELTA, 10.0, population=50), batches)
    assert isinstance(rebuilt, ClientLevelLedger)
    assert rebuilt.sha256() == ledger.sha256() and rebuilt.epsilon() == ledger.epsilon()
