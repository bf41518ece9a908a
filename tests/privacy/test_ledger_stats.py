"""`EpsilonStats`: the incremental ε max/mean must equal the full recomputation exactly.

The brute force is what the server computed before issue 19: every client's ε read from
the ledger, ``np.mean`` and ``np.argmax`` over them. The incremental path is checked to be
the one exercised (no silent rebuilds), over many rounds with heterogeneous budgets,
mixed mechanisms, refusals, ties, and a resume (the ledger rebuilt from its snapshot).
"""

from __future__ import annotations

import numpy as np
import pytest

from raydpfl.privacy.accounting.client_level import POPULATION, ClientLevelCost, ClientLevelLedger
from raydpfl.privacy.accounting.ledger import PrivacyCost, PrivacyLedger
from raydpfl.privacy.accounting.ledger_stats import EpsilonStats

N = 50
COSTS = (
    PrivacyCost(1.0, 0.1, 5),
    PrivacyCost(1.3, 0.2, 3),
    PrivacyCost(0.8, 1.0, 1),
    PrivacyCost(4.0, 1.0, 1, mechanism="laplace"),
)


def brute(ledger: PrivacyLedger, n: int) -> tuple[float, float, int]:
    eps = np.array([ledger.epsilon(c) for c in range(n)], dtype=np.float64)
    top = int(np.argmax(eps))
    return float(eps[top]), float(eps.mean()), top


def heterogeneous_ledger(rng: np.random.Generator) -> PrivacyLedger:
    budgets = {
        int(c): (float(rng.uniform(0.5, 6.0)), float(rng.choice([1e-5, 1e-4, 0.0])))
        for c in rng.choice(N, size=N // 2, replace=False)
    }
    # Client 0 at δ = 0 can take only pure-DP (Laplace) charges: refusals guaranteed.
    budgets[0] = (3.0, 0.0)
    return PrivacyLedger("rdp", 1e-5, 8.0, budgets)


def run_rounds(ledger, stats, rng, rounds, refused_total):
    for _ in range(rounds):
        cohort = rng.choice(N, size=12, replace=False)
        charged = []
        for c in cohort:
            cost = COSTS[int(rng.integers(len(COSTS)))]
            if ledger.try_charge(int(c), cost) is None:
                refused_total[0] += 1
            else:
                charged.append(int(c))
        stats.update(charged, len(charged))
        assert (stats.max(), stats.mean(), stats.argmax()) == brute(ledger, N)
        np.testing.assert_array_equal(stats.values, [ledger.epsilon(c) for c in range(N)])


def test_incremental_equals_brute_force_with_budgets_refusals_and_resume():
    rng = np.random.default_rng(7)
    ledger = heterogeneous_ledger(rng)
    stats = EpsilonStats(ledger, N)
    assert (stats.max(), stats.mean(), stats.argmax()) == (0.0, 0.0, 0)
    refused = [0]
    run_rounds(ledger, stats, rng, 30, refused)
    assert refused[0] > 0, "the budgets must refuse some charges"
    assert stats.rebuilds == 1, "the incremental path, not a rebuild, must be what is tested"

    # Resume: the ledger is rebuilt from its snapshot; the statistics follow it.
    resumed = PrivacyLedger.from_dict(ledger.to_dict())
    assert resumed.sha256() == ledger.sha256()
    stats.sync(resumed)
    assert stats.rebuilds == 2
    assert (stats.max(), stats.mean(), stats.argmax()) == brute(resumed, N)
    run_rounds(resumed, stats, rng, 30, refused)
    assert stats.rebuilds == 2


def test_ties_keep_the_first_index_like_argmax():
    ledger = PrivacyLedger("rdp", 1e-5, None)
    stats = EpsilonStats(ledger, 10)
    cost = PrivacyCost(1.0, 0.5, 2)
    for c in (7, 3):  # equal histories, equal ε: the lower id holds the maximum
        ledger.charge(c, cost)
        stats.update([c], 1)
    assert stats.argmax() == 3 == brute(ledger, 10)[2]
    ledger.charge(9, cost)
    ledger.charge(9, cost)
    stats.update([9, 9], 2)
    assert (stats.max(), stats.mean(), stats.argmax()) == brute(ledger, 10)


def test_unreported_charge_is_caught_by_a_rebuild():
    ledger = PrivacyLedger("rdp", 1e-5, None)
    stats = EpsilonStats(ledger, 5)
    ledger.charge(2, PrivacyCost(1.0, 0.5, 3))  # behind the statistics' back
    ledger.charge(1, PrivacyCost(1.0, 0.5, 1))
    stats.update([1], 1)  # told of one charge of two: must not trust the array
    assert stats.rebuilds == 2
    assert (stats.max(), stats.mean(), stats.argmax()) == brute(ledger, 5)
    ledger.charge(4, PrivacyCost(1.0, 0.5, 9))
    stats.sync()
    assert (stats.max(), stats.mean(), stats.argmax()) == brute(ledger, 5)


def test_a_stale_array_would_be_seen_by_the_brute_force():
    """Negative control: the comparison detects statistics that missed a charge."""
    ledger = PrivacyLedger("rdp", 1e-5, None)
    stats = EpsilonStats(ledger, 5)
    ledger.charge(2, PrivacyCost(1.0, 0.5, 3))
    stats._charges = ledger.num_charges  # pretend it was told, without re-reading client 2
    assert (stats.max(), stats.mean(), stats.argmax()) != brute(ledger, 5)


def test_client_level_ledger_gives_every_client_the_population_epsilon():
    ledger = ClientLevelLedger("rdp", 1e-3, None, population=20)
    stats = EpsilonStats(ledger, 20)
    cost = ClientLevelCost(
        noise_multiplier=1.0, sampling="poisson", population=20, sampling_rate=0.1
    )
    for _ in range(3):
        ledger.charge(POPULATION, cost)
        stats.update([POPULATION], 1)
        eps = ledger.epsilons(range(20))
        assert stats.max() == float(eps.max()) and stats.mean() == float(eps.mean())
        assert stats.argmax() == int(np.argmax(eps))


def test_try_charge_matches_would_exceed_then_charge():
    a = PrivacyLedger("rdp", 1e-5, 2.0, {1: (0.5, 1e-6)})
    b = PrivacyLedger("rdp", 1e-5, 2.0, {1: (0.5, 1e-6)})
    cost = PrivacyCost(1.0, 0.3, 4)
    for c in [0, 1, 0, 1, 0, 0, 0, 2]:
        got = a.try_charge(c, cost)
        if b.would_exceed(c, cost):
            assert got is None
        else:
            assert got == b.charge(c, cost)
    assert a.sha256() == b.sha256()
    with pytest.raises(ValueError):
        a.try_charge(True, cost)


def test_shared_histories_serialise_exactly_like_per_client_lists():
    """The interned history trie: clients with equal histories share one node, the
    snapshot and hash list each client's own charges in order, and a -0.0 field (equal
    to 0.0, written differently) never shares a node with 0.0."""
    ledger = PrivacyLedger("rdp", 1e-5, None)
    a, b = PrivacyCost(1.0, 0.1, 2), PrivacyCost(1.0, 0.1, 3)
    zero, minus_zero = PrivacyCost(1.0, 0.0, 1), PrivacyCost(1.0, -0.0, 1)
    charges = {0: [a, b, a], 1: [a, b, a], 2: [a, a, b], 3: [zero], 4: [minus_zero], 5: [a]}
    for step in range(3):
        for cid, costs in charges.items():
            if step < len(costs):
                ledger.charge(cid, costs[step])
    for cid, costs in charges.items():
        assert ledger.history(cid) == tuple(costs)
        assert ledger.steps(cid) == sum(c.steps for c in costs)
    assert ledger._node_of[0] == ledger._node_of[1] != ledger._node_of[2]
    snap = ledger.to_dict()
    want = [{"client_id": c, "entries": [x.to_dict() for x in v]} for c, v in charges.items()]
    assert snap["clients"] == want
    import json

    assert '"sampling_rate": -0.0' in json.dumps(snap["clients"][4])
    rebuilt = PrivacyLedger.from_dict(snap)
    assert rebuilt.sha256() == ledger.sha256()
    assert [rebuilt.epsilon(c) for c in range(6)] == [ledger.epsilon(c) for c in range(6)]
