"""RC-DPFL clustering stage, two-stage accounting, theory and metrics (specs/robust-clustering)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raydpfl.papers.rc_dpfl import accounting, assignment, clustering, metrics, overlap
from raydpfl.privacy.accounting.accountants import OPACUS_DEFAULT_ALPHAS

SIZES = (3, 6, 6, 6)


def _clustered_updates(noise: float, *, p: int = 2000, seed: int = 0):
    # Round-1 updates as Eq. 3-4 model them: cluster mean + isotropic noise, with the paper's
    # 3/6/6/6 clients and the clients of different clusters interleaved.
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(len(SIZES), p))
    truth = rng.permutation(np.repeat(np.arange(len(SIZES)), SIZES))
    return means[truth] + noise * rng.normal(size=(len(truth), p)), truth


# --------------------------------------------------------------------------- #
# Features and GMM
# --------------------------------------------------------------------------- #
def test_pca_features_equal_svd_scores_up_to_sign():
    updates, _ = _clustered_updates(0.5, p=300)
    centred = updates - updates.mean(axis=0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    ref = u[:, :3] * s[:3]  # PCA scores computed the direct way (p-dimensional SVD)

    ours = clustering.update_features(updates, d_pca=3, scaler="none")

    for j in range(3):
        sign = np.sign(ours[:, j] @ ref[:, j])
        np.testing.assert_allclose(ours[:, j], sign * ref[:, j], atol=1e-8)


def test_minmax_features_span_unit_interval_and_accept_lists():
    updates, _ = _clustered_updates(0.5, p=100)

    features = clustering.update_features([u.reshape(10, 10) for u in updates])

    assert features.shape == (21, 2)
    np.testing.assert_allclose(features.min(axis=0), 0.0)
    np.testing.assert_allclose(features.max(axis=0), 1.0)


def test_gmm_recovers_well_separated_clusters_exactly():
    updates, truth = _clustered_updates(0.05)

    gmm = clustering.fit_update_gmm(clustering.update_features(updates), 4, random_state=0)
    posteriors = clustering.gmm_posteriors(updates, 4, random_state=0)

    assert metrics.hungarian_clustering_accuracy(truth, gmm.hard_labels) == 1.0
    assert metrics.is_exact_partition(truth, gmm.hard_labels)
    np.testing.assert_allclose(posteriors, gmm.posteriors)
    np.testing.assert_allclose(posteriors.sum(axis=1), 1.0)
    assert posteriors.max(axis=1).min() > 0.99
    assert gmm.max_overlap < 1e-6 and gmm.min_separation > 5
    # EM's own mixing weights find the 3/21 minority, the posteriors ignore them.
    np.testing.assert_allclose(np.sort(gmm.weights), np.sort(np.array(SIZES) / 21), atol=1e-6)


def test_posteriors_use_uniform_weights_not_the_fitted_ones():
    updates, _ = _clustered_updates(2.0, p=50, seed=3)  # overlapping: soft posteriors
    gmm = clustering.fit_update_gmm(clustering.update_features(updates), 4, random_state=0)
    x, mu, var = gmm.features, gmm.means, gmm.variances
    d = x.shape[1]
    # log N(x; μ_m, r_m² I) by hand; equal weights 1/M cancel in the normalisation.
    log_pdf = -((x[:, None, :] - mu[None]) ** 2).sum(-1) / (2 * var) - d / 2 * np.log(var)

    expected = np.exp(log_pdf - log_pdf.max(axis=1, keepdims=True))
    expected /= expected.sum(axis=1, keepdims=True)

    np.testing.assert_allclose(gmm.posteriors, expected, atol=1e-9)
    assert not np.allclose(gmm.weights, 0.25)  # EM's weights differ, so the test can fail
    assert 0.01 < gmm.posteriors.max(axis=1).min() < 0.999


def test_gmm_cannot_separate_pure_noise():
    updates, truth = _clustered_updates(50.0)  # noise std 50x the spread of the means

    labels = clustering.fit_update_gmm(
        clustering.update_features(updates), 4, random_state=0
    ).hard_labels

    assert metrics.hungarian_clustering_accuracy(truth, labels) < 1.0


def test_select_num_clusters_prefers_the_true_m():
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    truth = np.repeat(np.arange(4), SIZES)
    features = centres[truth] + 0.01 * rng.normal(size=(21, 2))

    best, scores = clustering.select_num_clusters(
        features, candidates=[2, 3, 4, 5], random_state=0
    )

    assert best == 4
    assert scores[4] == max(scores.values())


def test_separation_scores_and_overlap_by_hand():
    means = np.array([[0.0, 0.0], [3.0, 4.0]])  # distance 5
    variances = np.array([1.0, 6.25])  # radii 1 and 2.5

    scores = overlap.separation_scores(means, variances)

    assert scores[0, 1] == scores[1, 0] == pytest.approx(5 / (2 * 2.5))
    assert np.isinf(scores[0, 0])
    # 2Q(1) = 0.31731...; 2Q(0) = 1; 2Q(inf) = 0
    assert overlap.overlap_from_separation(1.0) == pytest.approx(0.3173105078629141)
    assert overlap.overlap_from_separation(0.0) == 1.0
    assert overlap.overlap_from_separation(math.inf) == 0.0


def test_gmm_stage_rounds_rule():
    assert clustering.gmm_stage_rounds(0.0, 200) == 100
    assert clustering.gmm_stage_rounds(0.5, 200) == 50
    assert clustering.gmm_stage_rounds(0.999, 200) == 1  # int(0.1) = 0, clamped to 1
    assert clustering.gmm_stage_rounds(1.0, 200) == 1


# --------------------------------------------------------------------------- #
# Assignments
# --------------------------------------------------------------------------- #
def test_sample_assignments_follow_the_posteriors():
    rng = np.random.default_rng(2)
    one_hot = np.eye(3)[[2, 0, 1]]
    pi = np.tile([0.2, 0.0, 0.8], (20000, 1))

    assert assignment.sample_assignments(one_hot, rng).tolist() == [2, 0, 1]
    draws = assignment.sample_assignments(pi, rng)
    counts = np.bincount(draws, minlength=3) / len(draws)
    assert counts[1] == 0.0
    np.testing.assert_allclose(counts, [0.2, 0.0, 0.8], atol=0.015)


def test_loss_assignment_is_argmin_with_ties_to_the_lowest_index():
    losses = np.array([[0.3, 0.1, 0.2], [0.5, 0.5, 0.9], [2.0, 1.0, 0.0]])

    assert assignment.loss_assignments(losses).tolist() == [1, 0, 2]


def test_private_selection_noise_scale_rdp_and_limit():
    rng = np.random.default_rng(3)
    acc = np.array([[10.0, 90.0, 50.0], [70.0, 20.0, 69.0]])

    # 2 * (100 / (101 - 1)) / 2 = 1
    assert assignment.selection_noise_scale(101, 2.0).tolist() == [1.0]
    np.testing.assert_allclose(assignment.selection_rdp(2.0, [2.0, 8.0]), [1.0, 4.0])  # α ε² / 8
    # With a huge ε the exponential mechanism is the plain argmax.
    assert assignment.private_select_clusters(acc, 1000, 1e6, rng).tolist() == [1, 0]
    # With a tiny ε the choice is close to uniform.
    many = assignment.private_select_clusters(np.tile(acc[:1], (3000, 1)), 1000, 1e-6, rng)
    np.testing.assert_allclose(np.bincount(many, minlength=3) / 3000, 1 / 3, atol=0.04)


def test_pi_weighted_cluster_updates_by_hand():
    updates = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    pi = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    sizes = np.array([10, 20, 10])

    out = assignment.pi_weighted_cluster_updates(updates, pi, sizes)

    # cluster 0: (10·[1,0] + 10·[0,1]) / 20; cluster 1: (10·[0,1] + 10·[2,2]) / 20
    np.testing.assert_allclose(out, [[0.5, 0.5], [1.0, 1.5]])


# --------------------------------------------------------------------------- #
# Two-stage accounting
# --------------------------------------------------------------------------- #
def test_two_stage_history_structure():
    history = accounting.two_stage_history(1.5, 2285, 32, total_rounds=200, local_epochs=2)

    # round 1: K = 2 full-batch steps at q = 1; rounds 2..200: 199 · 2 · ceil(2285/32) steps
    assert history == ((1.5, 1.0, 2), (1.5, 32 / 2285, 199 * 2 * 72))


def test_two_stage_epsilon_matches_opacus_rdp_accountant_composed_by_hand():
    from opacus.accountants import RDPAccountant

    z, n, b, delta = 1.3, 1000, 50, 1e-5
    accountant = RDPAccountant()
    accountant.step(noise_multiplier=z, sample_rate=1.0)  # the full-batch round, K = 1
    for _ in range(19 * 20):  # 19 more rounds of ceil(1000 / 50) = 20 Poisson steps
        accountant.step(noise_multiplier=z, sample_rate=b / n)
    expected = accountant.get_epsilon(delta, alphas=list(OPACUS_DEFAULT_ALPHAS))

    ours = accounting.two_stage_epsilon(z, delta, n, b, total_rounds=20)

    assert ours == pytest.approx(expected, rel=1e-9)
    assert ours > accounting.two_stage_epsilon(
        z, delta, n, b, total_rounds=20, first_stage_rounds=0
    )


def test_two_stage_epsilon_matches_dp_accounting_composed_by_hand():
    import dp_accounting

    z, n, b, delta = 0.9, 600, 30, 1e-5
    event = dp_accounting.ComposedDpEvent(
        [
            dp_accounting.PoissonSampledDpEvent(1.0, dp_accounting.GaussianDpEvent(z)),
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(b / n, dp_accounting.GaussianDpEvent(z)),
                9 * 20,
            ),
        ]
    )
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(event)

    ours = accounting.two_stage_epsilon(z, delta, n, b, total_rounds=10, accountant="dp_rdp")

    assert ours == pytest.approx(accountant.get_epsilon(delta), rel=1e-9)


@pytest.mark.parametrize(
    ("epsilon", "single", "two_stage"),
    [(10, 1.1076, 1.1898), (2, 3.8577, 4.4435)],  # spec §9, N = 2285, δ = 1e-4, b = 32
)
def test_paper_compat_mode_reproduces_the_spec_noise_table(epsilon, single, two_stage):
    common = {
        "total_rounds": 200,
        "mode": "paper_compat",
        "precision": 1e-5,
        "sigma_bounds": (0.5, 8.0),
    }

    z2 = accounting.two_stage_noise_multiplier(epsilon, 1e-4, 2285, 32, **common)
    z1 = accounting.two_stage_noise_multiplier(
        epsilon, 1e-4, 2285, 32, first_stage_rounds=0, **common
    )

    assert z2 == pytest.approx(two_stage, abs=1e-4)
    assert z1 == pytest.approx(single, abs=1e-4)


def test_calibrated_noise_meets_the_target_tightly():
    kwargs = {"total_rounds": 50, "precision": 1e-5, "sigma_bounds": (0.2, 5.0)}

    z = accounting.two_stage_noise_multiplier(4.0, 1e-5, 1500, 32, **kwargs)

    assert accounting.two_stage_epsilon(z, 1e-5, 1500, 32, total_rounds=50) <= 4.0
    assert accounting.two_stage_epsilon(z - 2e-5, 1e-5, 1500, 32, total_rounds=50) > 4.0
    assert z > accounting.two_stage_noise_multiplier(
        4.0, 1e-5, 1500, 32, first_stage_rounds=0, **kwargs
    )


def test_selection_cost_composes_in_rdp():
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    z, n, b, delta, eps_sel = 1.2, 800, 40, 1e-5, 0.3
    orders = list(OPACUS_DEFAULT_ALPHAS)
    rdp = compute_rdp(q=1.0, noise_multiplier=z, steps=1, orders=orders)
    rdp = rdp + compute_rdp(q=b / n, noise_multiplier=z, steps=29 * 20, orders=orders)
    rdp = rdp + 3 * np.asarray(orders) * eps_sel**2 / 8
    expected, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=delta)

    ours = accounting.two_stage_epsilon(
        z, delta, n, b, total_rounds=30, selection_rounds=3, selection_epsilon=eps_sel
    )

    assert ours == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="RDP only"):
        accounting.two_stage_epsilon(
            z, delta, n, b, accountant="pld", selection_rounds=3, selection_epsilon=eps_sel
        )


# --------------------------------------------------------------------------- #
# Theory
# --------------------------------------------------------------------------- #
def test_update_noise_variance_eq2_and_eq13():
    # K N η² p c² z² / b³ = 1·1000·0.01·100·4·1 / 1e6 = 0.004
    approx = overlap.update_noise_variance(1000, 100, 0.1, 2.0, 1.0, 100)
    # K ceil(N/b) η² p c² z² / b² with N/b = 10.5 -> 11 steps
    exact = overlap.update_noise_variance(1050, 100, 0.1, 2.0, 1.0, 100, exact_steps=True)

    assert approx == pytest.approx(0.004)
    assert exact == pytest.approx(11 * 0.01 * 100 * 4 / 100**2)


def test_overlap_lemma_4_2_and_batch_scaling_eq26():
    # √p Δ / (2σ) = 2 · 1 / (2 · 1) = 1  ->  2Q(1)
    o = overlap.pairwise_overlap(1.0, 1.0, 4)
    assert o == pytest.approx(0.3173105078629141)
    # k = 4 doubles the argument: 2Q(2) = 0.0455
    assert overlap.overlap_after_batch_scaling(o, 4.0) == pytest.approx(0.04550026389635842)
    # a z ratio of 1/2 cancels the √4
    assert overlap.overlap_after_batch_scaling(o, 4.0, noise_ratio=0.5) == pytest.approx(o)
    assert overlap.batch_scale_for_overlap(o, 0.04550026389635842) == pytest.approx(4.0)


# --------------------------------------------------------------------------- #
# Metrics
# --------------------------------------------------------------------------- #
ACC = np.array([90.0, 80.0, 70.0, 60.0])
CLUSTERS = np.array([0, 1, 1, 2])


def test_group_worst_and_disparity_by_hand():
    groups = metrics.group_accuracies(ACC, CLUSTERS)

    assert groups == {"all": 75.0, "majority": 70.0, "minority": 90.0}
    assert metrics.group_accuracies(ACC, CLUSTERS, minority_clusters=(0, 2))["minority"] == 75.0
    assert metrics.worst_client_accuracy(ACC) == 60.0
    assert metrics.max_accuracy_disparity(ACC) == 30.0


def test_fairness_metrics_by_hand():
    ref_acc = np.array([95.0, 85.0, 85.0, 85.0])  # Δacc = [5, 5, 15, 25]
    losses = np.array([0.5, 0.7, 0.2, 1.0])
    ref_loss = np.array([0.1, 0.2, 0.2, 0.3])  # ξ = [0.4, 0.5, 0.0, 0.7]

    np.testing.assert_allclose(metrics.privacy_costs_accuracy(ACC, ref_acc), [5, 5, 15, 25])
    assert metrics.fairness_accuracy(ACC, ref_acc) == 20.0
    np.testing.assert_allclose(metrics.privacy_costs_loss(losses, ref_loss), [0.4, 0.5, 0.0, 0.7])
    assert metrics.fairness_loss(losses, ref_loss) == pytest.approx(0.7)
    # Several candidate θ*: the max accuracy / min loss per client is the reference.
    candidates = np.array([[95.0, 10.0], [0.0, 85.0], [85.0, 85.0], [80.0, 85.0]])
    assert metrics.fairness_accuracy(ACC, candidates) == 20.0
    assert metrics.fairness_loss(losses, np.c_[ref_loss, ref_loss + 1]) == pytest.approx(0.7)


def test_clustering_accuracy_by_hand():
    truth = np.array([0, 0, 1, 1, 2, 2])
    relabelled = np.array([2, 2, 0, 0, 1, 1])
    one_wrong = np.array([1, 1, 0, 0, 0, 2])

    assert metrics.hungarian_clustering_accuracy(truth, relabelled) == 1.0
    assert metrics.hungarian_clustering_accuracy(truth, one_wrong) == pytest.approx(5 / 6)
    assert metrics.hungarian_clustering_accuracy([0, 0, 0, 0], [0, 0, 1, 1]) == 0.5
    assert metrics.is_exact_partition(truth, relabelled)
    assert not metrics.is_exact_partition(truth, one_wrong)
    assert not metrics.is_exact_partition([0, 0, 1, 1], [0, 0, 0, 0])  # merged clusters
    assert metrics.exact_partition_rate([(truth, relabelled), (truth, one_wrong)]) == 0.5


# --------------------------------------------------------------------------- #
# Input validation
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: clustering.update_features(np.ones((5, 3)), d_pca=5), "d_pca"),
        (lambda: clustering.update_features([np.ones(3), np.ones(4)]), "same size"),
        (
            lambda: clustering.update_features(np.ones((3, 3)), feature_space="raw"),
            "scaler='none'",
        ),
        (lambda: clustering.update_features(np.full((3, 3), np.nan)), "finite"),
        (lambda: clustering.fit_update_gmm(np.ones((3, 2)), 4), "at least num_clusters"),
        (lambda: assignment.sample_assignments([[0.5, 0.6]], np.random.default_rng()), "sum to 1"),
        (lambda: assignment.sample_assignments([[0.5, 0.5]], 0), "Generator"),
        (lambda: assignment.loss_assignments([0.1, 0.2]), "2-D"),
        (lambda: assignment.selection_noise_scale(1, 1.0), ">= 2"),
        (lambda: accounting.two_stage_history(1.0, 100, 200), "batch_size"),
        (lambda: accounting.two_stage_epsilon(1.0, 1e-5, 100, 10, mode="x"), "mode"),
        (lambda: accounting.two_stage_epsilon(1.0, 2.0, 100, 10), "delta"),
        (lambda: accounting.two_stage_epsilon(1.0, 1e-5, 100, 10, selection_rounds=2), "needs"),
        (lambda: accounting.two_stage_noise_multiplier(1e-9, 1e-5, 100, 10), "unreachable"),
        (lambda: clustering.gmm_stage_rounds(1.5, 10), "max_overlap"),
        (lambda: metrics.group_accuracies([1.0, 2.0], [1, 1]), "non-empty"),
        (lambda: metrics.group_accuracies([1.0, 2.0], [0, 1, 1]), "entries"),
        (lambda: metrics.fairness_accuracy([1.0, 2.0], [1.0]), "one row per client"),
        (lambda: metrics.hungarian_clustering_accuracy([0, 1], [0.5, 1.0]), "integer"),
        (lambda: metrics.exact_partition_rate([]), "at least one"),
        (lambda: overlap.batch_scale_for_overlap(1.0, 0.1), r"\(0, 1\)"),
    ],
)
def test_invalid_inputs_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_the_platforms_private_selection_is_the_papers_noisy_argmax():
    """`LiveSelection.most_accurate` (the platform's, on the client's records) picks what
    §5.4's `private_select_clusters` picks from the same accuracies and the same draw:
    Gumbel(0, 2Δ/ε), Δ = 100/(N − 1)."""
    import torch
    from torch import nn
    from torch.func import functional_call

    from raydpfl.privacy.mechanisms.kernel import (
        ClientRecords,
        ExponentialSelection,
        PrivacySession,
        uses,
    )
    from raydpfl.privacy.per_sample.engines import make_engine

    n, eps = 60, 2.0
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)
    model = nn.Linear(5, 3)
    cands = [
        {k: torch.randn(v.shape, generator=g) for k, v in model.named_parameters()}
        for _ in range(4)
    ]
    with torch.no_grad():
        accs = np.asarray(
            [[100.0 * float((functional_call(model, c, (x,)).argmax(1) == y).sum()) / n
              for c in cands]]
        )  # fmt: skip
    for seed in range(40):
        session = PrivacySession(
            [uses(ExponentialSelection(eps), 1)], torch.Generator().manual_seed(seed)
        )._bind(ClientRecords(x, y, torch.arange(n)), model, make_engine(model, "vmap"))
        got = session.get().most_accurate(cands)
        replay = torch.Generator().manual_seed(seed)  # the selection's one draw
        draw = int(torch.randint(0, 2**62, (1,), generator=replay))
        want = assignment.private_select_clusters(accs, n, eps, np.random.default_rng(draw))
        assert got == int(want[0])
