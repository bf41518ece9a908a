"""One run's privacy parameters, decided in one place: the privacy plan.

A planning function (the core's `raydpfl.experiment.privacy_settings.plan_dp_sgd` for
DP-FedAvg, one per seed paper: ``raydpfl.papers.<paper>.privacy_plan.plan_privacy``) reads
the config once and returns a `PrivacyPlan`: σ (given or calibrated), C, q, the budget and
the accountant, what the budget affords (ALI-DPFL's R_c, FedFDP's rounds, ...), and the
statement the run's summary makes. The builder then makes the algorithm *from the plan*:
the σ, C and q its mechanisms are built with (the algorithm's tasks declare
`SubsampledGaussian(σ, C, q)` of these; `subsampled_gaussian` is that mechanism) and the
ledger (`ledger`) come from the same object, so σ is decided once and the charge is the
plan's. A builder re-mapping σ, C or q on its own is what this replaces.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from raydpfl.privacy.accounting.ledger import PrivacyLedger
from raydpfl.privacy.mechanisms.kernel import (
    Mechanism,
    MechanismUse,
    PrivacyContractError,
    SubsampledGaussian,
)

__all__ = [
    "Ladder",
    "PerClient",
    "PlannedMechanism",
    "PrivacyPlan",
    "Within",
    "check_planned",
]

#: Relative slack when a declared value is compared with the plan's (the same float
#: computed along two paths, e.g. q = b/N_i).
_REL_TOL = 1e-12


def _same(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=_REL_TOL, abs_tol=0.0)


@dataclass(frozen=True)
class Ladder:
    """A schedule the plan fixes in advance: the values max(start·factor^k, floor),
    k = 0, 1, 2, … (Adap DP-FL's σ decay; which rung a round is on is the algorithm's
    choice from released values)."""

    start: float
    factor: float
    floor: float = 0.0

    def allows(self, value: float, client: int) -> bool:
        value = float(value)
        rung = float(self.start)
        for _ in range(10_000):
            if _same(value, max(rung, self.floor)):
                return True
            if rung <= self.floor or not 0 < self.factor < 1:
                return False
            rung *= self.factor
        return False

    def describe(self) -> str:
        return f"max({self.start:g}·{self.factor:g}^k, {self.floor:g})"


@dataclass(frozen=True)
class Within:
    """Any value in [low, high] (an adaptive clip bound the algorithm moves within the
    plan's range: the mechanism's charge does not depend on it)."""

    low: float
    high: float

    def allows(self, value: float, client: int) -> bool:
        return self.low * (1 - _REL_TOL) <= float(value) <= self.high * (1 + _REL_TOL)

    def describe(self) -> str:
        return f"[{self.low:g}, {self.high:g}]"


@dataclass(frozen=True)
class PerClient:
    """One planned value per client id (RC-DPFL's z_i, q_i = b/N_i)."""

    values: tuple[float, ...]

    def allows(self, value: float, client: int) -> bool:
        return 0 <= client < len(self.values) and _same(value, self.values[client])

    def describe(self) -> str:
        return f"per client ({len(self.values)} values)"


Planned = float | Ladder | Within | PerClient


@dataclass(frozen=True)
class PlannedMechanism:
    """A mechanism the plan allows a task to declare: the kernel type, the fields the plan
    fixes (a value, or a `Ladder`, `Within` or `PerClient` of values), and what it leaves to
    the algorithm (`free`: a field the platform checks at release time, e.g. a full-batch
    release's sensitivity, or one calibrated per client from the plan's budgets)."""

    kind: type[Mechanism]
    fixed: Mapping[str, Planned]
    free: str = ""

    def allows(self, mechanism: Mechanism, client: int) -> bool:
        if type(mechanism) is not self.kind:
            return False
        for name, planned in self.fixed.items():
            value = getattr(mechanism, name)
            ok = (
                planned.allows(value, client)
                if hasattr(planned, "allows")
                else _same(value, planned)
            )  # type: ignore[union-attr]
            if not ok:
                return False
        return True

    def describe(self) -> str:
        fields = ", ".join(
            f"{k}={v.describe() if hasattr(v, 'describe') else format(v, 'g')}"  # type: ignore[union-attr]
            for k, v in self.fixed.items()
        )
        return f"{self.kind.kind}({fields})"


def check_planned(
    planned: Sequence[PlannedMechanism] | None,
    client: int,
    round_idx: int,
    declared: Sequence[MechanismUse],
    algorithm: str = "",
) -> None:
    """Raises `PrivacyContractError` (one line) unless every record-level mechanism a task
    declares is one the run's privacy plan allows. ``planned`` None: the plan states no
    mechanisms (an algorithm passed from Python, or a plan made by hand), nothing to check."""
    if planned is None:
        return
    for use in declared:
        m = use.mechanism
        if m.population_level or any(p.allows(m, client) for p in planned):
            continue
        who = f"algorithm {algorithm!r}, " if algorithm else ""
        allowed = "; ".join(p.describe() for p in planned) or "no mechanism"
        raise PrivacyContractError(
            f"{who}client {client}, round {round_idx + 1}: the task declares {m.describe()}, "
            f"which the run's privacy plan does not allow (planned: {allowed}); build "
            "mechanisms from the plan's sigma, C and q"
        )


@dataclass(frozen=True)
class PrivacyPlan:
    """The privacy parameters of one run (record-level DP unless ``unit`` says otherwise).

    Attributes:
        unit: What one ε is about: ``record`` (one training record of one client).
        accountant: The ledger's accountant.
        delta: δ of every client (`client_budgets` overrides it per client).
        epsilon: The per-client ε budget the ledger enforces; None: uncapped (the ledger
            only reports what was spent, e.g. FedFDP's ``paper_model_only`` rounds).
        client_budgets: Per-client (ε_n, δ_n) (DPFL-BCS's heterogeneous budgets), or None.
        clip_norm: C of the DP-SGD mechanism (None where the paper's release is not DP-SGD).
        noise_multiplier: σ of the DP-SGD mechanism (None likewise).
        sampling_rate: q of the DP-SGD mechanism (None likewise).
        noise_calibrated: σ was solved from the budget (True) or given (False).
        step_budget: What the budget affords, in the paper's unit (`step_unit`): ALI-DPFL's
            R_c iterations, FedFDP's rounds; None when the ledger alone stops the run.
        step_unit: What `step_budget` counts (``iterations``, ``rounds``), or "".
        extra: Further planned quantities of the paper's own mechanisms (e.g. FedFDP's
            loss release σ_l and q_l), by name.
        metadata: What the run's summary.json states about privacy.
        mechanisms: The mechanisms a task may declare (`PlannedMechanism`), or None.
    """

    unit: Literal["record", "client"]
    accountant: str
    delta: float
    epsilon: float | None
    clip_norm: float | None = None
    noise_multiplier: float | None = None
    sampling_rate: float | None = None
    noise_calibrated: bool = False
    client_budgets: Mapping[int, tuple[float, float]] | None = None
    step_budget: int | None = None
    step_unit: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: The record-level mechanisms a task may declare (None: the plan states none, and
    #: declarations are not checked against it). `record_plan` starts it with the DP-SGD
    #: mechanism; a builder adds its paper's own (`with_mechanisms`).
    mechanisms: tuple[PlannedMechanism, ...] | None = None

    def with_mechanisms(self, *planned: PlannedMechanism, replace: bool = False) -> PrivacyPlan:
        """This plan allowing `planned` too (or only, with `replace`)."""
        base = () if replace or self.mechanisms is None else self.mechanisms
        return dataclasses.replace(self, mechanisms=(*base, *planned))

    def dp_sgd_planned(self, free: str = "", **fixed: Planned | None) -> PlannedMechanism:
        """The plan's DP-SGD mechanism as a `PlannedMechanism` (σ, C, q fixed; `fixed`
        overrides one, e.g. a `Ladder` of σ, or with None leaves it to the algorithm, which
        `free` says why)."""
        values: dict[str, Planned | None] = {
            "noise_multiplier": float(self.noise_multiplier),  # type: ignore[arg-type]
            "clip_norm": float(self.clip_norm),  # type: ignore[arg-type]
            "sampling_rate": float(self.sampling_rate),  # type: ignore[arg-type]
        }
        values.update(fixed)
        kept = {k: v for k, v in values.items() if v is not None}
        return PlannedMechanism(SubsampledGaussian, kept, free)  # type: ignore[arg-type]

    def subsampled_gaussian(self) -> SubsampledGaussian:
        """The plan's DP-SGD mechanism SubsampledGaussian(σ, C, q).

        Raises:
            ValueError: The plan has no DP-SGD parameters.
        """
        if None in (self.noise_multiplier, self.clip_norm, self.sampling_rate):
            raise ValueError("this privacy plan has no DP-SGD (subsampled Gaussian) mechanism")
        return SubsampledGaussian(
            float(self.noise_multiplier),  # type: ignore[arg-type]
            float(self.clip_norm),  # type: ignore[arg-type]
            float(self.sampling_rate),  # type: ignore[arg-type]
        )

    def ledger(self) -> PrivacyLedger:
        """A fresh per-client ledger with the plan's accountant, δ and budgets.

        Raises:
            ValueError: A client-level plan (its ledger is the population's
                `raydpfl.privacy.accounting.client_level.ClientLevelLedger`).
        """
        if self.unit != "record":
            raise ValueError("a client-level plan's ledger is the population's ClientLevelLedger")
        ledger = PrivacyLedger(
            self.accountant, self.delta, self.epsilon, client_budgets=self.client_budgets
        )
        ledger.planned = self.mechanisms  # what the server checks declarations against
        return ledger

    def summary(self) -> dict[str, Any]:
        """The privacy metadata of the run (a mutable copy of `metadata`)."""
        return dict(self.metadata)
