"""Per-client budgets (ε_n, δ_n) in the ledger (issue 6); existing ledgers are unchanged."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from raydpfl.privacy.accounting.accountants import compute_epsilon, compute_epsilon_extended
from raydpfl.privacy.accounting.ledger import BudgetExceededError, PrivacyCost, PrivacyLedger


def _ledger() -> PrivacyLedger:
    return PrivacyLedger(
        "zcdp", 1e-5, None, client_budgets={0: (1.0, 1e-5), 1: (4.0, 1e-4), 2: (2.0, 0.0)}
    )


def test_each_client_is_checked_against_its_own_budget_and_delta():
    ledger = _ledger()
    cost = PrivacyCost(2.0, 1.0, 1)  # rho = 1/8
    eps0 = compute_epsilon_extended([(2.0, 1.0, 1)], 1e-5, "zcdp")
    eps1 = compute_epsilon_extended([(2.0, 1.0, 1)], 1e-4, "zcdp")
    assert eps0 > 1.0 and eps1 < 4.0
    assert ledger.would_exceed(0, cost)
    assert not ledger.would_exceed(1, cost)
    assert ledger.charge(1, cost) == pytest.approx(eps1)
    assert ledger.epsilon(1) == pytest.approx(eps1)
    with pytest.raises(BudgetExceededError, match="client 0"):
        ledger.charge(0, cost)
    assert ledger.history(0) == ()
    # A pure-DP client (δ_n = 0): Gaussian noise cannot be certified, Laplace composes purely.
    assert ledger.would_exceed(2, cost)
    lap = PrivacyCost(1.0, 1.0, 1, "laplace")  # 1-DP per release
    ledger.charge(2, lap)
    ledger.charge(2, lap)
    assert ledger.epsilon(2) == pytest.approx(2.0)
    assert ledger.would_exceed(2, lap)
    assert ledger.budget_of(2) == 2.0 and ledger.delta_of(2) == 0.0
    assert ledger.budget_of(7) is None and ledger.delta_of(7) == 1e-5


def test_round_trip_keeps_budgets_charges_and_hash():
    ledger = _ledger()
    ledger.charge(1, PrivacyCost(3.0, 1.0, 2))
    ledger.charge(2, PrivacyCost(4.0, 1.0, 1, "laplace"))
    ledger.charge(1, PrivacyCost(9.0, 1.0, 1, "approx_dp", epsilon=0.1, delta=1e-6))
    data = json.loads(json.dumps(ledger.to_dict()))
    again = PrivacyLedger.from_dict(data)
    assert again.client_budgets == ledger.client_budgets
    assert again.sha256() == ledger.sha256()
    for c in range(3):
        assert again.epsilon(c) == pytest.approx(ledger.epsilon(c))
    assert again.would_exceed(0, PrivacyCost(2.0, 1.0, 1))


def test_homogeneous_ledger_serialises_and_hashes_as_before():
    ledger = PrivacyLedger("rdp", 1e-5, 8.0)
    ledger.charge(3, PrivacyCost(1.1, 0.05, 10))
    data = ledger.to_dict()
    assert "client_budgets" not in data
    old_payload = json.dumps(
        [{"client_id": 3, "entries": [PrivacyCost(1.1, 0.05, 10).to_dict()]}],
        sort_keys=True,
        separators=(",", ":"),
    )
    assert ledger.sha256() == hashlib.sha256(old_payload.encode()).hexdigest()
    assert ledger.epsilon(3) == compute_epsilon([(1.1, 0.05, 10)], 1e-5, "rdp")


@pytest.mark.parametrize(
    "budgets", [{0: (0.0, 1e-5)}, {0: (math.inf, 1e-5)}, {0: (1.0, 1.0)}, {0: (1.0,)}]
)
def test_bad_client_budgets_are_rejected(budgets):
    with pytest.raises(ValueError):
        PrivacyLedger("zcdp", 1e-5, None, client_budgets=budgets)


def test_unknown_accountant_is_rejected():
    with pytest.raises(ValueError, match="accountant"):
        PrivacyLedger("basic", 1e-5, None)
