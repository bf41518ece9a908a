"""FedFDP's mathematics pinned to shared/specs/fedfdp.md (§5, §6.3, §7) and to independent
computations written here (opacus' RDPAccountant stepped by hand, the integer-order RDP sum
of Eq. 26, numpy's polynomial roots)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy.special import gammaln, logsumexp

from raydpfl.papers.fedfdp.accounting import (
    PAPER_ORDERS,
    fedfdp_history,
    max_rounds,
    max_rounds_paper,
    paper_epsilon,
)
from raydpfl.papers.fedfdp.convergence import (
    BoundCoefficients,
    BoundConstants,
    DegenerateBoundWarning,
    bound_coefficients,
    cardano_roots,
    convergence_bound,
    lambda_star_cardano,
    lambda_star_numeric,
)
from raydpfl.papers.fedfdp.theory import (
    clip_losses,
    fair_clip_weights,
    fair_clip_weights_paper,
    fairness_scale,
    next_loss_clip_bound,
    private_mean_loss,
)
from raydpfl.privacy.accounting.accountants import compute_epsilon
from raydpfl.privacy.per_sample.dpsgd import CLIP_EPS, clip_weights

Q, SIGMA, SIGMA_L, DELTA = 0.05, 2.0, 5.0, 1e-5
LAMBDAS = [-1e6, -50.0, -1.0, -1e-3, 0.0, 1e-4, 0.1, 1.0, 50.0, 1e6]
MODES = ["abs", "descent", "zero"]


# --------------------------------------------------------------------------------------- #
# Fair clipping (Eq. 13)
# --------------------------------------------------------------------------------------- #
def _random_inputs(seed: int, n: int = 512, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(seed)
    norms = 10 ** (torch.rand(n, generator=g, dtype=dtype) * 16 - 8)  # 1e-8 .. 1e8
    norms[:4] = torch.tensor([0.0, 1e-30, 1e30, 0.1], dtype=dtype)
    losses = 10 ** (torch.rand(n, generator=g, dtype=dtype) * 8 - 4) - 1.0
    losses[:5] = torch.tensor([math.inf, -math.inf, 0.0, 1e30, -1e30], dtype=dtype)
    return norms, losses


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sign_safe_weights_never_give_a_norm_above_c(mode, dtype):
    clip = 0.1
    for seed in range(3):
        norms, losses = _random_inputs(seed, dtype=dtype)
        for lam in LAMBDAS:
            for global_loss in (0.0, 2.3, -5.0, 1e4):
                w = fair_clip_weights(norms, losses, global_loss, lam, clip, negative=mode)

                assert torch.isfinite(w).all()
                # Relative float rounding only: |w|·‖g‖ = C·‖g‖/(‖g‖ + 1e-6) < C exactly.
                assert (w.abs() * norms <= clip * (1 + 4 * torch.finfo(dtype).eps)).all()


def test_sign_safe_weights_on_real_vectors_bound_every_summand():
    g = torch.Generator().manual_seed(7)
    grads = torch.randn(256, 50, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, 256)[
        :, None
    ].to(torch.float64)
    losses = torch.rand(256, generator=g, dtype=torch.float64) * 6
    w = fair_clip_weights(grads.norm(dim=1), losses, 2.5, 3.0, 0.5)

    assert ((w[:, None] * grads).norm(dim=1) <= 0.5 * (1 + 1e-12)).all()
    assert (fairness_scale(losses, 2.5, 3.0) < 0).any()  # the negative branch was exercised


@pytest.mark.parametrize("mode", MODES)
def test_sign_safe_weights_equal_eq13_where_the_fairness_factor_is_non_negative(mode):
    norms, losses = _random_inputs(11)
    for lam in LAMBDAS:
        s = fairness_scale(losses, 2.0, lam)
        w = fair_clip_weights(norms, losses, 2.0, lam, 0.1, negative=mode)
        eq13 = torch.minimum(s, 0.1 / (norms + CLIP_EPS))
        keep = s >= 0

        assert torch.equal(w[keep], eq13[keep])


def test_negative_factor_rules():
    norms = torch.tensor([1.0, 1e-3, 10.0, 2.0], dtype=torch.float64)
    losses = torch.tensor([0.0, 0.0, 0.0, 3.0], dtype=torch.float64)  # global loss 2, λ = 1
    s = fairness_scale(losses, 2.0, 1.0)  # 1 + (ℓ − 2) = [-1, -1, -1, 2]
    cap = 0.1 / (norms + CLIP_EPS)

    abs_w = fair_clip_weights(norms, losses, 2.0, 1.0, 0.1)
    descent = fair_clip_weights(norms, losses, 2.0, 1.0, 0.1, negative="descent")
    zero = fair_clip_weights(norms, losses, 2.0, 1.0, 0.1, negative="zero")

    assert s.tolist() == [-1.0, -1.0, -1.0, 2.0]
    assert torch.equal(abs_w[:3], -torch.minimum(torch.ones(3, dtype=torch.float64), cap[:3]))
    assert abs_w[1] == -1.0  # |s|·‖g‖ = 1e-3 < C: unclipped ascent step
    assert torch.equal(descent[:3], cap[:3])
    assert zero[:3].tolist() == [0.0, 0.0, 0.0]
    assert abs_w[3] == descent[3] == zero[3] == cap[3]


def test_lambda_zero_is_plain_dp_sgd_clipping_even_for_infinite_losses():
    norms, losses = _random_inputs(3)

    for mode in MODES:
        w = fair_clip_weights(norms, losses, 2.0, 0.0, 0.1, negative=mode)
        assert torch.equal(w, clip_weights(norms, 0.1))
    w, flagged = fair_clip_weights_paper(norms, losses, 2.0, 0.0, 0.1)
    assert torch.equal(w, clip_weights(norms, 0.1))
    assert not flagged


def test_large_clip_norm_gives_pure_fairness_scaling():
    norms = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    losses = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)

    w = fair_clip_weights(norms, losses, 2.0, 0.25, 1e9)

    assert torch.allclose(w, torch.tensor([0.75, 1.0, 1.5], dtype=torch.float64))


def test_paper_rule_flags_negative_factors_and_then_breaks_the_bound():
    norms = torch.tensor([5.0, 5.0, 0.01], dtype=torch.float64)
    losses = torch.tensor([0.1, 3.0, 2.0], dtype=torch.float64)

    w, flagged = fair_clip_weights_paper(norms, losses, 2.0, 10.0, 0.1)

    assert flagged
    assert w[0] == pytest.approx(1 + 10 * (0.1 - 2.0))  # = −18, the unbounded branch
    assert (w.abs() * norms).max() > 0.1  # ‖c_j g_j‖ = 90 > C: not DP


def test_paper_rule_agrees_with_the_safe_rule_when_nothing_is_negative():
    norms, losses = _random_inputs(5)
    losses = losses.clamp(min=0.0)

    w, flagged = fair_clip_weights_paper(norms, losses, 2.0, 0.4, 0.1)  # s ≥ 1 − 0.8 > 0

    assert not flagged
    assert torch.equal(w, fair_clip_weights(norms, losses, 2.0, 0.4, 0.1))


@pytest.mark.parametrize(
    ("norms", "losses", "kwargs", "match"),
    [
        (torch.ones(3), torch.ones(2), {}, "same length"),
        (torch.ones(2, 2), torch.ones(2, 2), {}, "1-D"),
        (torch.tensor([float("nan")]), torch.ones(1), {}, "norms"),
        (torch.tensor([-1.0]), torch.ones(1), {}, "norms"),
        (torch.ones(1), torch.tensor([float("nan")]), {}, "losses"),
        (torch.ones(1), torch.ones(1), {"clip_norm": 0.0}, "clip_norm"),
        (torch.ones(1), torch.ones(1), {"lam": math.inf}, "lam"),
        (torch.ones(1), torch.ones(1), {"negative": "ref_code"}, "negative"),
    ],
)
def test_fair_clip_rejects_bad_inputs(norms, losses, kwargs, match):
    args = {"global_loss": 2.0, "lam": 0.1, "clip_norm": 0.1, **kwargs}
    with pytest.raises(ValueError, match=match):
        fair_clip_weights(norms, losses, **args)


# --------------------------------------------------------------------------------------- #
# The loss upload (Eqs. 14–15)
# --------------------------------------------------------------------------------------- #
def test_clip_losses_maps_everything_into_the_bound():
    losses = torch.tensor([-1.0, 0.5, 3.0, math.inf, -math.inf, math.nan])

    assert clip_losses(losses, 2.5).tolist() == [0.0, 0.5, 2.5, 2.5, 0.0, 2.5]
    assert clip_losses(losses, 0.0).tolist() == [0.0] * 6


def test_private_mean_loss_clips_and_adds_noise_of_std_sigma_l_times_c_l():
    losses = torch.tensor([0.5, 1.0, 4.0, 9.0, -2.0], dtype=torch.float64)  # clipped sum 6.5
    gen = torch.Generator().manual_seed(1234)
    n, bound, den = 10_000, 2.5, 8.0

    draws = np.array(
        [
            private_mean_loss(
                losses, clip_bound=bound, noise_multiplier=SIGMA_L, denominator=den, generator=gen
            )
            for _ in range(n)
        ]
    )
    std = SIGMA_L * bound / den

    assert abs(draws.mean() - 6.5 / den) < 4 * std / math.sqrt(n)  # unclipped: 12.5/8
    assert draws.std() == pytest.approx(std, rel=0.04)  # sd of the estimate ≈ 0.7%


def test_private_mean_loss_edge_cases():
    gen = torch.Generator().manual_seed(0)
    zero = private_mean_loss(
        torch.tensor([3.0]), clip_bound=0.0, noise_multiplier=5.0, denominator=1.0, generator=gen
    )
    noiseless = private_mean_loss(
        torch.tensor([3.0, 1.0]),
        clip_bound=2.0,
        noise_multiplier=0.0,
        denominator=4.0,
        generator=gen,
    )
    empty = private_mean_loss(
        torch.empty(0), clip_bound=2.0, noise_multiplier=5.0, denominator=4.0, generator=gen
    )

    assert zero == 0.0
    assert noiseless == 0.75
    assert empty != 0.0  # an empty Poisson batch still releases noise
    with pytest.raises(ValueError, match="denominator"):
        private_mean_loss(
            torch.ones(2), clip_bound=1.0, noise_multiplier=1.0, denominator=0.0, generator=gen
        )


def test_adaptive_loss_bound_has_a_floor_against_the_absorbing_zero():
    assert next_loss_clip_bound(1.7) == 1.7
    assert next_loss_clip_bound(-0.4) == 1e-3
    assert next_loss_clip_bound(-0.4, floor=0.0) == 0.0  # the authors' code: stuck at 0
    assert next_loss_clip_bound(1.0, multiplier=1.5) == 1.5
    with pytest.raises(ValueError, match="floor"):
        next_loss_clip_bound(1.0, floor=-1.0)
    with pytest.raises(ValueError, match="noisy_loss"):
        next_loss_clip_bound(math.nan)


# --------------------------------------------------------------------------------------- #
# Accounting (§6)
# --------------------------------------------------------------------------------------- #
def test_history_entries():
    assert fedfdp_history(
        10, sampling_rate=Q, noise_multiplier=SIGMA, loss_noise_multiplier=5
    ) == [
        (2.0, 0.05, 10),
        (5.0, 0.05, 10),
    ]
    assert fedfdp_history(
        10,
        sampling_rate=Q,
        noise_multiplier=SIGMA,
        loss_noise_multiplier=5,
        loss_sampling_rate=0.1,
        local_steps=3,
    ) == [(2.0, 0.05, 30), (5.0, 0.1, 10)]
    shared = fedfdp_history(
        10, sampling_rate=Q, noise_multiplier=SIGMA, loss_noise_multiplier=5, loss_batch="shared"
    )
    assert shared[0][2] == 0
    assert shared[1][0] == pytest.approx(1.8569533817705186)  # (1/4 + 1/25)^(−1/2), §6.4
    with pytest.raises(ValueError, match="shared"):
        fedfdp_history(
            1,
            sampling_rate=Q,
            noise_multiplier=2,
            loss_noise_multiplier=5,
            loss_sampling_rate=0.1,
            loss_batch="shared",
        )
    with pytest.raises(ValueError, match="local_steps"):
        fedfdp_history(
            1, sampling_rate=Q, noise_multiplier=2, loss_noise_multiplier=5, local_steps=0
        )


@pytest.mark.parametrize(("q_loss", "local_steps"), [(None, 1), (0.1, 2)])
def test_both_mechanisms_match_opacus_stepped_by_hand(q_loss, local_steps):
    from opacus.accountants import RDPAccountant

    rounds = 8  # opacus recomputes every (unmerged) interleaved entry: keep it small
    by_hand = RDPAccountant()
    for _ in range(rounds):  # the real interleaving: τ gradient steps, then the loss release
        for _ in range(local_steps):
            by_hand.step(noise_multiplier=SIGMA, sample_rate=Q)
        by_hand.step(noise_multiplier=SIGMA_L, sample_rate=Q if q_loss is None else q_loss)
    history = fedfdp_history(
        rounds,
        sampling_rate=Q,
        noise_multiplier=SIGMA,
        loss_noise_multiplier=SIGMA_L,
        loss_sampling_rate=q_loss,
        local_steps=local_steps,
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # opacus warns about the optimal order at the edge
        expected = by_hand.get_epsilon(DELTA)
    assert compute_epsilon(history, DELTA, "rdp") == pytest.approx(expected, rel=1e-9)
    assert expected > compute_epsilon([(SIGMA, Q, rounds * local_steps)], DELTA, "rdp")


def _eq26_epsilon(entries, delta):
    """Independent: log A_α of Eq. 26 at integer α, summed, Balle et al. Prop. 12."""
    alphas = np.array(PAPER_ORDERS, dtype=float)
    total = np.zeros_like(alphas)
    for sigma, q, steps in entries:
        for i, a in enumerate(PAPER_ORDERS):
            k = np.arange(a + 1)
            log_terms = (
                gammaln(a + 1)
                - gammaln(k + 1)
                - gammaln(a - k + 1)
                + (a - k) * np.log1p(-q)
                + k * np.log(q)
                + (k * k - k) / (2 * sigma**2)
            )
            total[i] += steps * logsumexp(log_terms) / (a - 1)
    eps = total + np.log((alphas - 1) / alphas) - (np.log(delta) + np.log(alphas)) / (alphas - 1)
    return float(eps.min())


def test_paper_accountant_matches_eq26_computed_independently():
    history = fedfdp_history(683, sampling_rate=Q, noise_multiplier=2, loss_noise_multiplier=5)

    assert paper_epsilon(history, DELTA) == pytest.approx(_eq26_epsilon(history, DELTA), rel=1e-9)


def test_rounds_with_both_mechanisms_never_overshoot_the_budget():
    from opacus.accountants import RDPAccountant

    t = max_rounds(3.52, DELTA, sampling_rate=Q, noise_multiplier=2, loss_noise_multiplier=5)

    def eps(rounds):
        acc = RDPAccountant()
        acc.history = [(2.0, Q, rounds), (5.0, Q, rounds)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return acc.get_epsilon(DELTA)

    assert eps(t) <= 3.52 < eps(t + 1)


def test_paper_round_counts_reproduce_the_spec():
    # §6.3 [CHECK]: the paper's numbers are the gradient mechanism alone, code-style search.
    def compat(eps, sigma, **kw):
        return max_rounds_paper(eps, DELTA, sampling_rate=Q, noise_multiplier=sigma, **kw)

    assert compat(3.52, 2.0) == 778
    assert [compat(2.0, s) for s in (1, 1.5, 2, 2.5, 3)] == [6, 115, 268, 463, 708]
    assert [compat(e, s) for e, s in ((1, 2), (2, 2), (3, 2), (4, 1.65))] == [65, 268, 582, 607]
    assert compat(3.52, 2.0, mode="strict") == 776
    assert [compat(2.0, s, mode="strict") for s in (1, 1.5, 2, 2.5, 3)] == [6, 114, 267, 463, 702]
    assert compat(3.52, 2.0, local_steps=2) == 389


def test_correct_round_counts_reproduce_the_spec():
    def full(eps, sigma):
        return max_rounds(
            eps,
            DELTA,
            sampling_rate=Q,
            noise_multiplier=sigma,
            loss_noise_multiplier=5.0,
            accountant="paper",
        )

    assert full(3.52, 2.0) == 683
    assert [full(e, s) for e, s in ((1, 2), (2, 2), (3, 2), (4, 1.65))] == [58, 237, 512, 559]
    # The paper's T = 778 really spends ε ≈ 3.76 once the loss upload is charged.
    at_778 = fedfdp_history(778, sampling_rate=Q, noise_multiplier=2, loss_noise_multiplier=5)
    assert paper_epsilon(at_778, DELTA) == pytest.approx(3.76, abs=0.01)


def test_a_shared_loss_batch_costs_more_than_the_additive_bound():
    # §6.4 [CHECK]: at T = 683 the additive bound gives 3.52, the joint SGM 3.62.
    shared = fedfdp_history(
        683, sampling_rate=Q, noise_multiplier=2, loss_noise_multiplier=5, loss_batch="shared"
    )
    assert paper_epsilon(shared, DELTA) == pytest.approx(3.62, abs=0.005)
    assert (
        max_rounds(
            3.52,
            DELTA,
            sampling_rate=Q,
            noise_multiplier=2,
            loss_noise_multiplier=5,
            loss_batch="shared",
            accountant="paper",
        )
        < 683
    )


def test_accounting_rejects_bad_inputs():
    with pytest.raises(ValueError, match="accountant"):
        max_rounds(
            1.0,
            DELTA,
            sampling_rate=Q,
            noise_multiplier=2,
            loss_noise_multiplier=5,
            accountant="moments",
        )
    with pytest.raises(ValueError, match="mode"):
        max_rounds_paper(1.0, DELTA, sampling_rate=Q, noise_multiplier=2, mode="exact")
    with pytest.raises(ValueError, match="target_epsilon"):
        max_rounds_paper(0.0, DELTA, sampling_rate=Q, noise_multiplier=2)
    with pytest.raises(ValueError, match="delta"):
        paper_epsilon([(2.0, Q, 10)], 0.0)
    assert paper_epsilon([(0.0, Q, 1)], DELTA) == math.inf
    assert paper_epsilon([], DELTA) == 0.0


# --------------------------------------------------------------------------------------- #
# Convergence bound and λ* (§7)
# --------------------------------------------------------------------------------------- #
SPEC_75 = dict(L=10, mu=1, G=1, Gamma=0.5, Q1=2, dist0_sq=100, sigma=2, C=0.1, d=582026, B_hat=34)


def test_coefficients_of_the_spec_example():
    a = bound_coefficients(BoundConstants(Q0=-1, **SPEC_75))
    noise = 2 * 4 * 0.01 * 582026 / 34**2

    assert a == pytest.approx((8, 24, 18 + 20 - 200, 4 + 10 + noise + 100, -2))
    assert a.numerator_derivative(0.0) == pytest.approx(38 + 2 * (4 + 10 + noise))


def _eq29(lam, c, rounds):
    """Eq. 29 with C_t = 1 + Q1λ in A and 2C_t − 1 ≥ 1 + 2Q0λ, written out directly."""
    ct = 1 + c.Q1 * lam
    a = c.G**2 * ct**3 + 3 * c.G**2 * ct**2 + 2 * c.L * c.Gamma * ct
    a += 2 * c.sigma**2 * c.C**2 * c.d / c.B_hat**2
    return c.L / (2 * rounds) * (a / (c.mu**2 * (1 + 2 * c.Q0 * lam)) + c.dist0_sq)


@pytest.mark.parametrize("mu", [1.0, 0.3])
def test_exact_bound_is_eq29_and_the_paper_form_drops_mu_squared(mu):
    c = BoundConstants(Q0=0.7, **{**SPEC_75, "mu": mu})
    for lam in (0.0, 0.1, 0.65, 3.0):
        exact = convergence_bound(lam, c, 500, drop_mu_sq=False)
        paper = convergence_bound(lam, c, 500)

        assert exact == pytest.approx(_eq29(lam, c, 500), rel=1e-12)
        if mu == 1.0:
            assert paper == pytest.approx(exact, rel=1e-12)
        else:
            assert paper != pytest.approx(exact, rel=1e-3)
    assert convergence_bound(0.6, BoundConstants(Q0=-1, **SPEC_75), 500) == math.inf  # pole 0.5


def test_spec_75_example_is_degenerate_and_the_minimiser_is_zero():
    c = BoundConstants(Q0=-1, **SPEC_75)
    coeffs = bound_coefficients(c)
    grid = np.linspace(1e-9, 0.5 - 1e-9, 1001)

    assert all(coeffs.numerator_derivative(x) > 0 for x in grid)  # 𝒢 > 0 on (0, 0.5)
    with pytest.warns(DegenerateBoundWarning, match="pole"):
        result = lambda_star_numeric(c)
    assert result.lam == 0.0
    assert result.at_boundary
    assert result.objective == pytest.approx(coeffs.a4)
    with pytest.warns(DegenerateBoundWarning, match=r"𝒢\(0\)"):
        paper_lambda = lambda_star_cardano(c)
    assert paper_lambda > 0.5  # the paper's rule returns a root past the pole


@pytest.mark.parametrize("q0", [0.0, 0.01])
def test_degenerate_without_a_pole_still_warns_and_gives_zero(q0):
    c = BoundConstants(Q0=q0, **SPEC_75)  # Q0 ≥ 0 but 𝒢(0) ≥ 0

    with pytest.warns(DegenerateBoundWarning):
        assert lambda_star_numeric(c).lam == 0.0
    if q0 == 0.0:
        with pytest.raises(ValueError, match="Cardano"):
            lambda_star_cardano(c)


def _non_degenerate_constants(seed):
    rng = np.random.default_rng(seed)
    q1 = rng.uniform(0.5, 3)
    return BoundConstants(
        L=rng.uniform(1, 20),
        mu=rng.uniform(0.1, 2),
        G=rng.uniform(0.1, 3),
        Gamma=rng.uniform(0, 2),
        Q0=q1 * rng.uniform(0.5, 1),
        Q1=q1,
        dist0_sq=rng.uniform(1, 200),
        sigma=rng.uniform(0.5, 3),
        C=rng.uniform(0.05, 1),
        d=int(rng.integers(1_000, 1_000_000)),
        B_hat=rng.uniform(10, 100),
    )


@pytest.mark.parametrize("drop_mu_sq", [True, False])
def test_cardano_and_numeric_minimiser_agree_when_not_degenerate(drop_mu_sq):
    checked = 0
    for seed in range(30):
        c = _non_degenerate_constants(seed)
        coeffs = bound_coefficients(c, drop_mu_sq=drop_mu_sq)
        if coeffs.a3 - coeffs.a4 * coeffs.a5 >= 0:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error", DegenerateBoundWarning)
            closed = lambda_star_cardano(c, drop_mu_sq=drop_mu_sq)
            numeric = lambda_star_numeric(c, drop_mu_sq=drop_mu_sq)
        positive = [r.real for r in np.roots(_g_poly(coeffs)) if abs(r.imag) < 1e-9 and r > 0]

        assert closed == pytest.approx(numeric.lam, rel=1e-5)
        assert [closed] == pytest.approx(positive, rel=1e-9)
        assert not numeric.at_boundary
        checked += 1
    assert checked >= 10


def test_mu_and_the_initial_distance_change_the_bound_but_not_its_minimiser():
    # The k = (μ²)·E‖w_1 − w*‖² terms add k(1 + 2Q0λ)/(1 + 2Q0λ) = k: a constant in λ, so
    # a3 − a4a5 (hence 𝒢 and λ*) does not contain k. The spec's §7.3 says otherwise.
    c = BoundConstants(Q0=1.5, **{**SPEC_75, "mu": 0.2})
    far = BoundConstants(Q0=1.5, **{**SPEC_75, "mu": 0.2, "dist0_sq": 1e4})
    paper, exact = bound_coefficients(c), bound_coefficients(c, drop_mu_sq=False)

    assert paper.a3 != exact.a3
    assert paper.a3 - paper.a4 * paper.a5 == pytest.approx(exact.a3 - exact.a4 * exact.a5)
    assert convergence_bound(0.5, c, 10) != pytest.approx(convergence_bound(0.5, far, 10))
    lams = [
        lambda_star_cardano(c),
        lambda_star_cardano(c, drop_mu_sq=False),
        lambda_star_cardano(far),
        lambda_star_numeric(far, drop_mu_sq=False).lam,
    ]
    assert lams == pytest.approx([lams[0]] * 4, rel=1e-6)


def _g_poly(c):
    a1, a2, a3, a4, a5 = c
    return [2 * a1 * a5, 3 * a1 + a2 * a5, 2 * a2, a3 - a4 * a5]


@pytest.mark.parametrize(
    "coeffs",
    [
        BoundCoefficients(0.1, 4.3, -32.0, 36.0, 3.7),  # three real roots
        BoundCoefficients(8.0, 24.0, -162.0, 154.3, -2.0),  # one real root
        BoundCoefficients(8.0, 24.0, 238.0, 154.3, 2.0),
        BoundCoefficients(2.0, 6.0, 1.0, 1.0, 1.0),  # 3a1 = a2a5: a6 = 0
    ],
)
def test_cardano_roots_are_the_roots_of_g(coeffs):
    ours = cardano_roots(coeffs)
    reference = list(np.roots(_g_poly(coeffs)))

    for z in ours:  # a bijection: match each root to the nearest reference root, remove it
        nearest = min(reference, key=lambda r: abs(r - z))
        assert abs(nearest - z) < 1e-7 * max(1.0, abs(z))
        reference.remove(nearest)
    for z in ours:
        assert abs(coeffs.numerator_derivative(z)) < 1e-7 * max(1.0, abs(coeffs.a3))


def test_numeric_minimiser_respects_a_cap():
    c = _non_degenerate_constants(1)
    free = lambda_star_numeric(c)
    capped = lambda_star_numeric(c, lambda_max=free.lam / 2)

    assert capped.at_boundary
    assert capped.lam == pytest.approx(free.lam / 2, rel=1e-6)


@pytest.mark.parametrize(
    ("change", "match"),
    [({"Q0": 3.0}, "Q0"), ({"mu": 0.0}, "mu"), ({"Q1": 0.0}, "Q1"), ({"d": 1.5}, "d")],
)
def test_bound_constants_are_validated(change, match):
    with pytest.raises(ValueError, match=match):
        BoundConstants(**{**SPEC_75, "Q0": -1, **change})
