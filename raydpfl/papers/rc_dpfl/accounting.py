"""RC-DPFL's two-stage privacy accounting (§5.2).

Paper: "Mitigating Disparate Impact of Differential Privacy in Federated Learning through
Robust Clustering" (seed 004; implementation spec shared/specs/robust-clustering.md, cited
as §). One client's DP-SGD history is a full-batch first stage and a Poisson second stage,
priced by the project's accountants: `steps_per_round`, `two_stage_history`,
`two_stage_epsilon`, `two_stage_noise_multiplier`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

import numpy as np

from raydpfl.papers.rc_dpfl._checks import _check_int, _check_positive
from raydpfl.papers.rc_dpfl.assignment import selection_rdp
from raydpfl.privacy.accounting.accountants import (
    HistoryEntry,
    compute_epsilon,
    normalize_history,
    validate_accountant,
    validate_delta,
)
from raydpfl.privacy.accounting.calibration import bisect_safe_end

__all__ = [
    "PAPER_RDP_ORDERS",
    "steps_per_round",
    "two_stage_epsilon",
    "two_stage_history",
    "two_stage_noise_multiplier",
]

#: RDP orders of the authors' moments accountant (§5.2 [CODE]): 1.1, 1.2, ..., 10.9 and
#: 12, ..., 64. Used only by the "paper_compat" accounting mode.
PAPER_RDP_ORDERS: tuple[float, ...] = (
    *(1 + x / 10.0 for x in range(1, 100)),
    *(float(a) for a in range(12, 65)),
)

_MODES = ("exact", "paper_compat")


def steps_per_round(num_samples: int, batch_size: int, local_epochs: int = 1) -> int:
    """E_i(b) = K·⌈N_i/b⌉ local DP-SGD steps of one round (§2 notation, §6.11).

    Raises:
        ValueError: If an argument is not a positive integer or b > N_i.
    """
    n = _check_int("num_samples", num_samples, 1)
    b = _check_int("batch_size", batch_size, 1)
    k = _check_int("local_epochs", local_epochs, 1)
    if b > n:
        raise ValueError(f"batch_size ({b}) must be <= num_samples ({n})")
    return k * math.ceil(n / b)


def two_stage_history(
    noise_multiplier: float,
    num_samples: int,
    batch_size: int,
    *,
    local_epochs: int = 1,
    total_rounds: int = 200,
    first_stage_rounds: int = 1,
    first_batch_size: int | None = None,
) -> tuple[HistoryEntry, ...]:
    """The DP-SGD history of one RC-DPFL client: (z, q₁, T₁) then (z, q₂, T₂) (§5.2).

    Stage 1: `first_stage_rounds` rounds at batch b¹ (default N_i, full batch, q₁ = 1);
    stage 2: the remaining E − rounds₁ rounds at batch b (q₂ = b/N_i, Poisson). Each round
    has K·⌈N_i/b⌉ steps (`steps_per_round`), the count the simulator should also run.
    The same z is used in both stages (Eq. 1: σ_i,DP = c·z(ε, δ, b¹, b^{>1}, N_i, K, E)).

    Returns:
        A tuple of `(noise_multiplier, sampling_rate, steps)` entries for
        `raydpfl.privacy.accounting.accountants.compute_epsilon`.

    Raises:
        ValueError: On out-of-range arguments.
    """
    n = _check_int("num_samples", num_samples, 1)
    rounds = _check_int("total_rounds", total_rounds, 1)
    first = _check_int("first_stage_rounds", first_stage_rounds, 0)
    if first > rounds:
        raise ValueError(f"first_stage_rounds ({first}) must be <= total_rounds ({rounds})")
    b1 = n if first_batch_size is None else _check_int("first_batch_size", first_batch_size, 1)
    steps1 = first * steps_per_round(n, b1, local_epochs)
    steps2 = (rounds - first) * steps_per_round(n, batch_size, local_epochs)
    z = _check_positive("noise_multiplier", noise_multiplier, allow_zero=True)
    return normalize_history([(z, b1 / n, steps1), (z, batch_size / n, steps2)])


def _paper_compat_epsilon(
    z: float,
    delta: float,
    n: int,
    b: int,
    b1: int,
    k: int,
    rounds: int,
    first: int,
    selection_rounds: int,
    selection_eps: float | None,
) -> float:
    # The authors' moments accountant (§5.2 [CODE]): fractional step counts K·rounds·N/b,
    # orders PAPER_RDP_ORDERS and the classic conversion min_α RDP(α) + log(1/δ)/(α − 1).
    from opacus.accountants.analysis.rdp import compute_rdp

    if z == 0.0:
        return math.inf
    orders = list(PAPER_RDP_ORDERS)
    rdp = np.zeros(len(orders))
    for q, steps in ((b1 / n, k * first * n / b1), (b / n, k * (rounds - first) * n / b)):
        if steps > 0:
            rdp += np.asarray(compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=orders))
    if selection_rounds and selection_eps is not None:
        rdp += selection_rounds * selection_rdp(selection_eps, orders)
    alphas = np.asarray(orders)
    return float(np.min(rdp + math.log(1.0 / delta) / (alphas - 1.0)))


def two_stage_epsilon(
    noise_multiplier: float,
    delta: float,
    num_samples: int,
    batch_size: int,
    *,
    local_epochs: int = 1,
    total_rounds: int = 200,
    first_stage_rounds: int = 1,
    first_batch_size: int | None = None,
    accountant: str = "rdp",
    mode: Literal["exact", "paper_compat"] = "exact",
    selection_rounds: int = 0,
    selection_epsilon: float | None = None,
) -> float:
    """ε of one client's full RC-DPFL run: full-batch round(s) + Poisson rounds (§5.2).

    "exact" (default): `compute_epsilon(two_stage_history(...), δ, accountant)` with the
    project's accountants, integer steps K·⌈N/b⌉ per round. "paper_compat": the authors'
    moments accountant (fractional steps K·N/b, orders 1.1..10.9 and 12..64, classic
    RDP→DP conversion); it reproduces the spec's §9 table (z = 1.1898 for N = 2285, ε = 10).

    Optional private selection (§5.4): `selection_rounds` ε_select-exponential mechanisms
    are composed in RDP (α·ε²/8 each). In "exact" mode they enter the history as the
    RDP-equivalent Gaussian entries (2/ε_select, q = 1); that equivalence holds for RDP
    only, so the "prv"/"pld" accountants are refused with a selection cost. Composing in
    RDP is tighter than the authors' budget split (ε_select subtracted from ε).

    Args:
        noise_multiplier: z >= 0 (0 gives inf).
        delta: δ in (0, 1).
        num_samples: N_i.
        batch_size: b of the Poisson stage (≤ N_i).
        local_epochs: K.
        total_rounds: E.
        first_stage_rounds: Rounds at batch b¹ (1 in Algorithm 1).
        first_batch_size: b¹ (default N_i).
        accountant: A project accountant ("exact" mode only).
        mode: "exact" or "paper_compat".
        selection_rounds: Number of private selections (0: none).
        selection_epsilon: ε_select of each selection (required when selection_rounds > 0).

    Returns:
        ε >= 0 (possibly inf).

    Raises:
        ValueError: On invalid arguments.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    delta = validate_delta(delta)
    validate_accountant(accountant)
    history = two_stage_history(
        noise_multiplier,
        num_samples,
        batch_size,
        local_epochs=local_epochs,
        total_rounds=total_rounds,
        first_stage_rounds=first_stage_rounds,
        first_batch_size=first_batch_size,
    )
    selections = _check_int("selection_rounds", selection_rounds, 0)
    eps_select = None
    if selections:
        if selection_epsilon is None:
            raise ValueError("selection_rounds > 0 needs selection_epsilon")
        eps_select = _check_positive("selection_epsilon", selection_epsilon)
    if mode == "paper_compat":
        n = int(num_samples)
        return _paper_compat_epsilon(
            float(noise_multiplier),
            delta,
            n,
            int(batch_size),
            n if first_batch_size is None else int(first_batch_size),
            int(local_epochs),
            int(total_rounds),
            int(first_stage_rounds),
            selections,
            eps_select,
        )
    if eps_select is not None:
        if accountant not in ("rdp", "dp_rdp"):
            raise ValueError(
                f"a selection cost composes in RDP only; use accountant 'rdp' or 'dp_rdp', "
                f"got {accountant!r}"
            )
        history = (*history, (2.0 / eps_select, 1.0, selections))
    return compute_epsilon(history, delta, accountant)


def two_stage_noise_multiplier(
    target_epsilon: float,
    delta: float,
    num_samples: int,
    batch_size: int,
    *,
    sigma_bounds: tuple[float, float] = (1e-3, 1e3),
    precision: float = 1e-6,
    **options: Any,
) -> float:
    """z_i: the smallest noise multiplier meeting (ε, δ) over both stages (§5.2, Eq. 1).

    Bisection on z in `sigma_bounds` (the authors' [0.001, 1000]) until the bracket is
    narrower than `precision`; the upper, safe end is returned, so
    `two_stage_epsilon(z) <= target_epsilon` always holds (the authors stop at
    |ε(z) − ε| < 1e-6 instead, which may overshoot by that much). Arguments as in
    `two_stage_epsilon`, whose keyword arguments (`local_epochs`, `total_rounds`,
    `first_stage_rounds`, `first_batch_size`, `accountant`, `mode`, `selection_rounds`,
    `selection_epsilon`) are passed on as `options`.

    Returns:
        z.

    Raises:
        ValueError: On invalid arguments, if the upper bound misses the target, or if the
            selection cost alone already exceeds it.
    """
    target = _check_positive("target_epsilon", target_epsilon)
    precision = _check_positive("precision", precision)
    lo, hi = (float(v) for v in sigma_bounds)
    if not 0 < lo < hi or not math.isfinite(hi):
        raise ValueError(f"sigma_bounds must satisfy 0 < low < high < inf, got {sigma_bounds}")

    def eps(z: float) -> float:
        # The bracket ends are extreme noise levels where opacus warns that the optimal
        # RDP order sits at the edge of its grid; that is expected there, not a problem.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Optimal order is the")
            return _eps(z)

    def _eps(z: float) -> float:
        return two_stage_epsilon(z, delta, num_samples, batch_size, **options)

    if eps(hi) > target:
        raise ValueError(
            f"target_epsilon={target} is unreachable with noise multiplier <= {hi} "
            "(or the selection cost alone exceeds it)"
        )
    if eps(lo) <= target:
        return lo
    return bisect_safe_end(eps, target, lo, hi, precision)  # eps(lo) > target >= eps(hi)
