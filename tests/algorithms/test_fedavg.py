import numpy as np
import pytest
import torch

from raydpfl.algorithms import DPFedAvg, FedAvg
from raydpfl.algorithms.base import ClientResult, WeightedUpdateSum, uniform_cohort
from raydpfl.privacy.accounting.ledger import PrivacyCost


def _result(cid, value, weight):
    return ClientResult(
        client_id=cid, update={"w": torch.tensor([value])}, weight=weight, num_examples=int(weight)
    )


def _aggregate(global_params, results):
    algo = FedAvg(clients_per_round=2, local_steps=1, lr=0.1, batch_size=1)
    return algo.aggregate(global_params, [], results)


def test_weighted_mean_aggregation_matches_hand_computation():
    global_params = {"w": torch.tensor([1.0])}
    results = [_result(0, 2.0, 100), _result(1, -1.0, 300)]

    new = _aggregate(global_params, results)

    # w + (100·2 + 300·(−1)) / 400 = 1 − 0.25
    torch.testing.assert_close(new["w"], torch.tensor([0.75]))


def test_no_results_leave_the_model_unchanged():
    global_params = {"w": torch.tensor([1.0, 2.0])}

    new = _aggregate(global_params, [])

    assert torch.equal(new["w"], global_params["w"])
    assert new["w"] is not global_params["w"]


def test_weighted_sum_of_groups_equals_the_sum_of_clients():
    whole, left, right = WeightedUpdateSum(), WeightedUpdateSum(), WeightedUpdateSum()
    for i, r in enumerate([_result(0, 1.0, 1), _result(1, 3.0, 3), _result(2, -2.0, 2)]):
        whole.add(r.update, r.weight, {"loss": float(i)})
        (left if i < 2 else right).add(r.update, r.weight, {"loss": float(i)})

    merged = WeightedUpdateSum.merged([left, right])

    torch.testing.assert_close(merged.mean()["w"], whole.mean()["w"])
    torch.testing.assert_close(merged.mean()["w"], torch.tensor([(1 + 9 - 4) / 6]))
    assert merged.count == 3 and merged.weight == 6
    assert merged.metric_means() == {"loss": 1.0}


def test_uniform_cohort_is_distinct_sorted_and_seeded():
    a = uniform_cohort(50, 10, np.random.default_rng(0))
    b = uniform_cohort(50, 10, np.random.default_rng(0))

    assert a == b == sorted(set(a))
    assert len(a) == 10 and all(0 <= c < 50 for c in a)


def test_dp_fedavg_declares_the_cost_of_its_local_steps():
    algo = DPFedAvg(
        clients_per_round=2,
        local_steps=7,
        lr=0.1,
        clip_norm=1.0,
        noise_multiplier=1.3,
        sampling_rate=0.02,
    )

    tasks = algo.plan(4, [3, 9], np.array([10] * 10))

    assert [t.client_id for t in tasks] == [3, 9]
    assert all(
        t.privacy_cost == PrivacyCost(noise_multiplier=1.3, sampling_rate=0.02, steps=7)
        for t in tasks
    )
    assert all(t.round_idx == 4 and t.local_steps == 7 for t in tasks)


def test_fedavg_declares_no_privacy_cost():
    algo = FedAvg(clients_per_round=2, local_steps=3, lr=0.1, batch_size=8)

    tasks = algo.plan(0, [0, 1], np.array([10, 10]))

    assert all(t.privacy_cost is None for t in tasks)
    assert not FedAvg.is_private and DPFedAvg.is_private


def test_dp_fedavg_names_what_it_releases_without_accounting():
    algo = DPFedAvg(
        clients_per_round=2,
        local_steps=1,
        lr=0.1,
        clip_norm=1.0,
        noise_multiplier=1.0,
        sampling_rate=0.1,
    )

    released = " ".join(algo.unaccounted_releases())

    assert "client_dataset_sizes" in released
    assert "clipped fraction" in released and "batch size" in released


def test_stacked_weighted_sum_equals_adding_clients_one_by_one():
    g = torch.Generator().manual_seed(4)
    stacked = {"w": torch.randn(5, 3, 2, generator=g), "b": torch.randn(5, 4, generator=g)}
    weights = [3.0, 60.0, 7.0, 1.0, 12.0]
    metrics = [{"loss": float(k), "acc": 0.5} for k in range(4)] + [{"loss": 9.0}]
    one_by_one = WeightedUpdateSum()
    for k, w in enumerate(weights):
        one_by_one.add({n: t[k] for n, t in stacked.items()}, w, metrics[k])

    at_once = WeightedUpdateSum.of_stacked(stacked, weights, metrics)

    assert list(at_once.total) == ["w", "b"]
    for n in stacked:
        torch.testing.assert_close(at_once.total[n], one_by_one.total[n], rtol=1e-6, atol=1e-5)
    assert (at_once.weight, at_once.count) == (one_by_one.weight, one_by_one.count)
    assert at_once.metric_means() == one_by_one.metric_means()
    assert WeightedUpdateSum.of_stacked(stacked, []).total is None
    with pytest.raises(ValueError, match="5 stacked updates for 2 weights"):
        WeightedUpdateSum.of_stacked(stacked, [1.0, 2.0])
