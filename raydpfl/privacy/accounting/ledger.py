"""Per-privacy-unit privacy ledger with budget enforcement.

Each privacy unit (a client id, ``int``) owns an append-only history of
:class:`PrivacyCost` charges. A charge ``(sigma, q, T)`` is ``T`` steps of the
Poisson-subsampled Gaussian mechanism ``D -> sum_{x in S} clip_C(g(x)) +
N(0, sigma^2 C^2 I)`` (``S`` a Poisson(q) subsample of the unit's data, L2
sensitivity ``C``, add/remove-one-record adjacency). The unit's epsilon is that
of the adaptive composition of all its charges at the ledger's ``delta``, as
computed by :func:`raydpfl.privacy.accounting.accountants.compute_epsilon`.

Epsilon queries are cheap when many units share a history: the accountants
memoise on the (merged) history, and the ledger caches each unit's current
epsilon, invalidated on charge. This module imports neither torch nor ray.

Heterogeneous budgets and more mechanisms (DPFL-BCS, issue 6): ``client_budgets`` gives
listed clients their own ``(epsilon_n, delta_n)`` (``delta_n`` may be 0 for pure-DP
clients); their epsilon is computed at their own ``delta_n`` and checked against their own
``epsilon_n``. Besides the subsampled Gaussian, a charge may be a ``"laplace"`` release
(noise scale / L1 sensitivity in ``noise_multiplier``; pure ``1/noise_multiplier``-DP per
step) or an ``"approx_dp"`` release declared ``(epsilon, delta)``-DP per step (e.g. a Gaussian
calibrated by a closed form), composed by basic composition; see
:func:`raydpfl.privacy.accounting.accountants.compute_epsilon_extended`. Ledgers without
these features serialise and hash exactly as before.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydpfl.privacy.accounting.accountants import (
    ExtendedEntry,
    compute_epsilon_extended,
    describe_accountant,
    validate_delta,
    validate_ledger_accountant,
)

__all__ = ["MECHANISMS", "TRUNCATED", "BudgetExceededError", "PrivacyCost", "PrivacyLedger"]

#: Mechanisms a :class:`PrivacyCost` may describe.
MECHANISMS: tuple[str, ...] = (
    "subsampled_gaussian",
    "laplace",
    "approx_dp",
    "truncated_subsampled_gaussian",
)
#: The truncated Poisson sample's charge (`raydpfl.privacy.accounting.truncation`).
TRUNCATED = "truncated_subsampled_gaussian"

_FORMAT_VERSION = 1
_MEMO_SIZE = 2**16  # distinct (history, δ) pairs whose ε a ledger remembers


@dataclass(frozen=True)
class PrivacyCost:
    """One charge: ``steps`` compositions of one mechanism.

    Attributes:
        noise_multiplier: ``sigma >= 0`` (finite); noise std is ``sigma * C``. For
            ``"laplace"``: the noise scale over the L1 sensitivity (``1/epsilon`` per step);
            for ``"approx_dp"``: informational (the noise std over the L2 sensitivity).
        sampling_rate: Poisson sampling probability ``q in [0, 1]``; must be 1 for
            ``"laplace"`` and ``"approx_dp"`` (full-batch releases, no amplification).
        steps: Number of composed steps ``T >= 0`` (int).
        mechanism: ``"subsampled_gaussian"`` (default), ``"laplace"``, ``"approx_dp"`` or
            ``"truncated_subsampled_gaussian"`` (a Poisson(q) sample truncated to at most
            ``max_batch_size`` records by a uniformly random subset, then the Gaussian;
            `raydpfl.privacy.accounting.truncation` accounts it).
        epsilon, delta: The per-step guarantee of an ``"approx_dp"`` release (required
            there, ``None`` otherwise); ``delta in [0, 1)``.
        max_batch_size, dataset_size: The cap B >= 1 and the client's |D| >= 1 of a
            truncated charge (required there, ``None`` otherwise).

    Raises:
        ValueError: On invalid fields (values are coerced to float/float/int).
    """

    noise_multiplier: float
    sampling_rate: float
    steps: int
    mechanism: str = "subsampled_gaussian"
    epsilon: float | None = None
    delta: float | None = None
    max_batch_size: int | None = None
    dataset_size: int | None = None

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
        if self.mechanism not in ("subsampled_gaussian", TRUNCATED) and float(q) != 1.0:
            raise ValueError(
                f"mechanism {self.mechanism!r} is a full-batch release: sampling_rate must "
                f"be 1 (no amplification), got {q!r}"
            )
        if self.mechanism == "approx_dp":
            eps, delta = self.epsilon, self.delta
            if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
                raise ValueError(f"approx_dp needs a real epsilon, got {eps!r}")
            if not math.isfinite(float(eps)) or float(eps) < 0.0:
                raise ValueError(f"epsilon must be a finite real >= 0, got {eps!r}")
            if not isinstance(delta, numbers.Real) or not 0.0 <= float(delta) < 1.0:
                raise ValueError(f"delta must be a real in [0, 1), got {delta!r}")
            object.__setattr__(self, "epsilon", float(eps))
            object.__setattr__(self, "delta", float(delta))
        elif self.epsilon is not None or self.delta is not None:
            raise ValueError(
                f"epsilon/delta are declared only for approx_dp, not {self.mechanism}"
            )
        if self.mechanism == TRUNCATED:
            for name in ("max_batch_size", "dataset_size"):
                v = getattr(self, name)
                if not isinstance(v, numbers.Integral) or isinstance(v, bool) or int(v) < 1:
                    raise ValueError(f"a truncated charge needs {name} an int >= 1, got {v!r}")
                object.__setattr__(self, name, int(v))
        elif self.max_batch_size is not None or self.dataset_size is not None:
            raise ValueError(
                "max_batch_size/dataset_size are declared only for "
                f"{TRUNCATED}, not {self.mechanism}"
            )

    def as_triple(self) -> tuple[float, float, int]:
        """Returns ``(noise_multiplier, sampling_rate, steps)`` (subsampled Gaussian only)."""
        if self.mechanism != "subsampled_gaussian":
            raise ValueError(f"a {self.mechanism} charge has no Gaussian triple")
        return (self.noise_multiplier, self.sampling_rate, self.steps)

    def dp_event(self, *, added: bool = False) -> Any:
        """This charge as dp-accounting's typed event, one to one: ``steps`` compositions
        (``SelfComposedDpEvent``) of ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` (a
        subsampled Gaussian; q = 1: the bare ``GaussianDpEvent(σ)``) or ``LaplaceDpEvent(b)``.
        The RDP accountants compose exactly these (``tests/privacy/test_dp_events.py``
        checks the ε agree). An ``approx_dp`` charge (a release certified (ε, δ) per
        invocation) has no event in dp-accounting: None (the ledger composes it by basic
        composition).

        A truncated charge is ``TruncatedSubsampledGaussianDpEvent(N, q, B, σ)``, whose
        ``dataset_size`` N is the size of the larger dataset of the adjacent pair: |D|
        when the pair removes one of the client's records, |D| + 1 (`added`) when it adds
        one. The ledger's PLD accountant composes both and takes the larger ε
        (`raydpfl.privacy.accounting.truncation`)."""
        import dp_accounting

        if self.mechanism == TRUNCATED:
            assert self.dataset_size is not None and self.max_batch_size is not None
            return dp_accounting.SelfComposedDpEvent(
                dp_accounting.TruncatedSubsampledGaussianDpEvent(
                    dataset_size=self.dataset_size + int(added),
                    sampling_probability=self.sampling_rate,
                    truncated_batch_size=self.max_batch_size,
                    noise_multiplier=self.noise_multiplier,
                ),
                self.steps,
            )
        if self.mechanism == "laplace":
            one: Any = dp_accounting.LaplaceDpEvent(self.noise_multiplier)
        elif self.mechanism == "approx_dp":
            return None
        elif self.sampling_rate == 1.0:
            one = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        else:
            one = dp_accounting.PoissonSampledDpEvent(
                self.sampling_rate, dp_accounting.GaussianDpEvent(self.noise_multiplier)
            )
        return dp_accounting.SelfComposedDpEvent(one, self.steps)

    def history_entry(self) -> ExtendedEntry:
        """The accountants' entry (see
        :data:`raydpfl.privacy.accounting.accountants.ExtendedEntry`)."""
        if self.mechanism == "laplace":
            return ("laplace", self.noise_multiplier, self.steps)
        if self.mechanism == "approx_dp":
            return ("approx_dp", self.epsilon, self.delta, self.steps)
        if self.mechanism == TRUNCATED:
            return (
                "truncated",
                self.noise_multiplier,
                self.sampling_rate,
                self.max_batch_size,
                self.dataset_size,
                self.steps,
            )
        return (self.noise_multiplier, self.sampling_rate, self.steps)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of the fields (``epsilon``/``delta`` only for approx_dp)."""
        out: dict[str, Any] = {
            "noise_multiplier": self.noise_multiplier,
            "sampling_rate": self.sampling_rate,
            "steps": self.steps,
            "mechanism": self.mechanism,
        }
        if self.mechanism == "approx_dp":
            out.update(epsilon=self.epsilon, delta=self.delta)
        if self.mechanism == TRUNCATED:
            out.update(max_batch_size=self.max_batch_size, dataset_size=self.dataset_size)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PrivacyCost:
        """Inverse of :meth:`to_dict`."""
        return cls(
            noise_multiplier=d["noise_multiplier"],
            sampling_rate=d["sampling_rate"],
            steps=d["steps"],
            mechanism=d.get("mechanism", "subsampled_gaussian"),
            epsilon=d.get("epsilon"),
            delta=d.get("delta"),
            max_batch_size=d.get("max_batch_size"),
            dataset_size=d.get("dataset_size"),
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


class LedgerSettings:
    """What every ledger is set with (`PrivacyLedger`, the client-level ledger): its
    accountant (one of `LEDGER_ACCOUNTANTS`), δ in (0, 1) and ε budget (finite > 0, or
    None to record without enforcing), validated once here."""

    def __init__(self, accountant: str, delta: float, epsilon_budget: float | None) -> None:
        self._accountant = validate_ledger_accountant(accountant)
        self._delta = validate_delta(delta)
        if epsilon_budget is not None and not _is_budget(epsilon_budget):
            raise ValueError(
                f"epsilon_budget must be None or a finite real > 0, got {epsilon_budget!r}"
            )
        self._budget = None if epsilon_budget is None else float(epsilon_budget)

    @property
    def accountant(self) -> str:
        """Accountant name."""
        return self._accountant

    @property
    def delta(self) -> float:
        """Per-unit delta (of units without their own budget)."""
        return self._delta

    @property
    def epsilon_budget(self) -> float | None:
        """Per-unit epsilon budget, or ``None`` (no enforcement), of units without
        their own budget."""
        return self._budget

    def _repr(self, details: str) -> str:
        return (
            f"{type(self).__name__}(accountant={self._accountant!r}, delta={self._delta!r}, "
            f"epsilon_budget={self._budget!r}, {details})"
        )


def json_sha256(data: Any) -> str:
    """SHA-256 hex digest of the canonical JSON (sorted keys, no spaces) of `data`."""
    payload = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class PrivacyLedger(LedgerSettings):
    """Append-only record of privacy charges per client, with an optional budget.

    A charge is refused (``BudgetExceededError``, nothing recorded) iff the
    client's epsilon after it would exceed the client's budget:
    ``eps(history + [cost]) > epsilon_budget`` (or ``> epsilon_n`` for a client
    listed in ``client_budgets``, with its epsilon computed at its own ``delta_n``).

    Args:
        accountant: One of :data:`raydpfl.privacy.accounting.accountants.LEDGER_ACCOUNTANTS`.
        delta: Per-client target delta in (0, 1) (clients not in ``client_budgets``).
        epsilon_budget: Per-client epsilon budget (finite, > 0), or ``None``
            to record without enforcing (clients not in ``client_budgets``).
        client_budgets: Optional ``{client_id: (epsilon_n, delta_n)}``: heterogeneous
            budgets, ``epsilon_n`` finite > 0 and ``delta_n`` in [0, 1) (0 = pure DP).

    Raises:
        ValueError: On invalid arguments.
    """

    def __init__(
        self,
        accountant: str,
        delta: float,
        epsilon_budget: float | None,
        client_budgets: Mapping[int, tuple[float, float]] | None = None,
    ) -> None:
        super().__init__(accountant, delta, epsilon_budget)
        #: The plan's mechanisms (`PrivacyPlan.mechanisms`) the server checks each task's
        #: declaration against; None: no check. Not part of the ledger's state.
        self.planned: Any = None
        self._client_budgets: dict[int, tuple[float, float]] = {}
        for cid, pair in (client_budgets or {}).items():
            cid = _check_client_id(cid)
            try:
                eps_n, delta_n = pair
            except (TypeError, ValueError):
                raise ValueError(f"client_budgets[{cid}] must be (epsilon, delta)") from None
            if not _is_budget(eps_n):
                raise ValueError(f"client {cid}: epsilon must be a finite real > 0, got {eps_n!r}")
            if (
                not isinstance(delta_n, numbers.Real)
                or isinstance(delta_n, bool)
                or not 0.0 <= float(delta_n) < 1.0
            ):
                raise ValueError(f"client {cid}: delta must be a real in [0, 1), got {delta_n!r}")
            self._client_budgets[cid] = (float(eps_n), float(delta_n))
        # Charge histories are interned in a trie shared by every client (issue 19): node
        # 0 is the empty history, node k holds its parent, its last charge, its merged
        # accountant entries and its steps. A client is one int (its node), so clients
        # with identical histories share the history, its entries and its ε.
        self._parent: list[int] = [-1]
        self._last: list[PrivacyCost | None] = [None]
        self._node_entries: list[tuple[ExtendedEntry, ...]] = [()]
        self._node_steps: list[int] = [0]
        self._child: dict[tuple[int, PrivacyCost, tuple[bool, ...]], int] = {}
        self._node_of: dict[int, int] = {}  # client id -> node (charged clients only)
        self._node_eps: dict[tuple[int, float], float] = {}  # (node, δ) -> ε
        self._num_charges = 0
        # ε by (merged history, δ): clients with identical charge histories share one
        # accountant evaluation (and skip re-validating the history).
        self._memo: dict[tuple[tuple[ExtendedEntry, ...], float], float] = {}

    # ------------------------------------------------------------------ props
    @property
    def client_budgets(self) -> dict[int, tuple[float, float]]:
        """The heterogeneous ``{client_id: (epsilon_n, delta_n)}`` (a copy; may be empty)."""
        return dict(self._client_budgets)

    @property
    def num_charges(self) -> int:
        """Number of successful charges recorded (all clients)."""
        return self._num_charges

    def delta_of(self, client_id: int) -> float:
        """The delta at which ``client_id``'s epsilon is computed (its own delta_n if set)."""
        cid = _check_client_id(client_id)
        own = self._client_budgets.get(cid)
        return self._delta if own is None else own[1]

    def budget_of(self, client_id: int) -> float | None:
        """``client_id``'s epsilon budget (its own epsilon_n if set; None: not enforced)."""
        cid = _check_client_id(client_id)
        own = self._client_budgets.get(cid)
        return self._budget if own is None else own[0]

    # ---------------------------------------------------------------- queries
    def _eps_of(self, cid: int, entries: tuple[ExtendedEntry, ...]) -> float:
        key = (entries, self.delta_of(cid))
        eps = self._memo.get(key)
        if eps is None:
            eps = compute_epsilon_extended(entries, key[1], self._accountant)
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = eps
        return eps

    def epsilon(self, client_id: int) -> float:
        """Current epsilon of ``client_id`` at its delta (0.0 if never charged)."""
        cid = _check_client_id(client_id)
        node = self._node_of.get(cid, 0)
        key = (node, self.delta_of(cid))
        eps = self._node_eps.get(key)
        if eps is None:
            eps = self._eps_of(cid, self._node_entries[node])
            self._node_eps[key] = eps
        return eps

    def epsilon_after(self, client_id: int, cost: PrivacyCost) -> float:
        """Epsilon ``client_id`` would have after ``cost``; records nothing."""
        cid = _check_client_id(client_id)
        cost = _check_cost(cost)
        node = self._node_of.get(cid, 0)
        return self._eps_of(cid, (*self._node_entries[node], cost.history_entry()))

    def would_exceed(self, client_id: int, cost: PrivacyCost) -> bool:
        """Whether charging ``cost`` would exceed the client's budget (False if none)."""
        budget = self.budget_of(client_id)
        if budget is None:
            _check_cost(cost)
            return False
        return self.epsilon_after(client_id, cost) > budget

    def steps(self, client_id: int) -> int:
        """Total number of steps charged to ``client_id`` (sum over charges)."""
        return self._node_steps[self._node_of.get(_check_client_id(client_id), 0)]

    def history(self, client_id: int) -> tuple[PrivacyCost, ...]:
        """Charges of ``client_id`` in order (empty if never charged)."""
        return self._path(self._node_of.get(_check_client_id(client_id), 0))

    def charged_clients(self) -> list[int]:
        """Sorted ids of clients with at least one recorded charge."""
        return sorted(self._node_of)

    def epsilons(self, client_ids: Iterable[int]) -> np.ndarray:
        """Current epsilons of ``client_ids`` as a float64 array (same order)."""
        return np.array([self.epsilon(c) for c in client_ids], dtype=np.float64)

    def max_epsilon(self) -> float:
        """Largest epsilon over all charged clients (0.0 if none)."""
        return max((self.epsilon(c) for c in self._node_of), default=0.0)

    def mean_epsilon(self, client_ids: Iterable[int] | None = None) -> float:
        """Mean epsilon over ``client_ids`` (default: charged clients); 0.0 if empty."""
        ids = self.charged_clients() if client_ids is None else list(client_ids)
        if not ids:
            return 0.0
        return float(np.mean(self.epsilons(ids)))

    # ---------------------------------------------------------------- updates
    def _record(self, cid: int, cost: PrivacyCost, eps: float | None) -> None:
        parent = self._node_of.get(cid, 0)
        key = (parent, cost, _zero_signs(cost))
        node = self._child.get(key)
        if node is None:
            entries = self._node_entries[parent]
            entry = cost.history_entry()
            if entries and entries[-1][:-1] == entry[:-1]:
                entries = (*entries[:-1], (*entry[:-1], entries[-1][-1] + entry[-1]))
            else:
                entries = (*entries, entry)
            node = len(self._parent)
            self._parent.append(parent)
            self._last.append(cost)
            self._node_entries.append(entries)
            self._node_steps.append(self._node_steps[parent] + cost.steps)
            self._child[key] = node
        self._node_of[cid] = node
        if eps is not None:
            # ε is a function of the history's normalised entries and δ alone (the
            # accountants merge consecutive equal entries), so it is the node's.
            self._node_eps[(node, self.delta_of(cid))] = eps
        self._num_charges += 1

    def _path(self, node: int) -> tuple[PrivacyCost, ...]:
        """The charges of history `node`, oldest first."""
        out: list[PrivacyCost] = []
        while node > 0:
            cost = self._last[node]
            assert cost is not None
            out.append(cost)
            node = self._parent[node]
        return tuple(reversed(out))

    def charge(self, client_id: int, cost: PrivacyCost) -> float:
        """Records ``cost`` for ``client_id`` and returns the new epsilon.

        Raises:
            BudgetExceededError: If the new epsilon would exceed the budget;
                nothing is recorded in that case.
            ValueError: On an invalid ``client_id`` or ``cost``.
        """
        cid = _check_client_id(client_id)
        eps_after = self.epsilon_after(cid, cost)
        budget = self.budget_of(cid)
        if budget is not None and eps_after > budget:
            raise BudgetExceededError(
                f"client {cid}: epsilon would become {eps_after:.6g} > budget {budget:.6g}"
            )
        self._record(cid, cost, eps_after)
        return eps_after

    def try_charge(self, client_id: int, cost: PrivacyCost) -> float | None:
        """Charges ``cost`` if the client can afford it: the new epsilon, or None (and
        nothing recorded) when it would exceed the client's budget. One accountant
        evaluation, where ``would_exceed`` then ``charge`` make two.

        Raises:
            ValueError: On an invalid ``client_id`` or ``cost``.
        """
        return self.try_charge_all(client_id, (cost,))

    def _epsilon_after_all(self, cid: int, costs: Sequence[PrivacyCost]) -> float:
        node = self._node_of.get(cid, 0)
        extra = tuple(_check_cost(c).history_entry() for c in costs)
        return self._eps_of(cid, (*self._node_entries[node], *extra))

    def would_exceed_all(self, client_id: int, costs: Sequence[PrivacyCost]) -> bool:
        """Whether charging every one of ``costs`` would exceed the client's budget."""
        cid = _check_client_id(client_id)
        budget = self.budget_of(cid)
        return budget is not None and self._epsilon_after_all(cid, costs) > budget

    def try_charge_all(self, client_id: int, costs: Sequence[PrivacyCost]) -> float | None:
        """Charges all of ``costs`` in order if the client can afford them together (the
        new epsilon), or none of them (None): a task's several mechanisms are one charge."""
        cid = _check_client_id(client_id)
        eps_after = self._epsilon_after_all(cid, costs)
        budget = self.budget_of(cid)
        if budget is not None and eps_after > budget:
            return None
        for i, cost in enumerate(costs):
            self._record(cid, cost, eps_after if i == len(costs) - 1 else None)
        return eps_after

    # ---------------------------------------------------------- serialisation
    def _entries(self) -> list[dict[str, Any]]:
        return [
            {"client_id": cid, "entries": [c.to_dict() for c in self._path(self._node_of[cid])]}
            for cid in self.charged_clients()
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe snapshot: settings plus every client's charges in order.

        ``client_budgets`` (a list of ``[client_id, epsilon, delta]``) is present only
        when heterogeneous budgets were given, so older snapshots are unchanged.
        """
        out: dict[str, Any] = {
            "format_version": _FORMAT_VERSION,
            "accountant": self._accountant,
            "accountant_description": describe_accountant(self._accountant),
            "delta": self._delta,
            "epsilon_budget": self._budget,
            "clients": self._entries(),
        }
        if self._client_budgets:
            out["client_budgets"] = [
                [cid, eps, delta] for cid, (eps, delta) in sorted(self._client_budgets.items())
            ]
        return out

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
            budgets = {int(c): (e, dl) for c, e, dl in d.get("client_budgets") or ()}
            ledger = cls(d["accountant"], d["delta"], d["epsilon_budget"], budgets or None)
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
        """SHA-256 hex digest of the canonical JSON of all clients' charges (and of the
        heterogeneous budgets, when there are any)."""
        data: Any = self._entries()
        if self._client_budgets:
            data = {"clients": data, "client_budgets": self.to_dict()["client_budgets"]}
        return json_sha256(data)

    def __repr__(self) -> str:
        return self._repr(f"clients={len(self._node_of)}, charges={self._num_charges}")


def _zero_signs(cost: PrivacyCost) -> tuple[bool, ...]:
    """Which float fields of `cost` are -0.0: equal (and equal-hashing) to 0.0, but
    written differently to JSON, so a history node must not share them."""
    values = (cost.noise_multiplier, cost.sampling_rate, cost.epsilon, cost.delta)
    return tuple(v is not None and v == 0.0 and math.copysign(1.0, v) < 0 for v in values)


def _is_budget(value: object) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
        and float(value) > 0.0
    )
