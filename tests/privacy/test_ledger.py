"""Tests for raydpfl.privacy.accounting.ledger."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from raydpfl.privacy.accounting.accountants import compute_epsilon, describe_accountant
from raydpfl.privacy.accounting.ledger import BudgetExceededError, PrivacyCost, PrivacyLedger

DELTA = 1e-5
COST = PrivacyCost(noise_multiplier=1.1, sampling_rate=0.015, steps=100)


def _eps(*costs: PrivacyCost, accountant: str = "rdp") -> float:
    return compute_epsilon([c.as_triple() for c in costs], DELTA, accountant)


# ------------------------------------------------------------------ PrivacyCost
def test_privacy_cost_coerces_numpy_types():
    cost = PrivacyCost(np.float32(1.5), np.float64(0.04), np.int64(7))

    assert type(cost.noise_multiplier) is float
    assert type(cost.steps) is int
    assert cost.as_triple() == (1.5, pytest.approx(0.04), 7)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"noise_multiplier": -0.1}, "noise_multiplier"),
        ({"noise_multiplier": math.inf}, "noise_multiplier"),
        ({"sampling_rate": 1.01}, "sampling_rate"),
        ({"steps": 1.0}, "steps"),
        ({"steps": -1}, "steps"),
        ({"mechanism": "laplace"}, "mechanism"),
    ],
)
def test_privacy_cost_validation(kwargs, name):
    args = {"noise_multiplier": 1.0, "sampling_rate": 0.1, "steps": 1}
    args.update(kwargs)

    with pytest.raises(ValueError, match=name):
        PrivacyCost(**args)


def test_privacy_cost_is_frozen():
    with pytest.raises(AttributeError):
        COST.steps = 3  # type: ignore[misc]


# ----------------------------------------------------------------------- ledger
def test_new_ledger_is_empty():
    ledger = PrivacyLedger("rdp", DELTA, 5.0)

    assert ledger.epsilon(1) == 0.0
    assert ledger.steps(1) == 0
    assert ledger.history(1) == ()
    assert ledger.charged_clients() == []
    assert ledger.num_charges == 0
    assert ledger.max_epsilon() == 0.0
    assert ledger.mean_epsilon() == 0.0


def test_charge_returns_and_records_epsilon():
    ledger = PrivacyLedger("rdp", DELTA, 10.0)

    eps1 = ledger.charge(7, COST)
    eps2 = ledger.charge(7, COST)

    assert eps1 == pytest.approx(_eps(COST))
    assert eps2 == pytest.approx(_eps(COST, COST))
    assert eps2 > eps1
    assert ledger.epsilon(7) == eps2
    assert ledger.steps(7) == 200
    assert ledger.history(7) == (COST, COST)
    assert ledger.num_charges == 2


def test_charge_refused_leaves_ledger_unchanged():
    ledger = PrivacyLedger("rdp", DELTA, 2.0)
    ledger.charge(1, COST)
    before = (ledger.epsilon(1), ledger.steps(1), ledger.history(1), ledger.num_charges)
    digest = ledger.sha256()
    big = PrivacyCost(1.1, 0.015, 10_000)

    assert ledger.would_exceed(1, big)
    with pytest.raises(BudgetExceededError, match="budget"):
        ledger.charge(1, big)

    after = (ledger.epsilon(1), ledger.steps(1), ledger.history(1), ledger.num_charges)
    assert after == before
    assert ledger.sha256() == digest


def test_would_exceed_boundary_uses_strict_inequality():
    eps = _eps(COST)
    ledger = PrivacyLedger("rdp", DELTA, eps)

    assert not ledger.would_exceed(3, COST)
    assert ledger.charge(3, COST) == eps
    assert ledger.would_exceed(3, PrivacyCost(1.1, 0.015, 1))


def test_no_budget_never_refuses():
    ledger = PrivacyLedger("rdp", DELTA, None)
    weak = PrivacyCost(0.0, 0.5, 10)

    assert not ledger.would_exceed(1, weak)
    assert math.isinf(ledger.charge(1, weak))
    assert math.isinf(ledger.epsilon(1))


def test_steps_counts_steps_not_entries():
    ledger = PrivacyLedger("rdp", DELTA, None)

    ledger.charge(4, PrivacyCost(1.0, 0.1, 3))
    ledger.charge(4, PrivacyCost(1.0, 0.1, 5))
    ledger.charge(4, PrivacyCost(2.0, 0.1, 11))

    assert ledger.steps(4) == 19
    assert len(ledger.history(4)) == 3


def test_heterogeneous_per_client_costs():
    ledger = PrivacyLedger("dp_rdp", DELTA, None)
    a1, a2 = PrivacyCost(1.0, 0.1, 10), PrivacyCost(2.0, 0.05, 20)
    b1 = PrivacyCost(1.5, 0.02, 50)

    ledger.charge(0, a1)
    ledger.charge(1, b1)
    ledger.charge(0, a2)

    assert ledger.epsilon(0) == pytest.approx(_eps(a1, a2, accountant="dp_rdp"))
    assert ledger.epsilon(1) == pytest.approx(_eps(b1, accountant="dp_rdp"))
    assert ledger.charged_clients() == [0, 1]
    expected = [_eps(b1, accountant="dp_rdp"), _eps(a1, a2, accountant="dp_rdp"), 0.0]
    np.testing.assert_allclose(ledger.epsilons([1, 0, 9]), expected)
    assert ledger.max_epsilon() == max(ledger.epsilon(0), ledger.epsilon(1))
    assert ledger.mean_epsilon([0, 1]) == pytest.approx(
        (ledger.epsilon(0) + ledger.epsilon(1)) / 2
    )


def test_epsilon_after_does_not_mutate():
    ledger = PrivacyLedger("rdp", DELTA, 2.0)
    ledger.charge(2, PrivacyCost(1.1, 0.015, 10))
    digest = ledger.sha256()
    eps = ledger.epsilon(2)

    after = ledger.epsilon_after(2, COST)
    exceeded = ledger.would_exceed(2, PrivacyCost(1.1, 0.015, 5000))

    assert after > eps
    assert exceeded
    assert ledger.epsilon(2) == eps
    assert ledger.steps(2) == 10
    assert ledger.num_charges == 1
    assert ledger.sha256() == digest
    assert ledger.epsilon_after(5, COST) == pytest.approx(_eps(COST))
    assert ledger.charged_clients() == [2]


def test_many_clients_sharing_history_is_cheap():
    ledger = PrivacyLedger("rdp", DELTA, None)

    for cid in range(2000):
        ledger.charge(cid, COST)
    eps = ledger.epsilons(range(2000))

    assert np.all(eps == eps[0])
    assert ledger.num_charges == 2000


def test_round_trip_through_json():
    ledger = PrivacyLedger("rdp", DELTA, 8.0)
    ledger.charge(3, PrivacyCost(1.0, 0.1, 10))
    ledger.charge(1, PrivacyCost(np.float64(2.0), 0.05, np.int64(20)))
    ledger.charge(3, PrivacyCost(1.3, 0.02, 7))

    data = json.loads(json.dumps(ledger.to_dict(), allow_nan=False))
    rebuilt = PrivacyLedger.from_dict(data)

    assert data["accountant"] == "rdp"
    assert data["accountant_description"] == describe_accountant("rdp")
    assert data["delta"] == DELTA
    assert data["epsilon_budget"] == 8.0
    assert rebuilt.sha256() == ledger.sha256()
    assert rebuilt.charged_clients() == ledger.charged_clients()
    np.testing.assert_array_equal(rebuilt.epsilons([1, 3]), ledger.epsilons([1, 3]))
    assert rebuilt.history(3) == ledger.history(3)
    assert rebuilt.steps(3) == 17
    assert rebuilt.num_charges == 3


def test_sha256_depends_on_entries():
    a = PrivacyLedger("rdp", DELTA, None)
    b = PrivacyLedger("rdp", DELTA, None)
    a.charge(1, COST)
    b.charge(1, PrivacyCost(1.1, 0.015, 101))

    assert a.sha256() != b.sha256()
    assert len(a.sha256()) == 64


def test_from_dict_rejects_malformed():
    with pytest.raises(ValueError, match="d is not"):
        PrivacyLedger.from_dict({"accountant": "rdp"})


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("xyz", DELTA, None), "accountant"),
        (("rdp", 0.0, None), "delta"),
        (("rdp", DELTA, -1.0), "epsilon_budget"),
        (("rdp", DELTA, math.inf), "epsilon_budget"),
    ],
)
def test_ledger_constructor_validation(args, name):
    with pytest.raises(ValueError, match=name):
        PrivacyLedger(*args)


def test_invalid_client_and_cost():
    ledger = PrivacyLedger("rdp", DELTA, None)

    with pytest.raises(ValueError, match="client_id"):
        ledger.charge("a", COST)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cost"):
        ledger.charge(1, (1.0, 0.1, 1))  # type: ignore[arg-type]
    assert ledger.num_charges == 0


def test_ledger_does_not_import_ray():
    code = (
        "import sys\n"
        "from raydpfl.privacy.accounting.ledger import PrivacyLedger, PrivacyCost\n"
        "l = PrivacyLedger('rdp', 1e-5, 10.0)\n"
        "l.charge(0, PrivacyCost(1.0, 0.1, 10))\n"
        "assert 'ray' not in sys.modules\n"
    )

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    assert result.returncode == 0, result.stderr
