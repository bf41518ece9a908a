"""Config of FedFDP / FedFair and their baselines (issue 5; shared/specs/fedfdp.md).

`NAMES` are the algorithm names this section serves (`experiment.algorithm.name`);
the options live under `experiment.algorithm.fedfdp`. The shared knobs come from the
usual places: `experiment.algorithm.{rounds, clients_per_round, local_steps, lr,
batch_size}` and `experiment.privacy.{epsilon, delta, clip_norm, noise_multiplier,
sampling_rate, accountant}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from raydpfl.config._base import _check

#: Non-private algorithms of the FedFDP paper (Table 2/4) and their DP versions (Table 3/5/6).
NONPRIVATE_NAMES: tuple[str, ...] = ("fedfair", "fedprox", "scaffold", "feddyn", "qffl")
PRIVATE_NAMES: tuple[str, ...] = ("fedfdp", "dp_fedprox", "dp_scaffold", "dp_feddyn", "dp_qffl")
#: Algorithm names of the FedFDP paper (the algorithms and their baselines).
NAMES: tuple[str, ...] = NONPRIVATE_NAMES + PRIVATE_NAMES


@dataclass(frozen=True, kw_only=True)
class BoundConfig:
    """Constants of the convergence bound (Eq. 29) that cannot be estimated privately;
    only used by lambda_mode closed_form / numeric (§7). The others (G, Q0, Q1, d, B̂, σ,
    C) are set at run time from public values and DP releases."""

    L: float = 10.0  # smoothness
    mu: float = 1.0  # strong convexity (the paper implicitly takes 1)
    Gamma: float = 0.5  # heterogeneity Γ
    dist0_sq: float = 100.0  # ‖w_1 − w*‖²
    drop_mu_sq: bool = True  # True: the paper's coefficients (drops μ² on ‖w_1−w*‖² terms)

    def __post_init__(self) -> None:
        _check(self.L > 0, "L", f"must be > 0, got {self.L}")
        _check(self.mu > 0, "mu", f"must be > 0, got {self.mu}")
        _check(self.Gamma >= 0, "Gamma", f"must be >= 0, got {self.Gamma}")
        _check(self.dist0_sq >= 0, "dist0_sq", f"must be >= 0, got {self.dist0_sq}")


@dataclass(frozen=True, kw_only=True)
class FedFdpConfig:
    """FedFDP/FedFair options (`experiment.algorithm.fedfdp`)."""

    lam: float = 0.1  # λ, the fairness weight (§11 A14: 0.1, the authors' latest code)
    # fixed: use lam (sweep it); closed_form: the paper's Cardano λ* each round;
    # numeric: argmin of the bound each round (both start from lam).
    lambda_mode: Literal["fixed", "closed_form", "numeric"] = "fixed"
    # Fair clipping for s_j = 1+λΔ_j < 0: abs (sign-safe, default), descent (authors'
    # code intent), zero; paper = Eq. 13 verbatim, NOT DP when a weight goes negative.
    clip_mode: Literal["abs", "descent", "zero", "paper"] = "abs"
    allow_not_dp: bool = False  # must be true to use clip_mode=paper
    initial_global_loss: float = 0.0  # F(w_0), data-independent (§11 A8)
    loss_noise_multiplier: float = 5.0  # σ_l
    loss_sampling_rate: float | None = None  # q_l of the loss batch; null = privacy.sampling_rate
    loss_clip_init: float = 2.5  # C_l^0
    loss_clip_floor: float = 1e-3  # C_l ≥ floor (avoids the absorbing zero, §11 A7)
    loss_clip_multiplier: float = 1.0  # C_l^i ← max(floor, multiplier·F̃_i) after a release
    # Rounds: full = the largest T whose both-mechanism ε ≤ budget (run stops there);
    # paper_model_only = the paper's count (gradient only, overshoots the budget: the
    # ledger then has no cap and reports the true, larger ε); none = algorithm.rounds.
    rounds_from_budget: Literal["full", "paper_model_only", "none"] = "full"
    # DP-SGD divisor: q·|D_i| (expected) or a constant (the authors' code: 64).
    normalizer: Literal["expected", "fixed"] = "expected"
    fixed_divisor: float = 64.0  # the divisor of normalizer: fixed
    # Non-private local work: epoch = one pass in batches of ⌈q|D_i|⌉ (Alg. 1), steps =
    # algorithm.local_steps batches of algorithm.batch_size.
    local_mode: Literal["epoch", "steps"] = "epoch"
    fedfair_loss_eval: Literal["full", "batch"] = "full"  # FedFair's uploaded loss
    # FedFair: clamp the factor 1+λΔ from below (e.g. 0: no ascent steps); null = paper.
    fedfair_min_factor: float | None = None
    prox_mu: float = 0.01  # FedProx μ (§11 A16)
    feddyn_alpha: float = 0.01  # FedDyn α
    scaffold_global_lr: float = 1.0  # SCAFFOLD η_g
    qffl_q: float = 1.0  # q-FFL exponent (not the sampling rate, §11 A19)
    qffl_init_loss: float | None = None  # DP q-FFL's F_k before the first release; null = ln K
    bound: BoundConfig = field(default_factory=BoundConfig)

    def __post_init__(self) -> None:
        _check(self.lam >= 0, "lam", f"must be >= 0, got {self.lam}")
        _check(
            self.clip_mode != "paper" or self.allow_not_dp,
            "clip_mode",
            "paper is Eq. 13 verbatim and is not DP when 1+λΔ < 0; set allow_not_dp: true",
        )
        _check(self.loss_noise_multiplier > 0, "loss_noise_multiplier", "must be > 0")
        _check(
            self.loss_sampling_rate is None or 0 < self.loss_sampling_rate <= 1,
            "loss_sampling_rate",
            "must be in (0, 1]",
        )
        _check(self.loss_clip_init > 0, "loss_clip_init", "must be > 0")
        _check(self.loss_clip_floor >= 0, "loss_clip_floor", "must be >= 0")
        _check(self.loss_clip_multiplier > 0, "loss_clip_multiplier", "must be > 0")
        _check(self.fixed_divisor > 0, "fixed_divisor", "must be > 0")
        _check(self.prox_mu >= 0, "prox_mu", "must be >= 0")
        _check(self.feddyn_alpha > 0, "feddyn_alpha", "must be > 0")
        _check(self.scaffold_global_lr > 0, "scaffold_global_lr", "must be > 0")
        _check(self.qffl_q >= 0, "qffl_q", "must be >= 0")
        _check(
            self.qffl_init_loss is None or self.qffl_init_loss > 0, "qffl_init_loss", "must be > 0"
        )
