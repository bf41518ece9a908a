"""FedFDP's privacy plan: σ, C, q of the gradient mechanism, the loss release's σ_l and q_l,
and the rounds the budget affords (shared/specs/fedfdp.md §6.2-6.3).

Rounds of a private run (`rounds_from_budget`):
- ``full`` (default): the largest T whose ε, over every mechanism the algorithm releases
  (gradient steps, and for fedfdp / dp_qffl the loss upload), stays within the budget;
  the run stops after min(T, algorithm.rounds) rounds.
- ``paper_model_only``: the paper's count (gradient mechanism only, the authors'
  bisection). It overshoots the budget when a loss is released, so the ledger is built
  without a cap and reports the ε actually spent (e.g. 3.76 at T = 778).
- ``none``: algorithm.rounds; the ledger refuses any task that would exceed the budget.
Both round counts are always written to the metadata (`rounds_budget_full`,
`rounds_budget_paper_model_only`, and the true ε at the paper's count).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from raydpfl.config import as_config_error
from raydpfl.config.schema import Config, ConfigError
from raydpfl.experiment.privacy_settings import check_delta, record_plan
from raydpfl.papers.fedfdp.accounting import fedfdp_history, max_rounds, max_rounds_paper
from raydpfl.privacy.accounting.accountants import compute_epsilon
from raydpfl.privacy.accounting.calibration import largest_feasible_steps
from raydpfl.privacy.accounting.plan import PrivacyPlan

#: Private algorithms that also release a loss each round (a second mechanism).
LOSS_RELEASING = ("fedfdp", "dp_qffl")

History = Callable[[int], list[tuple[float, float, int]]]


def plan_privacy(config: Config, sizes: np.ndarray) -> PrivacyPlan:
    """The plan of a private FedFDP-paper run: σ (fixed: the budget sets the rounds), C,
    q, the loss release (``extra``: ``loss_noise_multiplier``, ``loss_sampling_rate``), the
    round cap (`step_budget`, None under ``rounds_from_budget: none``), the ledger's cap
    (None under ``paper_model_only``) and the statement."""
    exp = config.experiment
    algo, privacy, opts = exp.algorithm, exp.privacy, exp.algorithm.typed_options()
    check_delta(privacy.delta, sizes)
    sigma = privacy.noise_multiplier
    if sigma is None:
        raise ConfigError(
            "experiment.privacy.noise_multiplier",
            f"{algo.name} needs a fixed sigma (the budget sets the number of rounds; paper: 2.0)",
        )
    q, tau = privacy.sampling_rate, algo.local_steps
    q_l = opts.loss_sampling_rate if opts.loss_sampling_rate is not None else q
    sigma_l = opts.loss_noise_multiplier
    releases_loss = algo.name in LOSS_RELEASING
    history_of = _history_fn(releases_loss, sigma, q, tau, sigma_l, q_l)
    t_full, t_paper = _round_budgets(config, releases_loss, history_of, q_l)
    mode = opts.rounds_from_budget
    cap: float | None = privacy.epsilon
    if mode == "full":
        if t_full < 1:
            raise ConfigError(
                "experiment.privacy.epsilon",
                f"the budget allows no round at sigma={sigma}, q={q}; raise epsilon",
            )
        max_r: int | None = t_full
    elif mode == "paper_model_only":
        max_r = t_paper
        # The paper's T overshoots the budget when a loss is released: no cap, so the
        # ledger charges every release and reports the ε really spent.
        cap = None
    else:
        max_r = None
    eps_paper_t = compute_epsilon(history_of(t_paper), privacy.delta, privacy.accountant)
    meta: dict[str, Any] = dict(
        rounds_from_budget=mode,
        rounds_budget_full=t_full,
        rounds_budget_paper_model_only=t_paper,
        epsilon_at_paper_rounds=eps_paper_t,
        rounds_run_at_most=min(algo.rounds, max_r) if max_r is not None else algo.rounds,
        mechanisms=(
            ["gradient SGM(q, sigma) x local_steps per round", "loss SGM(q_l, sigma_l) per round"]
            if releases_loss
            else ["gradient SGM(q, sigma) x local_steps per round"]
        ),
    )
    if releases_loss:
        meta.update(
            covers="every model and every loss value the client released in every round "
            "(each charged before dispatch: the model as SGM(q, sigma) x local_steps, the "
            "loss as SGM(q_l, sigma_l))",
            loss_noise_multiplier=sigma_l,
            loss_sampling_rate=q_l,
            loss_batch="independent Poisson sample (composes additively with the gradient)",
        )
    if mode == "paper_model_only" and releases_loss:
        meta["budget_note"] = (
            f"rounds set by the paper's gradient-only count ({t_paper}); the loss upload is "
            f"charged too, so the delivered epsilon is {eps_paper_t:.3f}, not the "
            f"{privacy.epsilon} budget (the ledger is uncapped and reports it)"
        )
    return record_plan(
        privacy,
        sigma,
        False,
        metadata=meta,
        epsilon=cap,
        step_budget=max_r,
        step_unit="rounds",
        extra={"loss_noise_multiplier": sigma_l, "loss_sampling_rate": q_l},
    )


def _round_budgets(
    config: Config, releases_loss: bool, history_of: History, q_l: float
) -> tuple[int, int]:
    """(T under the full accounting, T by the paper's gradient-only bisection)."""
    exp = config.experiment
    privacy, opts, tau = exp.privacy, exp.algorithm.typed_options(), exp.algorithm.local_steps
    sigma, q = privacy.noise_multiplier, privacy.sampling_rate
    assert sigma is not None
    with as_config_error("experiment.privacy", "cannot derive the round budget: "):
        t_full = (
            max_rounds(
                privacy.epsilon,
                privacy.delta,
                sampling_rate=q,
                noise_multiplier=sigma,
                loss_noise_multiplier=opts.loss_noise_multiplier,
                loss_sampling_rate=q_l,
                local_steps=tau,
                accountant=privacy.accountant,
            )
            if releases_loss
            else largest_feasible_steps(
                lambda t: (
                    compute_epsilon(history_of(t), privacy.delta, privacy.accountant)
                    <= privacy.epsilon
                )
            )
        )
        t_paper = max_rounds_paper(
            privacy.epsilon,
            privacy.delta,
            sampling_rate=q,
            noise_multiplier=sigma,
            local_steps=tau,
        )
    return t_full, t_paper


def _history_fn(releases_loss: bool, sigma: float, q: float, tau: int, sigma_l: float, q_l: float):
    def history(t: int) -> list[tuple[float, float, int]]:
        if releases_loss:
            return fedfdp_history(
                t,
                sampling_rate=q,
                noise_multiplier=sigma,
                loss_noise_multiplier=sigma_l,
                loss_sampling_rate=q_l,
                local_steps=tau,
            )
        return [(sigma, q, t * tau)]

    return history
