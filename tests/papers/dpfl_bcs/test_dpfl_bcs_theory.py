"""DPFL-BCS maths pinned to shared/specs/dpfl-bcs.md (§4.4, §8, §9, §16) and to direct formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm
from threadpoolctl import threadpool_limits  # via scikit-learn, a project dependency

from raydpfl.papers.dpfl_bcs.bound import convergence_bound, p1_coefficients, p1_ratio
from raydpfl.papers.dpfl_bcs.calibration import (
    expected_noise_sq_norm,
    gaussian_noise_std,
    gaussian_sigma_analytic,
    gaussian_sigma_classic,
    gradient_sensitivity,
    laplace_noise_scale,
    loss_report_noise_scale,
    noise_constants,
    per_participation_budget,
    stage1_sensitivity,
    zcdp_epsilon,
    zcdp_rho,
)
from raydpfl.papers.dpfl_bcs.estimation import (
    P2_START,
    TABLE_III,
    bound_predicted_loss,
    estimate_noniid_degree,
    estimate_rho_min,
    solve_p2,
    stage1_global_loss,
)
from raydpfl.papers.dpfl_bcs.planning import (
    p1_objective,
    proposition1_plan,
    round_plan,
    selection_probabilities,
    solve_p1,
    solve_p1_slsqp,
)
from raydpfl.papers.dpfl_bcs.sampling import inclusion_probabilities, sample_clients


def _clients(seed: int, n: int, z: float) -> tuple[np.ndarray, np.ndarray]:
    # The spec's §16 instance family: D ∈ [200, 1200], ε ∈ [0.1, 3], δ ∈ [1e-5, 1e-4], Γ ∈ [0, .5].
    rng = np.random.default_rng(seed)
    sizes = rng.integers(200, 1200, n)
    eps = rng.uniform(0.1, 3.0, n)
    delta = rng.uniform(1e-5, 1e-4, n)
    phi = np.log(1 / delta) / (sizes**2 * eps**2) if z == 1 else 1 / (sizes**2 * eps**2)
    return phi, rng.uniform(0.0, 0.5, n)


# ------------------------------------------------------------------------------------------
# §4: calibration


@pytest.mark.parametrize(
    ("eps", "delta", "t_n", "zcdp", "c2_equiv", "alg2", "eps_l"),
    [
        (0.1, 1e-5, 40, 304.1, 1.417, 2221.7, 0.0025),
        (1.0, 5e-5, 40, 28.84, 1.449, 210.3, 0.025),
        (3.0, 1e-4, 116, 16.57, 1.521, 206.0, 0.026),
        (10.0, 1e-5, 40, 3.59, 1.674, 22.2, 0.25),
    ],
)
def test_gaussian_multipliers_match_the_spec_table(eps, delta, t_n, zcdp, c2_equiv, alg2, eps_l):
    # §4.4 [CHECK] table: σ/Δ per mode, and the c2 that makes thm2_c2 equal zcdp.
    sigma_zcdp = gaussian_noise_std(1.0, eps, delta, t_n, calibration="zcdp")
    c2 = sigma_zcdp * eps / math.sqrt(t_n * math.log(1 / delta))

    assert sigma_zcdp == pytest.approx(zcdp, abs=0.006 * zcdp / 10)
    assert c2 == pytest.approx(c2_equiv, abs=5e-4)
    assert gaussian_noise_std(1.0, eps, delta, t_n, calibration="thm2_c2", c2=c2) == pytest.approx(
        sigma_zcdp, rel=1e-12
    )
    assert gaussian_noise_std(1.0, eps, delta, t_n, calibration="paper_alg2") == pytest.approx(
        alg2, abs=0.05
    )
    assert per_participation_budget(eps, delta, t_n)[0] == pytest.approx(eps_l, abs=5e-4)


def test_calibration_matches_direct_formulas():
    lr, clip, size, eps, delta, t_n = 0.05, 20.0, 600, 1.3, 3e-5, 25
    sens = 2 * lr * clip / size  # Lemmas 1–2, written out
    eps_l, delta_l = eps / t_n, delta / t_n

    assert gradient_sensitivity(lr, clip, size) == pytest.approx(sens, rel=1e-15)
    assert gradient_sensitivity(0.05, 20, 600) == pytest.approx(3.3e-3, abs=5e-5)  # §4.4 scale
    assert laplace_noise_scale(sens, eps, t_n) == pytest.approx(sens / eps_l, rel=1e-14)
    assert gaussian_noise_std(sens, eps, delta, t_n, calibration="paper_alg2") == pytest.approx(
        math.sqrt(2 * math.log(1.25 / delta_l)) * sens / eps_l, rel=1e-14
    )
    assert gaussian_noise_std(sens, eps, delta, t_n, calibration="thm2_c2") == pytest.approx(
        math.sqrt(2) * sens * math.sqrt(t_n * math.log(1 / delta)) / eps, rel=1e-14
    )
    # zcdp: T_n releases at σ compose to T_n·Δ²/(2σ²)-zCDP, which converts back to exactly ε.
    sigma = gaussian_noise_std(sens, eps, delta, t_n, calibration="zcdp")
    rho_spent = t_n * sens**2 / (2 * sigma**2)
    assert rho_spent + 2 * math.sqrt(rho_spent * math.log(1 / delta)) == pytest.approx(eps)
    assert zcdp_epsilon(zcdp_rho(eps, delta), delta) == pytest.approx(eps, rel=1e-13)


def test_stage1_sensitivity_and_loss_noise():
    # Eq. (13): Δg′ = (2ηΞ + 2ηΘ)/D; the reported loss carries the coordinate noise over η.
    lr, clip, theta, size = 0.05, 20.0, math.log(10), 576

    sens = stage1_sensitivity(lr, clip, theta, size)

    assert sens == pytest.approx((2 * lr * clip + 2 * lr * theta) / size, rel=1e-15)
    assert sens > gradient_sensitivity(lr, clip, size)
    sigma = gaussian_noise_std(sens, 1.0, 1e-5, 40)
    assert loss_report_noise_scale(sigma, lr) == pytest.approx(sigma / lr, rel=1e-15)


def test_analytic_gaussian_certifies_delta_and_replaces_theorem_1_from_eps_1():
    for eps, delta in [(0.5, 1e-5), (1.0, 1e-5), (4.0, 1e-7)]:
        s = gaussian_sigma_analytic(1.0, eps, delta)
        # Balle & Wang (2018) Thm 8, evaluated independently with scipy.stats.
        got = norm.cdf(0.5 / s - eps * s) - math.exp(eps) * norm.cdf(-0.5 / s - eps * s)
        assert got <= delta
        assert got == pytest.approx(delta, rel=1e-9)
    assert gaussian_sigma_analytic(1.0, 1.0, 1e-5) == pytest.approx(3.7306, abs=1e-4)
    assert gaussian_sigma_analytic(1.0, 0.5, 1e-5) < gaussian_sigma_classic(1.0, 0.5, 1e-5)
    # paper_alg2 with ε^l = 80/40 = 2 ≥ 1 must switch to the analytic mechanism (§13.24).
    assert gaussian_noise_std(2.0, 80.0, 4e-4, 40, calibration="paper_alg2") == pytest.approx(
        gaussian_sigma_analytic(2.0, 2.0, 1e-5), rel=1e-12
    )


def test_noise_energy_matches_the_unified_form_of_lemmas_1_and_2():
    lr, clip, d, size, eps, delta = 0.1, 5.0, 1000, 300, 2.0, 5e-5
    sens = gradient_sensitivity(lr, clip, size)
    for t_n in (7, 40):
        b = laplace_noise_scale(sens, eps, t_n)
        lam, z, phi = noise_constants("laplace", clip, d, size, epsilon=eps)
        assert d * 2 * b**2 == pytest.approx(
            expected_noise_sq_norm(lam, z, phi[0], lr, t_n), rel=1e-12
        )
        for mode in ("zcdp", "thm2_c2"):
            sigma = gaussian_noise_std(sens, eps, delta, t_n, calibration=mode)
            lam, z, phi = noise_constants(
                "gaussian", clip, d, size, epsilon=eps, delta=delta, calibration=mode
            )
            assert d * sigma**2 == pytest.approx(
                expected_noise_sq_norm(lam, z, phi[0], lr, t_n), rel=1e-12
            )
    # paper_alg2's σ grows ∝ T_n (≈ z = 2), not √T_n as its z = 1 model says (§4.4).
    s40, s80 = (gaussian_noise_std(1.0, eps, delta, t, calibration="paper_alg2") for t in (40, 80))
    assert s80 / s40 > 2.0


def test_noise_constants_zcdp_accepts_a_remaining_rho():
    by_budget = noise_constants("gaussian", 2.0, 10, [100, 200], epsilon=1.0, delta=1e-5)
    by_rho = noise_constants("gaussian", 2.0, 10, [100, 200], rho=zcdp_rho(1.0, 1e-5))

    assert by_budget.noise_lambda == by_rho.noise_lambda == 4 * 2.0**2 * 10
    np.testing.assert_allclose(by_budget.phi, by_rho.phi, rtol=1e-14)
    np.testing.assert_allclose(by_rho.phi, 1 / (2 * np.array([100, 200]) ** 2 * zcdp_rho(1, 1e-5)))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: gaussian_noise_std(1.0, 0.0, 1e-5, 10), "epsilon"),
        (lambda: gaussian_noise_std(1.0, -1.0, 1e-5, 10), "epsilon"),
        (lambda: gaussian_noise_std(1.0, 1.0, 0.0, 10), "delta"),
        (lambda: gaussian_noise_std(1.0, 1.0, 1.0, 10), "delta"),
        (lambda: gaussian_noise_std(1.0, 1.0, 1e-5, 0), "participations"),
        (lambda: gaussian_noise_std(1.0, 1.0, 1e-5, 2.5), "participations"),
        (lambda: gaussian_noise_std(1.0, 1.0, 1e-5, 10, calibration="rdp"), "calibration"),
        (lambda: gaussian_noise_std(0.0, 1.0, 1e-5, 10), "sensitivity"),
        (lambda: gaussian_sigma_classic(1.0, 1.0, 1e-5), "epsilon < 1"),
        (lambda: laplace_noise_scale(1.0, math.inf, 3), "epsilon"),
        (lambda: gradient_sensitivity(0.1, 1.0, 0), "dataset_size"),
        (lambda: stage1_sensitivity(0.1, 1.0, -1.0, 10), "loss_bound"),
        (lambda: per_participation_budget(1.0, 1.5, 3), "delta"),
        (lambda: noise_constants("exponential", 1.0, 3, 10, epsilon=1.0), "mechanism"),
        (lambda: noise_constants("gaussian", 1.0, 3, 10, epsilon=1.0), "delta"),
        (lambda: noise_constants("laplace", 1.0, 3, 10, epsilon=[1.0, 0.0]), "epsilon"),
    ],
)
def test_bad_calibration_inputs_are_rejected(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------------
# §8: P1


def test_proposition_1_is_the_papers_closed_form():
    sizes = np.array([100, 400, 900, 250])
    eps = np.array([0.5, 1.0, 3.0, 2.0])
    delta = np.array([1e-5, 5e-5, 1e-4, 2e-5])
    gm = noise_constants("gaussian", 1, 1, sizes, epsilon=eps, delta=delta, calibration="thm2_c2")
    lm = noise_constants("laplace", 1, 1, sizes, epsilon=eps)

    gm_plan = proposition1_plan(gm.phi, gm.z, 80)
    lm_plan = proposition1_plan(lm.phi, lm.z, 80)

    # T_n = KT / Σ_n′ (Φ_n/Φ_n′)^{1/z}, and the GM/LM proportionalities of §8.3.
    literal = [80 / np.sum((p / gm.phi) ** 1.0) for p in gm.phi]
    np.testing.assert_allclose(gm_plan, literal, rtol=1e-13)
    w = sizes**2 * eps**2 / np.log(1 / delta)
    np.testing.assert_allclose(gm_plan, 80 * w / w.sum(), rtol=1e-13)
    np.testing.assert_allclose(lm_plan, 80 * sizes * eps / np.sum(sizes * eps), rtol=1e-13)


@pytest.mark.parametrize("z", [1.0, 2.0])
def test_water_filling_reduces_to_proposition_1_with_iid_data_and_no_cap(z):
    phi, _ = _clients(7, 100, z)

    plan = solve_p1(phi, np.zeros_like(phi), 123.0, 4000, math.inf, z)

    np.testing.assert_allclose(plan, proposition1_plan(phi, z, 4000), rtol=1e-9)


@pytest.mark.parametrize("z", [1.0, 2.0])
def test_water_filling_satisfies_the_kkt_conditions(z):
    phi, gam = _clients(11, 100, z)
    upper, total = 60.0, 2000.0
    ratio = 10 * np.median(phi) * 20.0**z / np.median(gam)  # zeros, caps and interior

    plan = solve_p1(phi, gam, ratio, total, upper, z)

    grad = (z + 1) * phi * plan**z + ratio * gam  # ∂(𝒥/Ω_A)/∂T_n
    zero, cap = plan <= 0, plan >= upper
    interior = ~zero & ~cap
    assert zero.any() and cap.any() and interior.sum() > 10  # every KKT case is exercised
    theta = np.median(grad[interior])
    assert plan.sum() == pytest.approx(total, rel=1e-12)
    np.testing.assert_allclose(grad[interior], theta, rtol=1e-9)  # stationarity
    assert np.all(grad[zero] >= theta * (1 - 1e-9))  # T_n = 0: the price is not worth it
    assert np.all(grad[cap] <= theta * (1 + 1e-9))  # T_n = U: would take more if allowed


@pytest.mark.parametrize(("z", "upper", "seed"), [(1, 15, 4), (1, math.inf, 6), (2, 15, 3)])
def test_water_filling_matches_slsqp(z, upper, seed):
    phi, gam = _clients(seed, 20, z)
    ratio = np.median(phi) * 10.0**z / np.median(gam)
    total = 200.0

    exact = solve_p1(phi, gam, ratio, total, upper, z)
    # SLSQP makes ~100 calls into multithreaded BLAS on tiny matrices; on a loaded 2-core
    # machine the thread hand-offs cost seconds, one thread costs milliseconds.
    with threadpool_limits(limits=1):
        oracle = solve_p1_slsqp(phi, gam, ratio, total, upper, z)

    j_exact = p1_objective(exact, phi, gam, ratio, z)
    j_oracle = p1_objective(oracle, phi, gam, ratio, z)
    assert j_exact <= j_oracle * (1 + 1e-12)  # water-filling is the exact optimum
    assert j_oracle == pytest.approx(j_exact, rel=1e-8)
    np.testing.assert_allclose(oracle, exact, atol=1e-2)
    assert exact.max() <= upper


def test_proposition_1_breaks_the_per_round_cap_in_the_papers_gm_setting():
    # §8.7 [CHECK]: N = 100, K·T = 4000, Dirichlet(0.5) over 10 classes of 6000, ε ~ U[0.1, 3],
    # δ ~ U[1e-5, 1e-4]: under GM some client wants more than T = 200 rounds and some fewer
    # than 1; under LM none exceeds T. The capped solve and the rounding repair both.
    rng = np.random.default_rng(1)
    sizes = np.maximum(np.rint(6000 * rng.dirichlet(np.full(100, 0.5), size=10)).sum(0), 10)
    eps, delta = rng.uniform(0.1, 3, 100), rng.uniform(1e-5, 1e-4, 100)
    gm = noise_constants("gaussian", 1, 1, sizes, epsilon=eps, delta=delta, calibration="thm2_c2")
    lm = noise_constants("laplace", 1, 1, sizes, epsilon=eps)

    gm_plan = proposition1_plan(gm.phi, 1, 4000)

    assert (gm_plan > 200).sum() >= 1 and (gm_plan < 1).sum() >= 1
    assert proposition1_plan(lm.phi, 2, 4000).max() <= 200
    capped = solve_p1(gm.phi, np.zeros(100), 0.0, 4000, 200, 1)
    assert capped.max() == pytest.approx(200) and capped.sum() == pytest.approx(4000)
    plan = round_plan(capped, 4000, 200)
    assert plan.sum() == 4000 and plan.max() <= 200


def test_p1_coefficients_are_the_bounds_plan_dependent_part():
    consts = dict(smoothness=5.5, strong_convexity=5.0, lr_offset=2.0, noise_lambda=3e4)
    k, horizon, z = 5, 30, 1.0
    phi, gam = _clients(4, 12, z)
    omega_a, omega_b = p1_coefficients(**consts, clients_per_round=k, horizon=horizon)
    ratio = p1_ratio(**consts, clients_per_round=k, horizon=horizon)
    bound_args = dict(
        init_distance_sq=3.0,
        lr_offset=2.0,
        grad_var=0.7,
        smoothness=5.5,
        strong_convexity=5.0,
        rho_min=0.95,
        noise_lambda=3e4,
        z=z,
        clients_per_round=k,
    )
    a = np.full(12, k * horizon / 12)
    b = solve_p1(phi, gam, ratio, k * horizon, horizon, z)

    diff = convergence_bound(a, phi, gam, **bound_args, horizon=horizon) - convergence_bound(
        b, phi, gam, **bound_args, horizon=horizon
    )

    assert ratio == pytest.approx(omega_b / omega_a, rel=1e-13)
    assert ratio == pytest.approx(k * (5.5 + 3 * 5.0 * (2.0 + horizon) / 8) / 3e4, rel=1e-13)
    assert diff == pytest.approx(
        omega_a * (p1_objective(a, phi, gam, ratio, z) - p1_objective(b, phi, gam, ratio, z)),
        rel=1e-9,
    )
    assert diff > 0  # the P1 plan beats the uniform plan on Theorem 5's bound


def test_p1_rejects_an_infeasible_box():
    with pytest.raises(ValueError, match="infeasible"):
        solve_p1(np.ones(3), np.zeros(3), 0.0, 10, upper=3)
    with pytest.raises(ValueError, match="phi"):
        solve_p1(np.array([1.0, 0.0]), np.zeros(2), 0.0, 1)


# ------------------------------------------------------------------------------------------
# §8.5: integer plans and p_n


def test_largest_remainder_rounding_by_hand():
    assert round_plan([0.4, 2.7, 3.9, 1.0], 8).tolist() == [0, 3, 4, 1]
    assert round_plan([1.5, 1.5, 1.0], 4).tolist() == [2, 1, 1]  # tie: lower index first
    assert round_plan([3.0, 2.5, 2.5], 8, upper=3).tolist() == [3, 3, 2]  # the cap is kept


@pytest.mark.parametrize("z", [1.0, 2.0])
def test_rounding_keeps_the_sum_and_the_bounds(z):
    phi, gam = _clients(5, 100, z)
    real = solve_p1(phi, gam, np.median(phi) * 40.0**z / np.median(gam), 4000, 200, z)

    plan = round_plan(real, 4000, 200)

    assert plan.dtype.kind == "i" and plan.sum() == 4000
    assert plan.min() >= 0 and plan.max() <= 200
    assert np.all(np.abs(plan - real) < 1)


def test_rounding_rejects_a_plan_off_its_constraints():
    with pytest.raises(ValueError, match="sums to"):
        round_plan([1.0, 2.0], 4)
    with pytest.raises(ValueError, match=r"lie in"):
        round_plan([5.0, 1.0], 6, upper=4)


def test_selection_probabilities():
    # §11.6: the uniform plan T_n = 40 of N = 100, K = 20, T = 200 has inclusion probability 0.2.
    p = selection_probabilities(np.full(100, 40), 20, 200)

    np.testing.assert_allclose(p, 0.01)
    assert 20 * p[0] == pytest.approx(0.2)
    p = selection_probabilities([10, 0, 5, 5], 2, 10)
    np.testing.assert_allclose(p, [0.5, 0.0, 0.25, 0.25])
    with pytest.raises(ValueError, match="K·T_s"):
        selection_probabilities([10, 0, 5, 4], 2, 10)


# ------------------------------------------------------------------------------------------
# §9: estimators and P2

NAN = np.nan


def test_noniid_degree_is_the_min_loss_drop_and_the_mean_for_unseen_clients():
    before = np.array([[2.0, NAN, 1.0, NAN], [NAN, 3.0, 0.7, NAN], [1.5, 2.0, NAN, NAN]])
    after = np.array([[1.4, NAN, 1.2, NAN], [NAN, 2.5, 0.6, NAN], [1.2, 2.3, NAN, NAN]])

    gamma = estimate_noniid_degree(before, after)

    # Client 0: min(0.6, 0.3); 1: min(0.5, 0.3); 2: min(|−0.2|, 0.1); 3: mean of the three.
    np.testing.assert_allclose(gamma, [0.3, 0.3, 0.1, (0.3 + 0.3 + 0.1) / 3])
    with pytest.raises(ValueError, match="same rounds"):
        estimate_noniid_degree(before, np.nan_to_num(after))


def test_rho_min_follows_eq_9():
    counts = np.array([3, 0, 2, 1])  # K = 2, T0 = 4: Σ C_n = K·(T0−1) = 6
    ref = np.array([2.0, NAN, 1.0, NAN])  # only clients 0 and 2 were in S_{T0}

    rho = estimate_rho_min(counts, ref, clients_per_round=2, stage1_rounds=4)

    mean = stage1_global_loss(ref)
    assert mean == pytest.approx(1.5)
    assert rho == pytest.approx((3 * 2.0 + 2 * 1.0 + 1 * 1.5) / (2 * 3 * 1.5))
    with pytest.raises(ValueError, match="> 0"):
        estimate_rho_min(counts, np.array([-2.0, NAN, 1.0, NAN]), 2, 4)
    with pytest.raises(ValueError, match="stage1_rounds"):
        estimate_rho_min(counts, ref, 2, 1)


def _p2_instance() -> dict:
    rng = np.random.default_rng(3)
    n, k, t0 = 20, 4, 6
    sizes, eps, delta = (
        rng.integers(200, 800, n),
        rng.uniform(0.5, 3, n),
        rng.uniform(1e-5, 1e-4, n),
    )
    lam, z, phi = noise_constants("gaussian", 1.0, 50, sizes, epsilon=eps, delta=delta)
    counts = np.zeros(n)
    for _ in range(t0 - 1):
        counts[rng.choice(n, k, replace=False)] += 1
    return dict(
        counts=counts,
        phi=phi,
        noniid=rng.uniform(0, 0.3, n),
        rho_min=1.02,
        noise_lambda=lam,
        z=z,
        clients_per_round=k,
        elapsed_rounds=t0 - 1,
    )


def test_bound_predicted_loss_is_eq_10_term_by_term():
    a = _p2_instance()
    x, g, s2, lip, mu = 2.0, 3.0, 0.4, 1.5, 0.8
    c, phi, gam, k, t = a["counts"], a["phi"], a["noniid"], a["clients_per_round"], 5
    lam, rho, n = a["noise_lambda"], a["rho_min"], c.size

    expected = (
        x / (g + t) * lip * g / 2
        - 3 * lip * rho / (2 * mu * n) * gam.sum()
        + 1 / (g + t) * 4 * lip * s2 / (mu**2 * k)
        + np.sum(c**2 * phi) / ((g + t) * t) * 4 * lip * lam / (k**2 * mu**2)
        + np.sum(c * gam) / t * (4 * lip**2 / ((g + t) * k * mu**2) + 3 * lip / (2 * k * mu))
    )

    got = bound_predicted_loss(
        **a, init_distance_sq=x, lr_offset=g, grad_var=s2, smoothness=lip, strong_convexity=mu
    )
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("scale", [5.0, 0.3])
def test_p2_fits_the_observed_loss_deterministically(scale):
    a = _p2_instance()
    start = bound_predicted_loss(**a, **P2_START)
    observed = scale * start  # above the start point: X absorbs it; below: L, μ, γ must move

    est = solve_p2(observed, **a)

    assert abs(est.residual) < 1e-10 * max(1, observed)
    assert est.smoothness > est.strong_convexity > 0
    assert min(est.init_distance_sq, est.grad_var, est.lr_offset) >= 0
    fitted = est._asdict()
    del fitted["residual"], fitted["sweeps"]
    assert bound_predicted_loss(**a, **fitted) == pytest.approx(observed, rel=1e-9)
    assert solve_p2(observed, **a) == est
    if scale > 1:  # non-identifiability (§9.5): X alone closes the gap, the rest stay put
        assert (est.smoothness, est.strong_convexity, est.lr_offset) == (1.0, 0.5, 16.0)
        assert est.init_distance_sq > 0
    else:
        assert est.init_distance_sq == 0 and est.grad_var == 0


def test_table_iii_is_pinned_and_its_gamma_is_not_theorem_5s():
    assert TABLE_III["mnist", "gaussian"] == (1.063, 1.960, 5.514, 4.986)
    assert TABLE_III["fashion_mnist", "laplace"] == (0.962, 144.688, 406.756, 200.645)
    assert TABLE_III["cifar10", "laplace"].rho_min == 1.109
    assert len(TABLE_III) == 10
    rho = [row.rho_min for row in TABLE_III.values()]
    assert min(rho) == 0.937 and max(rho) == 1.109
    mnist = TABLE_III["mnist", "gaussian"]
    # §9.5: 8·L̂/μ̂ = 8.85 for MNIST-GM, but γ̂ = 1.96; γ was a free variable.
    assert 8 * mnist.smoothness / mnist.strong_convexity == pytest.approx(8.847, abs=1e-3)
    assert all(
        r.lr_offset != pytest.approx(8 * r.smoothness / r.strong_convexity, rel=0.05)
        for r in TABLE_III.values()
    )


# ------------------------------------------------------------------------------------------
# §6.4: the sampler


P_SKEWED = np.array([5, 10, 20, 40, 0, 3, 7, 15, 0, 60, 25, 15], dtype=float) / 200


def test_inclusion_probabilities_rescale_and_cap():
    pi = inclusion_probabilities(P_SKEWED, 4)

    assert pi.sum() == pytest.approx(4)
    assert pi[9] == 1.0  # K·p = 1.2 is capped; the excess goes to the others pro rata
    live = (pi > 0) & (pi < 1)
    np.testing.assert_allclose(pi[live] / P_SKEWED[live], 3 / (1 - 60 / 200))
    assert pi[[4, 8]].tolist() == [0.0, 0.0]
    plan = np.array([40, 40, 20, 0, 100])  # T_n ≤ T_s = 100, K = 2: π = T_n/T_s exactly
    np.testing.assert_allclose(inclusion_probabilities(plan / 200, 2), plan / 100)
    few = inclusion_probabilities(P_SKEWED, 4, available=[0, 4, 5])
    np.testing.assert_allclose(few, np.isin(np.arange(12), [0, 5]).astype(float))


def test_sampler_draws_k_distinct_clients_with_the_target_inclusion_probabilities():
    rng = np.random.default_rng(2024)
    pi = inclusion_probabilities(P_SKEWED, 4)
    draws = 4000
    hits = np.zeros(12)
    for _ in range(draws):
        chosen = sample_clients(P_SKEWED, 4, rng)
        assert chosen.size == 4 and np.unique(chosen).size == 4
        hits[chosen] += 1

    assert hits[pi == 0].sum() == 0 and hits[pi == 1].tolist() == [draws]
    live = (pi > 0) & (pi < 1)
    z = (hits[live] - draws * pi[live]) / np.sqrt(draws * pi[live] * (1 - pi[live]))
    assert np.max(np.abs(z)) < 4.0
    # The same check rejects numpy's successive sampling, which distorts π (§6.4), so it
    # has the power to fail.
    naive = np.zeros(12)
    for _ in range(draws):
        naive[rng.choice(12, 4, replace=False, p=P_SKEWED)] += 1
    z_naive = (naive[live] - draws * pi[live]) / np.sqrt(draws * pi[live] * (1 - pi[live]))
    assert np.max(np.abs(z_naive)) > 4.0


def test_sampler_respects_the_candidate_set():
    rng = np.random.default_rng(0)
    mask = np.zeros(12, dtype=bool)
    mask[[1, 2, 3]] = True

    assert sample_clients(P_SKEWED, 4, rng, available=mask).tolist() == [1, 2, 3]
    assert sample_clients(P_SKEWED, 4, rng, available=[4, 8]).size == 0
    chosen = sample_clients(P_SKEWED, 2, rng, available=[0, 1, 2, 3, 5])
    assert chosen.size == 2 and set(chosen) <= {0, 1, 2, 3, 5}
