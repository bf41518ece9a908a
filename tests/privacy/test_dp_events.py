"""Every charge maps one to one onto dp-accounting's typed DpEvents, and dp-accounting's own
accountants composing those events give the ledger's ε (an independent computation)."""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from raydpfl.privacy.accounting.client_level import ClientLevelCost, client_level_epsilon
from raydpfl.privacy.accounting.ledger import PrivacyCost, PrivacyLedger
from raydpfl.privacy.mechanisms.client_level_mechanisms import (
    ClientGaussianSum,
    GaussianShare,
    TreeAggregationRelease,
)
from raydpfl.privacy.mechanisms.kernel import (
    ExponentialSelection,
    GaussianRelease,
    LaplaceRelease,
    SubsampledGaussian,
    dp_event,
    uses,
)

DELTA = 1e-5


def _rdp_epsilon(event, relation=None) -> float:
    accountant = (
        RdpAccountant() if relation is None else RdpAccountant(neighboring_relation=relation)
    )
    return accountant.compose(event).get_epsilon(DELTA)


@pytest.mark.parametrize(
    "mechanism, count",
    [
        (SubsampledGaussian(1.1, 0.7, 0.05), 40),
        (SubsampledGaussian(2.5, 1.0, 1.0), 3),
        (GaussianRelease(3.0, 2.0), 5),
        (ExponentialSelection(0.5), 2),
    ],
)
def test_a_gaussian_uses_event_is_what_the_ledger_composes(mechanism, count):
    use = uses(mechanism, count)
    event = dp_event(use)
    assert isinstance(event, dp_accounting.SelfComposedDpEvent) and event.count == count
    ledger = PrivacyLedger("dp_rdp", DELTA, None)
    ledger.charge(0, use.cost)
    assert ledger.epsilon(0) == pytest.approx(_rdp_epsilon(event), rel=1e-9)


def test_the_events_name_the_mechanisms_parameters():
    e = dp_event(uses(SubsampledGaussian(1.1, 0.7, 0.05), 9))
    assert e.event == dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.1))
    assert dp_event(uses(LaplaceRelease(2.0, 0.5), 1)).event == dp_accounting.LaplaceDpEvent(2.0)
    # dp-accounting has no (ε, δ) event: a certified release maps to none
    assert PrivacyCost(1.0, 1.0, 2, "approx_dp", epsilon=0.5, delta=1e-6).dp_event() is None


def test_client_level_events_are_what_the_population_ledger_composes():
    poisson = ClientGaussianSum(1.2, 2.0, "poisson", 200, 0.1, None)
    tree = TreeAggregationRelease(3.0, 1.0, 100, 10, 5, 0, 1)
    special = dp_accounting.NeighboringRelation.REPLACE_SPECIAL  # the tree's (zero-out)
    for mech, relation in ((poisson, None), (tree, special)):
        cost = uses(mech, 1).cost.with_steps(7)
        got = client_level_epsilon([cost], DELTA, "rdp")
        want = _rdp_epsilon(cost.dp_event(), relation)
        assert got == pytest.approx(want, rel=1e-4)  # the same event; the RDP orders differ
    fixed = ClientLevelCost(1.5, "fixed", 100, None, 10, 4)
    event = fixed.dp_event().event
    assert isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent)
    assert (event.source_dataset_size, event.sample_size) == (100, 10)
    assert dp_event(uses(GaussianShare(1.0, 1.0, 4), 1)) is None  # charged with its round
