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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from raydpfl.privacy.accounting.ledger import PrivacyLedger
from raydpfl.privacy.mechanisms.kernel import SubsampledGaussian

__all__ = ["PrivacyPlan"]


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
        return PrivacyLedger(
            self.accountant, self.delta, self.epsilon, client_budgets=self.client_budgets
        )

    def summary(self) -> dict[str, Any]:
        """The privacy metadata of the run (a mutable copy of `metadata`)."""
        return dict(self.metadata)
