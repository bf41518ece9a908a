"""R_c and τ* pinned to the worked values of shared/specs/ali-dpfl.md (§4.5, §4.7)."""

import pytest

from raydpfl.papers.ali_dpfl.theory import (
    choose_local_steps,
    classic_epsilon,
    iteration_budget,
    noise_term,
    round_tau,
    tau_star,
)
from raydpfl.privacy.accounting.accountants import compute_epsilon

EPSILONS = [1.55, 1.75, 2, 2.5, 2.75, 3.25, 3.75, 5.25]
Q, SIGMA, DELTA = 0.015, 1.1, 1e-5


def test_paper_compatible_iteration_budget_reproduces_the_papers_counts():
    # §4.7 [CHECK]: the first six equal the paper's text; 3.75 and 5.25 were set as 5·R_s there.
    counts = [iteration_budget(e, DELTA, Q, SIGMA, mode="paper_compat") for e in EPSILONS]

    assert counts == [79, 177, 317, 598, 775, 1123, 1538, 3015]


def test_exact_classic_budget_is_the_largest_count_within_epsilon():
    counts = [iteration_budget(e, DELTA, Q, SIGMA, conversion="classic") for e in EPSILONS]

    assert counts == [78, 174, 314, 596, 770, 1119, 1537, 3007]
    for e, t in zip(EPSILONS, counts, strict=True):
        assert classic_epsilon(Q, SIGMA, t, DELTA) <= e < classic_epsilon(Q, SIGMA, t + 1, DELTA)


def test_exact_budget_under_the_ledgers_accountant_never_overshoots():
    t = iteration_budget(2.0, DELTA, Q, SIGMA)

    assert compute_epsilon([(SIGMA, Q, t)], DELTA, "rdp") <= 2.0
    assert compute_epsilon([(SIGMA, Q, t + 1)], DELTA, "rdp") > 2.0


@pytest.mark.parametrize(
    ("steps", "expected"), [(317, 2.0050), (79, 1.5504), (1585, 3.806), (2990, 5.233)]
)
def test_classic_epsilon_sanity_values(steps, expected):
    assert classic_epsilon(Q, SIGMA, steps, DELTA) == pytest.approx(expected, abs=6e-4)


@pytest.mark.parametrize(
    ("mu", "gamma", "d", "b", "t", "clip", "paper", "code", "consistent"),
    [
        (1.0, 10, 582_026, 46, 158, 0.1, 21.7695, 21.7353, 15.4032),
        (1.0, 10, 582_026, 1, 158, 0.1, 1.3124, 1.3115, 1.2683),
        (0.5, 0.05, 582_026, 46, 316, 0.1, 2.5015, 2.4999, 2.2516),
        (0.1, 10, 582_026, 3, 790, 0.1, 1.6625, 1.6622, 1.5029),
        (1.0, 0, 582_026, 46, 317, 0.1, 1.4493, 1.4487, 1.4487),
        (2.0, 10, 878_538, 4, 598, 1.0, 1.2959, 1.2957, 1.2606),
    ],
)
def test_tau_star_matches_the_spec_vectors(mu, gamma, d, b, t, clip, paper, code, consistent):
    args = dict(
        mu=mu,
        gamma=gamma,
        total_iterations=t,
        clip_norm=clip,
        noise_multiplier=SIGMA,
        num_params=d,
        min_batch=b,
    )

    got = [tau_star(**args, variant=v) for v in ("paper", "code", "consistent")]

    assert got == pytest.approx([paper, code, consistent], abs=1e-4)


def test_noise_term_matches_the_spec():
    assert noise_term(1.1, 0.1, 582_026, 46) == pytest.approx(3.328, abs=1e-3)


BASE = dict(
    mu=1.0, gamma=10.0, clip_norm=0.1, noise_multiplier=SIGMA, num_params=582_026, min_batch=46.0
)


def test_lemma_1_no_round_limit_means_one_local_step():
    tau = choose_local_steps(
        rounds_budget=400, iteration_budget=317, previous_tau=5, iterations_done=0, **BASE
    )

    assert tau == 1


def test_lemma_2_more_iterations_per_round_allowed_means_more_local_steps():
    # Same rounds R_s = 100; a budget of R_c = 3000 iterations lets T = min(R_s·τ, R_c)
    # reach 3000, while R_c = 317 stops it at 317 — and τ* grows with T (Eq. 9).
    args = dict(rounds_budget=100, previous_tau=30, iterations_done=0, **{**BASE, "gamma": 0.05})

    roomy = choose_local_steps(iteration_budget=3000, **args)
    tight = choose_local_steps(iteration_budget=317, **args)

    assert (roomy, tight) == (7, 3)


def test_tau_star_responds_to_mu_gamma_and_noise_as_the_bound_says():
    def tau(**kw):
        return tau_star(**{**BASE, "total_iterations": 316, **kw})

    assert tau(gamma=10) > tau(gamma=1) > tau(gamma=0)  # grows with Γ
    assert tau(mu=0.01) > tau(mu=0.5) and tau(mu=20) > tau(mu=2)  # grows as μ → 0 or ∞
    assert tau(min_batch=0.5, gamma=0) == pytest.approx(1.5**0.5, abs=0.02)  # noise-dominated


def test_rounding_clamps_and_respects_the_remaining_budget():
    assert round_tau(2.5) == 3 and round_tau(2.49) == 2
    assert round_tau(0.2) == 1 and round_tau(1e6) == 100
    assert round_tau(21.8, remaining=4) == 4
    assert (
        choose_local_steps(
            rounds_budget=10, iteration_budget=317, previous_tau=5, iterations_done=317, **BASE
        )
        == 0
    )


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="mode"):
        iteration_budget(2.0, DELTA, Q, SIGMA, mode="fast")
    with pytest.raises(ValueError, match="mu"):
        tau_star(**{**BASE, "mu": 0.0}, total_iterations=10)
    with pytest.raises(ValueError, match="min_batch"):
        noise_term(1.0, 1.0, 10, 0)
