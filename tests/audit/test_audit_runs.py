"""End-to-end audits on tiny runs: honest mechanisms stay under their claim, and broken
ones (negative controls, only here) are caught: the lower bound exceeds the claimed ε.

The broken mechanisms are the real code with one function replaced for the test's
duration: the DP noise drawn at 0.1 of its std (`gaussian_like`), or clipping switched off
(`clip_weights` for DP-SGD, `clip_update` for client-level updates). The ledger still
charges the advertised σ and C, so the accountant's ε is the (false) claim.
"""

import copy

import numpy as np
import pytest

import raydpfl
import raydpfl.algorithms.dp_fedavg_client as client_level
import raydpfl.privacy.mechanisms.client_level_mechanisms as client_level_mechanisms
import raydpfl.privacy.per_sample.dpsgd as dpsgd
from raydpfl.audit import audit

RECORD = {
    "experiment": {
        "name": "audit_record",
        "data": {
            "dataset": "synthetic",
            "num_clients": 10,
            "client_test_fraction": 0.2,
            "synthetic": {"min_samples": 100, "max_samples": 300},
        },
        "model": {"name": "logreg"},
        "algorithm": {
            "name": "dp_fedavg",
            "rounds": 4,
            "clients_per_round": 10,
            "local_steps": 5,
            "lr": 0.5,
            "eval_every": 4,
        },
        "privacy": {
            "accountant": "rdp",
            "epsilon": 50.0,
            "delta": 1e-5,
            "clip_norm": 1.0,
            "noise_multiplier": 3.0,
            "sampling_rate": 0.2,
        },
    },
    "runtime": {"backend": "local", "seed": 0, "progress": False},
}
CLIENT = {
    "experiment": {
        "name": "audit_client",
        "data": {
            "dataset": "synthetic",
            "num_clients": 100,
            "client_test_fraction": 0.2,
            "synthetic": {"min_samples": 30, "max_samples": 60},
        },
        "model": {"name": "logreg"},
        "algorithm": {
            "name": "dp_fedavg_client",
            "rounds": 10,
            "local_steps": 2,
            "lr": 0.5,
            "batch_size": 16,
            "eval_every": 10,
            "options": {
                "sampling": "poisson",
                "client_sampling_rate": 0.5,
                "update_clip_norm": 1.0,
            },
        },
        "privacy": {"accountant": "rdp", "epsilon": 50.0, "delta": 1e-4, "noise_multiplier": 6.0},
    },
    "runtime": {"backend": "local", "seed": 0, "progress": False},
}


def _weak_noise(monkeypatch):
    real = dpsgd.gaussian_like

    def tenth(t, std, generator):
        return real(t, 0.1 * std, generator)

    monkeypatch.setattr(dpsgd, "gaussian_like", tenth)  # DP-SGD steps
    # the server's aggregate noise, drawn by the client-level mechanisms of the kernel
    monkeypatch.setattr(client_level_mechanisms, "gaussian_like", tenth)


def _no_clipping(monkeypatch):
    """A broken platform, not a plug-in: no clipping anywhere, and the worker's check that
    a client-level upload is within S is off too (a plug-in cannot turn it off)."""
    from raydpfl.simulation import worker

    monkeypatch.setattr(dpsgd, "clip_weights", lambda norms, c: norms.new_ones(norms.shape))
    monkeypatch.setattr(client_level, "clip_update", lambda u, s, per_layer=False: dict(u))
    monkeypatch.setattr(worker, "check_update_bound", lambda update, bound, where: None)


def test_record_level_white_box_audit_of_an_honest_run_stays_below_the_claim():
    result = audit(RECORD, canaries=200, k_plus=40, k_minus=0)

    assert (result.unit, result.mode, result.guesses) == ("record", "white-box", 40)
    assert result.included == int(result.inclusion.sum())
    assert result.epsilon_claimed == pytest.approx(result.summary["epsilon_max"])
    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_claimed
    again = audit(copy.deepcopy(RECORD), canaries=200, k_plus=40, k_minus=0)
    np.testing.assert_array_equal(again.scores, result.scores)  # reproducible from the seed


@pytest.mark.parametrize("broken", [_weak_noise, _no_clipping])
def test_record_level_audit_catches_a_broken_mechanism(monkeypatch, broken):
    broken(monkeypatch)

    result = audit(RECORD, canaries=200, k_plus=40, k_minus=0)

    assert result.correct >= 39
    assert result.epsilon_lower_bound > result.epsilon_claimed


def test_client_level_audit_runs_with_distributed_noise():
    """The canary clients draw their noise share through their tasks' declared mechanism,
    like every client (drawn beside it, the run was refused: no share in the receipt)."""
    cfg = copy.deepcopy(CLIENT)
    options = cfg["experiment"]["algorithm"]["options"]
    options.pop("client_sampling_rate")
    options.update(sampling="fixed", noise="distributed")
    cfg["experiment"]["algorithm"].update(clients_per_round=20, rounds=2, eval_every=2)

    result = audit(cfg, canaries=20, k_plus=5, k_minus=0)

    assert result.unit == "client" and 0.0 <= result.epsilon_lower_bound <= result.epsilon_claimed


def test_client_level_audit_of_an_honest_run_stays_below_the_claim():
    result = audit(CLIENT, canaries=100, k_plus=20, k_minus=0)

    assert (result.unit, result.summary["epsilon_unit"]) == ("client", "client")
    assert result.summary["num_clients"] == 200  # 100 canary clients joined the population
    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_claimed


@pytest.mark.parametrize(
    ("broken", "mode"), [(_weak_noise, "white-box"), (_no_clipping, "black-box")]
)
def test_client_level_audit_catches_a_broken_mechanism(monkeypatch, broken, mode):
    broken(monkeypatch)

    result = audit(CLIENT, canaries=100, mode=mode, k_plus=20, k_minus=0)

    assert result.correct == 20
    assert result.epsilon_lower_bound > result.epsilon_claimed


def test_the_python_api_is_exported_at_the_top_level():
    assert raydpfl.run_audit is audit
    assert raydpfl.AuditResult.__name__ == "AuditResult"
