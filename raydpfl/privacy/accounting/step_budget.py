"""How many sampled-Gaussian steps a budget (ε, δ) affords, and the classic RDP→DP
conversion the papers' own code uses for it.

- `classic_epsilon`: RDP of the sampled Gaussian mechanism at integer orders, composed
  over T steps, converted with the classic bound ε = min_α T·R(α) + log(1/δ)/(α−1)
  (ALI-DPFL spec §4.7; the seed's Def. 4 / Thm. 2 with its typos fixed).
- `iteration_budget`: the most steps within (ε, δ): exactly (the largest T whose ε, under
  the ledger's accountant or the classic conversion, stays within the budget), or by a
  rule a paper registers under a mode name (`register_step_budget_mode`): ALI-DPFL
  registers ``paper_compat``, its authors' Algorithm 3, from its own folder
  (`raydpfl.papers.ali_dpfl.theory`). `raydpfl privacy steps` and ALI-DPFL's plan use it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Literal

import numpy as np

from raydpfl.privacy.accounting.calibration import (
    largest_feasible_steps,
    max_steps_for,
)

__all__ = [
    "CLASSIC_ORDERS",
    "classic_epsilon",
    "iteration_budget",
    "register_step_budget_mode",
    "step_budget_modes",
]

#: A registered step-budget rule: (ε, δ, q, σ) -> the step count it affords.
StepBudgetRule = Callable[[float, float, float, float], int]
_MODES: dict[str, StepBudgetRule] = {}

#: The RDP orders of the authors' code (§4.7 [CODE]): integers 2..63 and 128, 256, 512.
CLASSIC_ORDERS: tuple[int, ...] = (*range(2, 64), 128, 256, 512)


@functools.lru_cache(maxsize=256)
def _rdp_one_step(
    sampling_rate: float, noise_multiplier: float, orders: tuple[int, ...]
) -> np.ndarray:
    # R(α) = log A_α / (α−1), A_α = Σ_k C(α,k) (1−q)^{α−k} q^k exp((k²−k)/(2σ²)) for integer α
    # (§4.7; Mironov, Talwar & Zhang 2019). opacus evaluates exactly this sum in log space.
    from opacus.accountants.analysis.rdp import compute_rdp

    return np.asarray(
        compute_rdp(
            q=sampling_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders)
        )
    )


def classic_epsilon(
    sampling_rate: float,
    noise_multiplier: float,
    steps: float,
    delta: float,
    orders: tuple[int, ...] = CLASSIC_ORDERS,
) -> float:
    """ε of `steps` sampled-Gaussian steps under the classic RDP→DP conversion (§4.7).

    ε_T = min_α [ T·R(α) + log(1/δ)/(α−1) ]. `steps` may be fractional: Algorithm 3
    of the paper bisects over real-valued T.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if steps <= 0:
        return 0.0
    rdp = _rdp_one_step(float(sampling_rate), float(noise_multiplier), tuple(orders))
    alphas = np.asarray(orders, dtype=float)
    return float(np.min(steps * rdp + math.log(1 / delta) / (alphas - 1)))


def register_step_budget_mode(name: str, rule: StepBudgetRule) -> None:
    """Names a paper's own rule for the steps a budget affords (e.g. how its authors'
    code computes it), so `iteration_budget(mode=name)` and ``raydpfl privacy steps
    --mode name`` use it; a paper registers it from its registration function."""
    if name == "exact" or not name.isidentifier():
        raise ValueError(f"a step-budget mode needs a new word for a name, got {name!r}")
    _MODES[name] = rule


def step_budget_modes() -> tuple[str, ...]:
    """``exact`` and every registered mode (the plug-ins register first)."""
    from raydpfl import registry

    registry.names("algorithm")  # loads the plug-ins once: their register() runs
    return ("exact", *sorted(_MODES))


def iteration_budget(
    epsilon: float,
    delta: float,
    sampling_rate: float,
    noise_multiplier: float,
    *,
    mode: str = "exact",
    conversion: Literal["accountant", "classic"] = "accountant",
    accountant: str = "rdp",
) -> int:
    """R_c: the number of DP-SGD iterations a client may run within (ε, δ) (Algorithm 3).

    Args:
        epsilon, delta: The budget.
        sampling_rate, noise_multiplier: q and σ of every iteration.
        mode: ``exact`` (default, §4.7 [REC]) returns the largest integer T with
            ε(T) ≤ ε — never an overshoot. Any other mode is a rule a paper registered
            (`register_step_budget_mode`; `step_budget_modes` lists them): ALI-DPFL's
            ``paper_compat`` replays its authors' code and may exceed ε by up to 0.01.
        conversion: For ``exact``: ``accountant`` uses raydpfl's `accountant` (what the
            ledger charges); ``classic`` uses `classic_epsilon` on the paper's orders.
        accountant: The accountant for ``conversion="accountant"``.
    """
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if mode != "exact":
        if mode not in step_budget_modes():
            raise ValueError(f"mode must be one of {', '.join(step_budget_modes())}, got {mode!r}")
        return _MODES[mode](epsilon, delta, sampling_rate, noise_multiplier)
    if conversion == "accountant":
        return max_steps_for(epsilon, delta, noise_multiplier, sampling_rate, accountant)
    if conversion != "classic":
        raise ValueError(f"conversion must be accountant or classic, got {conversion!r}")
    return largest_feasible_steps(
        lambda t: classic_epsilon(sampling_rate, noise_multiplier, t, delta) <= epsilon
    )
