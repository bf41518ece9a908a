"""Per-privacy-unit privacy ledger with budget enforcement.

Each privacy unit (a client id, ``int``) owns an append-only history of
:class:`PrivacyCost` charges. A charge ``(sigma, q, T)`` is ``T`` steps of the
Poisson-subsampled Gaussian mechanism ``D -> sum_{x in S} clip_C(g(x)) +
N(0, sigma^2 C^2 I)`` (``S`` a Poisson(q) subsample of the unit's data, L2
sensitivity ``C``, add/remove-one-record adjacency). The unit's epsilon is that
of the adaptive composition of all its charges at the ledger's ``delta``, as
computed by :func:`raydpfl.privacy.accountants.compute_epsilon`.

Epsilon queries are cheap when many units share a history: the accountants
memoise on the (merged) history, and the ledger caches each unit's current
epsilon, invalidated on charge. This module imports neither torch nor ray.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydpfl.privacy.accountants import (
    HistoryEntry,
    compute_epsilon,
    describe_accountant,
    validate_accountant,
    validate_delta,
)

__all__ = ["MECHANISMS", "BudgetExceededError", "PrivacyCost", "PrivacyLedger"]

#: Mechanisms a :class:`PrivacyCost` may describe.
MECHANISMS: tuple[str, ...] = ("subsampled_gaussian",)

_FORMAT_VERSION = 1


@dataclass(frozen=True)
class PrivacyCost:
    """One charge: ``steps`` compositions of the Poisson-subsampled Gaussian mechanism.

    Attributes:
        noise_multiplier: ``sigma >= 0`` (finite); noise std is ``sigma * C``.
        sampling_rate: Poisson sampling probability ``q in [0, 1]``.
        steps: Number of composed steps ``T >= 0`` (int).
        mechanism: Only ``"subsampled_gaussian"`` is supported.

    Raises:
        ValueError: On invalid fields (values are coerced to float/float/int).
    """

    noise_multiplier: float
    sampling_rate: float
    steps: int
    mechanism: str = "subsampled_gaussian"

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        sigma, q, steps = self.noise_multiplier, self.sampling_rate, self.steps
        if (
            not isinstance(sigma, numbers.Real)
            or isinstance(sigma, bool)
            or not math.isfinite(float(sigma))
            or float(sigma) < 0.0
        ):
            raise ValueError(f"noise_multiplier must be a finite real >= 0, got {sigma!r}")
        if not isinstance(q, numbers.Real) or isinstance(q, bool) or not 0.0 <= float(q) <= 1.0:
            raise ValueError(f"sampling_rate must be a real in [0, 1], got {q!r}")
        if not isinstance(steps, numbers.Integral) or isinstance(steps, bool) or int(steps) < 0:
            raise ValueError(f"steps must be an int >= 0, got {steps!r}")
        object.__setattr__(self, "noise_multiplier", float(sigma))
        object.__setattr__(self, "sampling_rate", float(q))
        object.__setattr__(self, "steps", int(steps))

    def as_triple(self) -> HistoryEntry:
        """Returns ``(noise_multiplier, sampling_rate, steps)``."""
        return (self.noise_multiplier, self.sampling_rate, self.steps)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of the fields."""
        return {
            "noise_multiplier": self.noise_multiplier,
            "sampling_rate": self.sampling_rate,
            "steps": self.steps,
            "mechanism": self.mechanism,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PrivacyCost:
        """Inverse of :meth:`to_dict`."""
        return cls(
            noise_multiplier=d["noise_multiplier"],
            sampling_rate=d["sampling_rate"],
            steps=d["steps"],
            mechanism=d.get("mechanism", "subsampled_gaussian"),
        )


class BudgetExceededError(RuntimeError):
    """Raised when a charge would push a unit's epsilon above the budget."""


def _check_client_id(client_id: object) -> int:
    if not isinstance(client_id, numbers.Integral) or isinstance(client_id, bool):
        raise ValueError(f"client_id must be an int, got {client_id!r}")
    return int(client_id)


def _check_cost(cost: object) -> PrivacyCost:
    if not isinstance(cost, PrivacyCost):
        raise ValueError(f"cost must be a PrivacyCost, got {type(cost).__name__}")
    return cost


class PrivacyLedger:
    """Append-only record of privacy charges per client, with an optional budget.

    A charge is refused (``BudgetExceededError``, nothing recorded) iff the
    client's epsilon after it would exceed ``epsilon_budget``:
    ``eps(history + [cost]) > epsilon_budget``.

    Args:
        accountant: One of :data:`raydpfl.privacy.accountants.ACCOUNTANTS`.
        delta: Per-client target delta in (0, 1).
        epsilon_budget: Per-client epsilon budget (finite, > 0), or ``None``
            to record without enforcing.

    Raises:
        ValueError: On invalid arguments.
    """

    def __init__(self, accountant: str, delta: float, epsilon_budget: float | None) -> None:
        self._accountant = validate_accountant(accountant)
        self._delta = validate_delta(delta)
        if epsilon_budget is not None and (
            not isinstance(epsilon_budget, numbers.Real)
            or isinstance(epsilon_budget, bool)
            or not math.isfinite(float(epsilon_budget))
            or float(epsilon_budget) <= 0.0
        ):
            raise ValueError(
                f"epsilon_budget must be None or a finite real > 0, got {epsilon_budget!r}"
            )
        self._budget = None if epsilon_budget is None else float(epsilon_budget)
        self._history: dict[int, list[PrivacyCost]] = {}
        self._triples: dict[int, tuple[HistoryEntry, ...]] = {}
        self._steps: dict[int, int] = {}
        self._eps: dict[int, float] = {}
        self._num_charges = 0

    # ------------------------------------------------------------------ props
    @property
    def accountant(self) -> str:
        """Accountant name."""
        return self._accountant

    @property
    def delta(self) -> float:
        """Per-client delta."""
        return self._delta

    @property
    def epsilon_budget(self) -> float | None:
        """Per-client epsilon budget, or ``None`` (no enforcement)."""
        return self._budget

    @property
    def num_charges(self) -> int:
        """Number of successful charges recorded (all clients)."""
        return self._num_charges

    # ---------------------------------------------------------------- queries
    def _eps_of(self, triples: tuple[HistoryEntry, ...]) -> float:
        return compute_epsilon(triples, self._delta, self._accountant)

    def epsilon(self, client_id: int) -> float:
        """Current epsilon of ``client_id`` (0.0 if never charged)."""
        cid = _check_client_id(client_id)
        eps = self._eps.get(cid)
        if eps is None:
            eps = self._eps_of(self._triples.get(cid, ()))
            if cid in self._triples:
                self._eps[cid] = eps
        return eps

    def epsilon_after(self, client_id: int, cost: PrivacyCost) -> float:
        """Epsilon ``client_id`` would have after ``cost``; records nothing."""
        cid = _check_client_id(client_id)
        cost = _check_cost(cost)
        return self._eps_of((*self._triples.get(cid, ()), cost.as_triple()))

    def would_exceed(self, client_id: int, cost: PrivacyCost) -> bool:
        """Whether charging ``cost`` would exceed the budget (False if no budget)."""
        if self._budget is None:
            _check_client_id(client_id)
            _check_cost(cost)
            return False
        return self.epsilon_after(client_id, cost) > self._budget

    def steps(self, client_id: int) -> int:
        """Total number of steps charged to ``client_id`` (sum over charges)."""
        return self._steps.get(_check_client_id(client_id), 0)

    def history(self, client_id: int) -> tuple[PrivacyCost, ...]:
        """Charges of ``client_id`` in order (empty if never charged)."""
        return tuple(self._history.get(_check_client_id(client_id), ()))

    def charged_clients(self) -> list[int]:
        """Sorted ids of clients with at least one recorded charge."""
        return sorted(self._history)

    def epsilons(self, client_ids: Iterable[int]) -> np.ndarray:
        """Current epsilons of ``client_ids`` as a float64 array (same order)."""
        return np.array([self.epsilon(c) for c in client_ids], dtype=np.float64)

    def max_epsilon(self) -> float:
        """Largest epsilon over all charged clients (0.0 if none)."""
        return max((self.epsilon(c) for c in self._history), default=0.0)

    def mean_epsilon(self, client_ids: Iterable[int] | None = None) -> float:
        """Mean epsilon over ``client_ids`` (default: charged clients); 0.0 if empty."""
        ids = self.charged_clients() if client_ids is None else list(client_ids)
        if not ids:
            return 0.0
        return float(np.mean(self.epsilons(ids)))

    # ---------------------------------------------------------------- updates
    def _record(self, cid: int, cost: PrivacyCost, eps: float | None) -> None:
        self._history.setdefault(cid, []).append(cost)
        triples = self._triples.get(cid, ())
        sigma, q, steps = cost.as_triple()
        if triples and triples[-1][0] == sigma and triples[-1][1] == q:
            triples = (*triples[:-1], (sigma, q, triples[-1][2] + steps))
        else:
            triples = (*triples, (sigma, q, steps))
        self._triples[cid] = triples
        self._steps[cid] = self._steps.get(cid, 0) + cost.steps
        if eps is None:
            self._eps.pop(cid, None)
        else:
            self._eps[cid] = eps
        self._num_charges += 1

    def charge(self, client_id: int, cost: PrivacyCost) -> float:
        """Records ``cost`` for ``client_id`` and returns the new epsilon.

        Raises:
            BudgetExceededError: If the new epsilon would exceed the budget;
                nothing is recorded in that case.
            ValueError: On an invalid ``client_id`` or ``cost``.
        """
        cid = _check_client_id(client_id)
        eps_after = self.epsilon_after(cid, cost)
        if self._budget is not None and eps_after > self._budget:
            raise BudgetExceededError(
                f"client {cid}: epsilon would become {eps_after:.6g} > budget {self._budget:.6g}"
            )
        self._record(cid, cost, eps_after)
        return eps_after

    # ---------------------------------------------------------- serialisation
    def _entries(self) -> list[dict[str, Any]]:
        return [
            {"client_id": cid, "entries": [c.to_dict() for c in self._history[cid]]}
            for cid in self.charged_clients()
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe snapshot: settings plus every client's charges in order."""
        return {
            "format_version": _FORMAT_VERSION,
            "accountant": self._accountant,
            "accountant_description": describe_accountant(self._accountant),
            "delta": self._delta,
            "epsilon_budget": self._budget,
            "clients": self._entries(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PrivacyLedger:
        """Rebuilds a ledger from :meth:`to_dict` output by replaying the charges.

        Replay records every charge without re-checking the budget (the record
        is authoritative). A ``RuntimeWarning`` is emitted if the stored
        accountant description differs from the installed one, since epsilons
        may then differ slightly.

        Raises:
            ValueError: If ``d`` is malformed.
        """
        try:
            ledger = cls(d["accountant"], d["delta"], d["epsilon_budget"])
            clients = d["clients"]
            for item in clients:
                cid = _check_client_id(item["client_id"])
                for entry in item["entries"]:
                    ledger._record(cid, PrivacyCost.from_dict(entry), None)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"d is not a PrivacyLedger.to_dict() mapping: {exc!r}") from None
        stored = d.get("accountant_description")
        if stored is not None and stored != describe_accountant(ledger.accountant):
            warnings.warn(
                f"ledger was written with {stored!r}; replaying with "
                f"{describe_accountant(ledger.accountant)!r}",
                RuntimeWarning,
                stacklevel=2,
            )
        return ledger

    def sha256(self) -> str:
        """SHA-256 hex digest of the canonical JSON of all clients' charges."""
        payload = json.dumps(self._entries(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(accountant={self._accountant!r}, delta={self._delta!r}, "
            f"epsilon_budget={self._budget!r}, clients={len(self._history)}, "
            f"charges={self._num_charges})"
        )
