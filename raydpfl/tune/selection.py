"""The privacy cost of running a sweep and picking its best trial.

Every trial trains on the same clients' records, and picking the best trial looks at
all of them, so the released winner is a function of every trial's training. An
honest bound composes, per client, every charge every trial made (the trials' charge
logs, ledger_log.jsonl, which also cover trials stopped early or interrupted) and
reports the largest ε over clients. The number of trials is fixed in advance, so the
tighter repeat-and-select bounds of Papernot & Steinke (ICLR 2022), which need a
random number of trials, are not claimed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from raydpfl.privacy.accounting.client_level import POPULATION, ClientLevelCost, ClientLevelLedger
from raydpfl.privacy.accounting.ledger import PrivacyCost, PrivacyLedger
from raydpfl.simulation.outputs import CHARGE_LOG, read_charge_log


def charge_logs(sweep_dir: Path) -> list[Path]:
    """Every trial attempt's charge log below `sweep_dir/trials`, sorted."""
    return sorted((sweep_dir / "trials").glob(f"**/{CHARGE_LOG}"))


def composed_ledger(
    run_dirs: Iterable[Path], accountant: str, delta: float
) -> PrivacyLedger | ClientLevelLedger:
    """One ledger (no budget) holding every charge logged by every run in `run_dirs`:
    per client for record-level trials, the population's for client-level ones (a sweep
    that mixes the two units is refused: their ε are about different things)."""
    charges = []
    for run_dir in run_dirs:
        log = read_charge_log(run_dir)
        for round_idx in sorted(log):
            for batch in log[round_idx]:
                charges.extend((int(client_id), cost) for client_id, cost in batch)
    client_level = [_is_client_level(cost) for _, cost in charges]
    if charges and all(client_level):
        costs = [ClientLevelCost.from_dict(cost) for _, cost in charges]
        population = ClientLevelLedger(accountant, delta, None, costs[0].population)
        for cost in costs:
            population.charge(POPULATION, cost)
        return population
    if any(client_level):
        raise ValueError("the sweep mixes record-level and client-level trials; units never mix")
    ledger = PrivacyLedger(accountant, delta, None)
    for client_id, cost in charges:
        ledger.charge(client_id, PrivacyCost.from_dict(cost))
    return ledger


def _is_client_level(cost: dict[str, Any]) -> bool:
    return str(cost.get("mechanism", "")).startswith("client_")


def selection_privacy(
    sweep_dir: Path, accountant: str, delta: float, per_trial_epsilons: Iterable[float]
) -> dict[str, Any]:
    """The sweep's privacy statement: ε per trial and ε of the whole sweep (composed)."""
    per_trial = [e for e in per_trial_epsilons if e is not None]
    logs = charge_logs(sweep_dir)
    out: dict[str, Any] = {
        "epsilon_per_trial_max": max(per_trial) if per_trial else None,
        "epsilon_per_trial_label": "per trial, tuning excluded",
        "delta": delta,
        "accountant": accountant,
    }
    if not logs:
        out["epsilon_sweep"] = None
        out["epsilon_sweep_label"] = "no private trial ran"
        return out
    ledger = composed_ledger((p.parent for p in logs), accountant, delta)
    out["epsilon_sweep"] = ledger.max_epsilon()
    out["epsilon_sweep_label"] = (
        "every trial's charges composed per client (largest over clients): covers "
        "releasing the best trial, selected by its metric, and every other trial; "
        "the trial count is fixed, so no repeat-and-select bound is claimed"
    )
    out["trial_attempts_composed"] = len(logs)
    return out
