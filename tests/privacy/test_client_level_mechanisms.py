"""The client-level mechanisms of the privacy kernel
(`raydpfl.privacy.mechanisms.client_level_mechanisms`).

Each mechanism's charge is the `ClientLevelCost` the algorithms charged before the kernel
drew their noise (written out here as the old code built it), its live form draws the
same bits as the old code path (same generator, same order, same expressions) and the
claimed distribution (σS on the sum, z_Δ·S and σ_b with adaptive clipping, σS/√K per
share, σS per tree node), and it counts its invocations so that a round's receipt shows
what was drawn.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from raydpfl.algorithms.base import ClientTask
from raydpfl.algorithms.dp_fedavg_client import DPFedAvgClientLevel
from raydpfl.algorithms.dp_ftrl_client import DPFTRLClientLevel
from raydpfl.privacy.accounting.client_level import ClientLevelCost, tree_schedule
from raydpfl.privacy.mechanisms.client_level_mechanisms import (
    COUNT_NOISE_PURPOSE,
    NOISE_PURPOSE,
    AdaptiveClipGaussianSum,
    ClientGaussianSum,
    DistributedGaussianSum,
    GaussianShare,
    PopulationSession,
    ServerStreams,
    TreeAggregationRelease,
    check_round_receipt,
    population_charge,
    round_noise_generator,
    tree_node_for,
    tree_node_generator,
)
from raydpfl.privacy.mechanisms.kernel import (
    PrivacyContractError,
    PrivacySession,
    SubsampledGaussian,
    costs_of,
    uses,
)
from raydpfl.privacy.per_sample.dpsgd import gaussian_like

SEED = 7
N = 40


def _session(mechanism, round_idx=0, seed=SEED) -> PopulationSession:
    return PopulationSession((uses(mechanism, 1),), ServerStreams(seed, round_idx))


def _old_noisy(total, std, gen):
    """The old `add_aggregate_noise` (dp_fedavg_client), verbatim."""
    if std == 0:
        return {n: t.clone() for n, t in total.items()}
    return {n: t + gaussian_like(t, std, gen) for n, t in total.items()}


def _params():
    g = torch.Generator().manual_seed(1)
    return {"w": torch.randn(5, 3, generator=g), "b": torch.randn(3, generator=g)}


# ---- the charge is the old ClientLevelCost ---------------------------------------------------
@pytest.mark.parametrize(
    "sampling, q, k", [("poisson", 0.25, None), ("fixed", None, 6)], ids=["poisson", "fixed"]
)
def test_the_sum_mechanisms_charge_what_the_algorithm_charged(sampling, q, k):
    old = ClientLevelCost(1.3, sampling, N, q, k, 1)  # DPFedAvgClientLevel.cost, before
    central = ClientGaussianSum(1.3, 0.8, sampling, N, q, k)
    adaptive = AdaptiveClipGaussianSum(1.3, 0.8, sampling, N, q, k, count_stddev=2.0)
    assert central.cost(1) == old and central.cost(1).to_dict() == old.to_dict()
    assert adaptive.cost(1) == old and adaptive.cost(1).to_dict() == old.to_dict()
    assert central.cost(5) == old.with_steps(5)
    if sampling == "fixed":
        distributed = DistributedGaussianSum(1.3, 0.8, N, k)
        assert distributed.cost(1).to_dict() == old.to_dict()
        # the share is charged with its sum, never to a client's ledger
        task = ClientTask(0, 0, 1, 0.1, mechanisms=(uses(distributed.share, 1),))
        assert task.privacy_costs == () and costs_of(task.mechanisms) == ()
        assert population_charge((uses(distributed, 1),)) == old


@pytest.mark.parametrize("options", [{}, {"adaptive_clipping": True, "clip_count_stddev": 3.0}])
def test_dp_fedavg_client_round_cost_is_its_mechanisms_event(options):
    alg = DPFedAvgClientLevel(
        num_clients=N,
        sampling="poisson",
        sampling_rate=0.25,
        local_steps=1,
        lr=0.1,
        batch_size=4,
        clip_norm=0.8,
        noise_multiplier=1.1,
        **options,
    )
    old = ClientLevelCost(1.1, "poisson", N, 0.25, None, 1)
    for r in range(3):
        assert alg.round_privacy_cost(r).to_dict() == old.to_dict()
        (use,) = alg.round_mechanisms(r)
        assert use.count == 1 and use.cost == old


def test_the_tree_mechanism_charges_each_tree_once_as_dp_ftrl_did():
    alg = DPFTRLClientLevel(
        num_clients=20,
        cohort_size=3,
        rounds=15,
        local_steps=1,
        lr=0.1,
        batch_size=4,
        clip_norm=1.0,
        noise_multiplier=1.5,
    )
    tree_rounds = 20 // 3  # T = 6: trees of 6, 6 and 3 rounds
    schedule = tree_schedule(15, tree_rounds)
    for r in range(18):
        epoch, t = divmod(r, tree_rounds)
        # the old DPFTRLClientLevel.round_privacy_cost, written out
        rounds = schedule[epoch] if epoch < len(schedule) else tree_rounds
        old = ClientLevelCost(1.5, "tree", 20, None, 3, 1, rounds) if t == 0 else None
        assert alg.round_privacy_cost(r) == old
        (use,) = alg.round_mechanisms(r)  # every round draws one node
        assert use.count == 1 and use.mechanism.round_in_tree == t + 1
        assert use.mechanism.node == tree_node_for(t + 1)


def test_bad_mechanism_parameters_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="sampling_rate"):
        ClientGaussianSum(1.0, 1.0, "poisson", N, 1.5)
    with pytest.raises(ValueError, match="cohort_size"):
        DistributedGaussianSum(1.0, 1.0, N, N + 1)
    with pytest.raises(ValueError, match="clip_count_stddev"):
        AdaptiveClipGaussianSum(2.0, 1.0, "poisson", N, 0.25, count_stddev=0.9)  # σ_b <= σ/2
    with pytest.raises(ValueError, match="tree_rounds"):
        TreeAggregationRelease(1.0, 1.0, 20, 3, 7, 0, 1)  # 7·3 > 20
    with pytest.raises(ValueError, match="clip_norm"):
        ClientGaussianSum(1.0, 0.0, "poisson", N, 0.25)


# ---- the same bits as the old code paths ------------------------------------------------------
def test_the_live_sums_draw_the_old_bits():
    total = _params()
    central = ClientGaussianSum(1.1, 0.8, "poisson", N, 0.25)
    got = _session(central, round_idx=3).get().release(total)
    want = _old_noisy(total, 1.1 * 0.8, round_noise_generator(SEED, 3, False))
    assert all(torch.equal(got[n], want[n]) for n in total)

    adaptive = AdaptiveClipGaussianSum(1.1, 0.8, "poisson", N, 0.25, count_stddev=2.0)
    live = _session(adaptive, round_idx=3).get()
    got = live.release(total)
    z = (1.1**-2 - (2 * 2.0) ** -2) ** -0.5  # the old update_noise_multiplier
    assert adaptive.update_noise_multiplier == z
    want = _old_noisy(total, z * 0.8, round_noise_generator(SEED, 3, False))
    assert all(torch.equal(got[n], want[n]) for n in total)
    old_gen = round_noise_generator(SEED, 3, False, COUNT_NOISE_PURPOSE)
    old_count = float(gaussian_like(torch.zeros(1, dtype=torch.float64), 2.0, old_gen)[0])
    assert live.noisy_count() == old_count


def test_the_tree_node_and_the_share_draw_the_old_bits():
    start = _params()
    release = TreeAggregationRelease(1.5, 0.7, 20, 3, 6, 2, 4)  # epoch 2, round 4: node (2, 0)
    got = _session(release, round_idx=16).get().node_noise(start)
    gen = tree_node_generator(SEED, 2, (2, 0), False)
    want = {n: gaussian_like(p, 1.5 * 0.7, gen) for n, p in start.items()}
    assert all(torch.equal(got[n], want[n]) for n in start)

    share = GaussianShare(1.5, 0.7, 6)
    raw = _params()
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in raw.values()))
    update = {n: t * (0.6 / norm) for n, t in raw.items()}  # clipped into S = 0.7
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    got = PrivacySession((uses(share, 1),), g1).get(GaussianShare).add(update)
    std = 1.5 * 0.7 / math.sqrt(6)  # the old distributed_noise_std
    want = {n: t + gaussian_like(t, std, g2) for n, t in update.items()}
    assert all(torch.equal(got[n], want[n]) for n in update)


def test_the_streams_are_the_algorithms_old_streams():
    from raydpfl.algorithms.dp_fedavg_client import noise_generator
    from raydpfl.algorithms.dp_ftrl_client import node_generator

    a = noise_generator(SEED, 4, False, NOISE_PURPOSE)
    b = ServerStreams(SEED, 4).round(NOISE_PURPOSE)
    assert torch.equal(torch.randn(8, generator=a), torch.randn(8, generator=b))
    a = node_generator(SEED, 1, (0, 3), False)
    b = ServerStreams(SEED, 9).tree_node(1, (0, 3))
    assert torch.equal(torch.randn(8, generator=a), torch.randn(8, generator=b))


# ---- the claimed distributions -----------------------------------------------------------------
DRAWS = 40_000


def _rel_close(empirical: float, claimed: float, tol: float = 0.03) -> None:
    assert abs(empirical / claimed - 1) < tol, f"empirical std {empirical:.5g} vs {claimed:.5g}"


def test_the_sum_noise_has_std_sigma_s():
    zeros = {"w": torch.zeros(DRAWS, dtype=torch.float64)}
    noisy = _session(ClientGaussianSum(1.3, 0.6, "poisson", N, 0.25)).get().release(zeros)
    _rel_close(float(noisy["w"].std()), 1.3 * 0.6)
    assert abs(float(noisy["w"].mean())) < 5 * 1.3 * 0.6 / math.sqrt(DRAWS)


def test_adaptive_clipping_splits_sigma_into_z_update_and_the_count_sigma_b():
    sigma, s, sigma_b = 1.2, 0.5, 1.5
    mech = AdaptiveClipGaussianSum(sigma, s, "poisson", N, 0.25, count_stddev=sigma_b)
    z = mech.update_noise_multiplier
    # Andrew et al.: the two releases compose to one Gaussian of multiplier σ
    assert z**-2 + (2 * sigma_b) ** -2 == pytest.approx(sigma**-2)
    zeros = {"w": torch.zeros(DRAWS, dtype=torch.float64)}
    noisy = _session(mech).get().release(zeros)
    _rel_close(float(noisy["w"].std()), z * s)
    counts = []
    for r in range(3000):  # one count per round, each from its own round's stream
        live = _session(mech, round_idx=r).get()
        live.release({"w": torch.zeros(1)})
        counts.append(live.noisy_count())
    _rel_close(float(np.std(counts)), sigma_b, tol=0.06)


def test_tree_nodes_and_shares_have_their_claimed_std():
    zeros = {"w": torch.zeros(DRAWS, dtype=torch.float64)}
    for t in (1, 2, 3, 4):
        node = _session(TreeAggregationRelease(0.9, 2.0, 20, 3, 6, 0, t)).get().node_noise(zeros)
        _rel_close(float(node["w"].std()), 0.9 * 2.0)
    # distinct nodes are independent
    n1 = _session(TreeAggregationRelease(0.9, 2.0, 20, 3, 6, 0, 1)).get().node_noise(zeros)
    n2 = _session(TreeAggregationRelease(0.9, 2.0, 20, 3, 6, 0, 2)).get().node_noise(zeros)
    assert abs(float(np.corrcoef(n1["w"].numpy(), n2["w"].numpy())[0, 1])) < 0.03
    share = PrivacySession(
        (uses(GaussianShare(0.9, 2.0, 9), 1),), torch.Generator().manual_seed(0)
    ).get(GaussianShare)
    _rel_close(float(share.add(zeros)["w"].std()), 0.9 * 2.0 / 3.0)


# ---- invocations are counted, and the round's receipt is checked ----------------------------
def test_a_round_receipt_must_show_exactly_the_declared_releases():
    mech = ClientGaussianSum(1.0, 1.0, "poisson", N, 0.25)
    declared = (uses(mech, 1),)
    for draws in (0, 1, 2):
        session = PopulationSession(declared, ServerStreams(SEED, 4))
        for _ in range(draws):
            session.get().release({"w": torch.zeros(2)})
        if draws == 1:
            check_round_receipt(4, declared, session.receipt())
        else:
            with pytest.raises(PrivacyContractError, match=r"^round 5 \(client-level") as e:
                check_round_receipt(4, declared, session.receipt())
            assert "\n" not in str(e.value)


def test_adaptive_counts_an_invocation_only_with_both_releases():
    mech = AdaptiveClipGaussianSum(1.0, 1.0, "poisson", N, 0.25, count_stddev=2.0)
    session = _session(mech)
    live = session.get()
    with pytest.raises(PrivacyContractError, match="without its update sum"):
        live.noisy_count()
    live.release({"w": torch.zeros(2)})
    assert session.receipt().uses[0].count == 0  # the count is still to come
    with pytest.raises(PrivacyContractError, match="second update-sum release"):
        live.release({"w": torch.zeros(2)})
    live.noisy_count()
    assert session.receipt().uses[0].count == 1


def test_a_distributed_sum_needs_every_task_to_declare_its_share():
    mech = DistributedGaussianSum(1.0, 1.0, N, 2)
    good = [ClientTask(c, 0, 1, 0.1, mechanisms=(uses(mech.share, 1),)) for c in (3, 5)]
    summed = {"w": torch.ones(2)}
    assert _session(mech).get().release(summed, good) is summed
    bad = [good[0], dataclasses.replace(good[1], mechanisms=())]
    with pytest.raises(PrivacyContractError, match="client 5, round 1"):
        _session(mech).get().release(summed, bad)


def test_a_round_session_holds_only_population_mechanisms():
    with pytest.raises(PrivacyContractError, match="population-level"):
        PopulationSession((uses(SubsampledGaussian(1.0, 1.0, 0.1), 1),), ServerStreams(0, 0))
    session = _session(ClientGaussianSum(1.0, 1.0, "poisson", N, 0.25))
    with pytest.raises(PrivacyContractError, match="did not declare"):
        session.get(ClientGaussianSum(0.1, 1.0, "poisson", N, 0.25))  # a smaller σ
    assert population_charge(()) is None
    two = (uses(ClientGaussianSum(1.0, 1.0, "poisson", N, 0.25), 2),)
    assert population_charge(two) == ClientLevelCost(1.0, "poisson", N, 0.25, None, 2)
