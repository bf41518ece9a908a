"""Config of ALI-DPFL and its baselines (shared/specs/ali-dpfl.md; defaults are its [REC]s).

`NAMES` are the algorithm names this paper serves: ``ali_dpfl`` (adaptive τ), its fixed-τ
baseline ``dp_fedavg_fixed_tau`` (reads the R_c settings of `AliDpflConfig` too), and the
baselines ``pe_dpfl`` and ``adap_dp_fl``. Options live under
``experiment.algorithm.ali_dpfl`` (``.pe_dpfl``, ``.adap_dp_fl``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raydpfl.config._base import _check

NAMES: tuple[str, ...] = ("ali_dpfl", "dp_fedavg_fixed_tau", "pe_dpfl", "adap_dp_fl")


@dataclass(frozen=True, kw_only=True)
class AliDpflConfig:
    """ALI-DPFL's options (algorithm `ali_dpfl`; R_c settings also for
    `dp_fedavg_fixed_tau`). Defaults are the settings the reproduction recommends
    (raydpfl/papers/ali_dpfl/README.md)."""

    gamma: float = 10.0  # Γ: 10 for Dir(0.05); Table V: IID 0, Dir(0.5) 5, Dir(1) 1
    gamma_mode: Literal["fixed", "code_estimate"] = "fixed"  # code_estimate: unaccounted
    mu_probe_size: int | None = 512  # records per client for the μ estimate; null = all
    # μ's numerator: paper (a probe's gradient difference, unaccounted), code_torch (the
    # authors' PyTorch: the last local step's displacement, DP-clean), code_mindspore
    # (their MindSpore port: the last batch's gradient difference, unaccounted).
    mu_estimator: Literal["paper", "code_torch", "code_mindspore"] = "paper"
    # τ*: paper (Eq. 9), code (the authors' 2 + 2/T), consistent (β = 2/μ).
    tau_formula: Literal["paper", "code", "consistent"] = "paper"
    tau_init: int = 1  # τ of round 1 (before any μ estimate)
    tau_max: int = 100  # τ* is clamped to this
    # R_c from the budget: exact (largest T with ε(T) ≤ ε) or the paper's bisection.
    rc_mode: Literal["exact", "paper_compat"] = "exact"
    # exact mode: the ledger's accountant, or the paper's classic RDP→DP conversion.
    rc_conversion: Literal["accountant", "classic"] = "accountant"
    # truncate: τ_k = min(τ*, R_c − t); skip: stop when τ* does not fit (authors' code).
    last_round: Literal["truncate", "skip"] = "truncate"
    # DP-SGD divisor: q·|D_i| (a public constant) or the realised batch size (paper).
    # fixed: a constant divisor, fixed_divisor (the authors' code: 64).
    normalizer: Literal["expected", "actual", "fixed"] = "expected"
    fixed_divisor: float = 64.0  # the divisor of normalizer: fixed

    def __post_init__(self) -> None:
        _check(self.gamma >= 0, "gamma", f"must be >= 0, got {self.gamma}")
        _check(
            self.mu_probe_size is None or self.mu_probe_size >= 1,
            "mu_probe_size",
            "must be null (all records) or >= 1",
        )
        _check(self.tau_init >= 1, "tau_init", f"must be >= 1, got {self.tau_init}")
        _check(self.tau_max >= 1, "tau_max", f"must be >= 1, got {self.tau_max}")
        _check(self.fixed_divisor > 0, "fixed_divisor", f"must be > 0, got {self.fixed_divisor}")


@dataclass(frozen=True, kw_only=True)
class PeDpflConfig:
    """PE-DPFL's options (ALI-DPFL's baseline; formulas assumed, see `pe_dpfl`)."""

    reg_weight: float = 0.1  # λ of the classifier-perturbation regulariser
    perturbation_std: float | None = None  # null: the aggregate's noise std, 2zS/sqrt(K)
    num_perturbations: int = 1  # perturbation draws per step
    update_clip_norm: float | None = None  # S; null: privacy.clip_norm

    def __post_init__(self) -> None:
        _check(0 <= self.reg_weight <= 1, "reg_weight", "must be in [0, 1]")
        _check(
            self.perturbation_std is None or self.perturbation_std >= 0,
            "perturbation_std",
            "must be null or >= 0",
        )
        _check(self.num_perturbations >= 1, "num_perturbations", "must be >= 1")
        _check(
            self.update_clip_norm is None or self.update_clip_norm > 0,
            "update_clip_norm",
            "must be null or > 0",
        )


@dataclass(frozen=True, kw_only=True)
class AdapDpFlConfig:
    """Adap DP-FL's options (ALI-DPFL's baseline; formulas assumed, see `adap_dp_fl`)."""

    noise_decay: float = 0.9  # σ ← β·σ after `patience` consecutive loss decreases
    patience: int = 4  # consecutive decreases of the noisy loss before σ decays
    clip_factor: float = 1.0  # C_k = factor × mean noisy gradient norm of the last round
    # noisy: the norm as released; debiased: minus the noise's expected norm.
    clip_estimator: Literal["noisy", "debiased"] = "noisy"
    clip_min: float | None = None  # C_k clamped from below; null = no floor
    clip_max: float | None = None  # C_k clamped from above; null = no cap
    min_noise_multiplier: float = 0.0  # σ never decays below this
    loss_clip: float = 5.0  # the DP loss query clips each loss to [0, loss_clip]

    def __post_init__(self) -> None:
        _check(0 < self.noise_decay <= 1, "noise_decay", "must be in (0, 1]")
        _check(self.patience >= 1, "patience", "must be >= 1")
        _check(self.clip_factor > 0, "clip_factor", "must be > 0")
        _check(self.clip_min is None or self.clip_min > 0, "clip_min", "must be null or > 0")
        _check(self.clip_max is None or self.clip_max > 0, "clip_max", "must be null or > 0")
        _check(self.min_noise_multiplier >= 0, "min_noise_multiplier", "must be >= 0")
        _check(self.loss_clip > 0, "loss_clip", "must be > 0")
