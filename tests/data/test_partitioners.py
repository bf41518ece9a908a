"""Tests for the client partitioners, local splits and partition statistics."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from raydpfl.data import (
    partition_dirichlet,
    partition_iid,
    partition_shards,
    partition_stats,
    split_train_test,
)
from raydpfl.data.partition import partition_dirichlet_capped

NUM_CLASSES = 10
# 2000 samples, 200 per class: divisible by the shard sizes used below.
LABELS = np.repeat(np.arange(NUM_CLASSES), 200)
np.random.default_rng(123).shuffle(LABELS)

Partitioner = Callable[[np.random.Generator], list[np.ndarray]]
PARTITIONERS: dict[str, Partitioner] = {
    "iid": lambda rng: partition_iid(len(LABELS), 7, rng),
    "dirichlet": lambda rng: partition_dirichlet(LABELS, 7, 0.5, rng),
    "dirichlet_capped": lambda rng: partition_dirichlet_capped(LABELS, 7, 0.5, rng),
    "shards": lambda rng: partition_shards(LABELS, 10, 2, rng),
}


def _assert_valid_partition(parts: list[np.ndarray], num_samples: int) -> None:
    for part in parts:
        assert part.dtype == np.int64 and part.ndim == 1
        assert np.all(np.diff(part) > 0)  # sorted and without repeats
        assert part.size == 0 or (part.min() >= 0 and part.max() < num_samples)
    merged = np.concatenate(parts)
    assert len(np.unique(merged)) == len(merged)  # disjoint


@pytest.mark.parametrize("name", sorted(PARTITIONERS))
def test_partition_is_disjoint_and_covers_all(name: str) -> None:
    parts = PARTITIONERS[name](np.random.default_rng(0))

    _assert_valid_partition(parts, len(LABELS))
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


@pytest.mark.parametrize("name", sorted(PARTITIONERS))
def test_partition_is_deterministic_per_seed(name: str) -> None:
    first = PARTITIONERS[name](np.random.default_rng(5))
    again = PARTITIONERS[name](np.random.default_rng(5))
    other = PARTITIONERS[name](np.random.default_rng(6))

    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_iid_sizes_differ_by_at_most_one() -> None:
    parts = partition_iid(103, 10, np.random.default_rng(0))

    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 103


def test_iid_rejects_more_clients_than_samples() -> None:
    with pytest.raises(ValueError, match="num_clients"):
        partition_iid(3, 4, np.random.default_rng(0))


def test_dirichlet_small_alpha_concentrates_labels() -> None:
    skewed = partition_dirichlet(LABELS, 20, 0.1, np.random.default_rng(0))
    uniform = partition_dirichlet(LABELS, 20, 100.0, np.random.default_rng(0))

    skewed_classes = partition_stats(LABELS, skewed, NUM_CLASSES).mean_classes_per_client
    uniform_classes = partition_stats(LABELS, uniform, NUM_CLASSES).mean_classes_per_client
    assert skewed_classes < 5 and uniform_classes > 9.5


def test_dirichlet_respects_min_samples_per_client() -> None:
    parts = partition_dirichlet(LABELS, 20, 0.3, np.random.default_rng(1), 30)

    assert min(len(p) for p in parts) >= 30


def test_dirichlet_unreachable_minimum_names_parameters() -> None:
    labels = np.zeros(100, dtype=np.int64)  # one class: only 1 client gets data at tiny alpha

    with pytest.raises(ValueError, match="increase alpha"):
        partition_dirichlet(labels, 10, 1e-3, np.random.default_rng(0), 5)


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan")])
def test_dirichlet_rejects_nonpositive_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        partition_dirichlet(LABELS, 5, alpha, np.random.default_rng(0))


def _pfllib_capped_port(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator, least: int
) -> list[np.ndarray]:
    """PFLlib's `separate_data(partition="dir")` loop, transcribed with its float cap
    `len(idx_j) < N / num_clients`, but drawing from `rng` and with the trailing-client
    rounding fix that `partition_dirichlet_capped` documents."""
    big_n = len(labels)
    while True:
        idx_batch: list[list[int]] = [[] for _ in range(num_clients)]
        for k in np.unique(labels):
            idx_k = rng.permutation(np.flatnonzero(labels == k))
            proportions = rng.dirichlet(np.repeat(alpha, num_clients))
            proportions = np.array(
                [
                    p * (len(idx_j) < big_n / num_clients)
                    for p, idx_j in zip(proportions, idx_batch, strict=True)
                ]
            )
            proportions = proportions / proportions.sum()
            cumulative = np.cumsum(proportions)
            cumulative[np.flatnonzero(proportions)[-1] :] = 1.0  # the documented fix
            cuts = (cumulative * len(idx_k)).astype(int)[:-1]
            idx_batch = [
                idx_j + idx.tolist()
                for idx_j, idx in zip(idx_batch, np.split(idx_k, cuts), strict=True)
            ]
        if min(len(idx_j) for idx_j in idx_batch) >= least:
            return [np.sort(np.array(idx_j, dtype=np.int64)) for idx_j in idx_batch]


@pytest.mark.parametrize("alpha", [0.05, 0.5, 1.0])
def test_dirichlet_capped_matches_pfllib_loop(alpha: float) -> None:
    for seed in range(5):
        ours = partition_dirichlet_capped(LABELS, 10, alpha, np.random.default_rng(seed))
        port = _pfllib_capped_port(LABELS, 10, alpha, np.random.default_rng(seed), 10)

        assert all(np.array_equal(a, b) for a, b in zip(ours, port, strict=True))


@pytest.mark.parametrize("alpha", [0.05, 0.5])
def test_dirichlet_capped_cap_guarantee(alpha: float) -> None:
    # The guarantee: a client receives a class chunk only while it holds < |D|/N
    # samples (classes are dealt in ascending label order). Hence, for each client,
    # everything before its last non-empty class is < |D|/N, and its final size is
    # < |D|/N + that last chunk <= |D|/N + the largest class.
    num_clients, num_samples = 10, len(LABELS)
    cap = num_samples / num_clients
    largest_class = int(np.bincount(LABELS).max())
    overshoot = False
    for seed in range(10):
        parts = partition_dirichlet_capped(LABELS, num_clients, alpha, np.random.default_rng(seed))
        counts = partition_stats(LABELS, parts, NUM_CLASSES).counts
        for row in counts:
            last = int(np.flatnonzero(row)[-1])
            assert row[:last].sum() * num_clients < num_samples
            assert row.sum() < cap + row[last] <= cap + largest_class
        overshoot |= bool(counts.sum(axis=1).max() > cap)
    assert overshoot  # the cap was reached in some draw, so the check above bit


def test_dirichlet_capped_bounds_sizes_unlike_uncapped() -> None:
    capped = partition_dirichlet_capped(LABELS, 10, 0.05, np.random.default_rng(0))
    uncapped = partition_dirichlet(LABELS, 10, 0.05, np.random.default_rng(0))

    assert max(len(p) for p in capped) < 2 * len(LABELS) / 10
    assert max(len(p) for p in capped) < max(len(p) for p in uncapped)


def test_dirichlet_capped_small_alpha_is_more_skewed() -> None:
    def stats(alpha: float, seed: int):
        parts = partition_dirichlet_capped(LABELS, 10, alpha, np.random.default_rng(seed))
        return partition_stats(LABELS, parts, NUM_CLASSES)

    skewed = [stats(0.05, seed) for seed in range(5)]
    uniform = [stats(100.0, seed) for seed in range(5)]

    assert max(s.mean_classes_per_client for s in skewed) < 5
    assert min(s.mean_classes_per_client for s in uniform) == NUM_CLASSES
    assert np.mean([s.sizes.std() for s in skewed]) > 3 * np.mean([s.sizes.std() for s in uniform])


def test_dirichlet_capped_respects_min_samples_per_client() -> None:
    default = partition_dirichlet_capped(LABELS, 20, 0.05, np.random.default_rng(1))
    raised = partition_dirichlet_capped(LABELS, 20, 0.3, np.random.default_rng(1), 40)

    assert min(len(p) for p in default) >= 10  # PFLlib/ALI-DPFL's minimum
    assert min(len(p) for p in raised) >= 40


def test_dirichlet_capped_unreachable_minimum_names_parameters() -> None:
    labels = np.zeros(100, dtype=np.int64)  # one class: one client takes it all

    with pytest.raises(ValueError, match="increase alpha"):
        partition_dirichlet_capped(labels, 10, 1e-3, np.random.default_rng(0), 5)


@pytest.mark.parametrize(
    ("args", "parameter"),
    [
        ((LABELS, 5, 0.0), "alpha"),
        ((LABELS, 5, float("nan")), "alpha"),
        ((LABELS, 0, 0.5), "num_clients"),
        ((LABELS[:3], 4, 0.5), "num_clients"),
        ((LABELS, 5, 0.5, -1), "min_samples_per_client"),
        ((LABELS, 10, 0.5, 201), "min_samples_per_client"),
        ((LABELS.astype(float), 5, 0.5), "labels"),
    ],
)
def test_dirichlet_capped_rejects_bad_arguments(args: tuple, parameter: str) -> None:
    labels, num_clients, alpha, *rest = args

    with pytest.raises(ValueError, match=parameter):
        partition_dirichlet_capped(labels, num_clients, alpha, np.random.default_rng(0), *rest)


def test_shards_limit_distinct_labels_per_client() -> None:
    parts = partition_shards(LABELS, 50, 2, np.random.default_rng(0))  # shards of 20

    stats = partition_stats(LABELS, parts, NUM_CLASSES)
    assert np.all((stats.counts > 0).sum(axis=1) <= 2)
    np.testing.assert_array_equal(stats.sizes, np.full(50, 40))


def test_shards_reject_fewer_samples_than_shards() -> None:
    with pytest.raises(ValueError, match="shards_per_client"):
        partition_shards(np.arange(5), 3, 2, np.random.default_rng(0))


def test_partitioners_require_a_generator() -> None:
    with pytest.raises(TypeError, match="rng"):
        partition_iid(10, 2, 0)  # type: ignore[arg-type]


def test_split_train_test_properties() -> None:
    parts = [np.arange(0, 10), np.arange(10, 12), np.arange(12, 13), np.arange(13, 113)]

    train, test = split_train_test(parts, 0.2, np.random.default_rng(0))

    assert [len(t) for t in test] == [2, 1, 0, 20]
    assert [len(t) for t in train] == [8, 1, 1, 80]
    for part, tr, te in zip(parts, train, test, strict=True):
        assert np.intersect1d(tr, te).size == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), part)


def test_split_train_test_keeps_one_train_sample_at_high_fraction() -> None:
    train, test = split_train_test([np.arange(3)], 0.99, np.random.default_rng(0))

    assert len(train[0]) == 1 and len(test[0]) == 2


def test_split_train_test_zero_fraction_gives_empty_tests() -> None:
    parts = [np.arange(5), np.arange(5, 9)]

    train, test = split_train_test(parts, 0.0, np.random.default_rng(0))

    assert all(t.size == 0 and t.dtype == np.int64 for t in test)
    assert all(np.array_equal(a, b) for a, b in zip(train, parts, strict=True))


def test_split_train_test_floor_train_matches_pfllib() -> None:
    # PFLlib: sklearn train_test_split(train_size=0.75), i.e. train = floor(0.75 n).
    parts = [np.arange(n) for n in range(2, 60)]

    train, test = split_train_test(parts, 0.25, np.random.default_rng(0), rounding="floor_train")
    nearest, _ = split_train_test(parts, 0.25, np.random.default_rng(0))

    assert [len(t) for t in train] == [int(np.floor(0.75 * len(p))) for p in parts]
    assert all(len(a) + len(b) == len(p) for a, b, p in zip(train, test, parts, strict=True))
    assert (len(train[9 - 2]), len(nearest[9 - 2])) == (6, 7)  # n = 9: the two differ


def test_split_train_test_floor_train_keeps_clamps() -> None:
    train, test = split_train_test(
        [np.arange(1), np.arange(3), np.arange(4)],
        0.0,
        np.random.default_rng(0),
        rounding="floor_train",
    )

    assert [len(t) for t in train] == [1, 3, 4] and all(t.size == 0 for t in test)


def test_split_train_test_rejects_bad_rounding() -> None:
    with pytest.raises(ValueError, match="rounding"):
        split_train_test([np.arange(4)], 0.25, np.random.default_rng(0), rounding="up")


@pytest.mark.parametrize("fraction", [1.0, -0.1, 1.5])
def test_split_train_test_rejects_bad_fraction(fraction: float) -> None:
    with pytest.raises(ValueError, match="test_fraction"):
        split_train_test([np.arange(4)], fraction, np.random.default_rng(0))


def test_partition_stats_counts_and_serialises() -> None:
    labels = np.array([0, 0, 1, 2, 2, 2])
    parts = [np.array([0, 1, 2]), np.array([3, 4]), np.array([5])]

    stats = partition_stats(labels, parts, 3)

    np.testing.assert_array_equal(stats.counts, [[2, 1, 0], [0, 0, 2], [0, 0, 1]])
    np.testing.assert_array_equal(stats.sizes, [3, 2, 1])
    assert (stats.min_size, stats.median_size, stats.max_size) == (1, 2.0, 3)
    assert stats.mean_classes_per_client == pytest.approx(4 / 3)
    assert json.loads(json.dumps(stats.to_dict()))["counts"][0] == [2, 1, 0]
    assert "3 clients" in stats.summary()


def test_partition_stats_summary_stays_short_for_many_clients() -> None:
    parts = partition_iid(len(LABELS), 200, np.random.default_rng(0))

    summary = partition_stats(LABELS, parts, NUM_CLASSES).summary()

    assert len(summary.splitlines()) <= 10


def test_partition_stats_rejects_out_of_range_index() -> None:
    with pytest.raises(ValueError, match=r"parts\[0\]"):
        partition_stats(np.array([0, 1]), [np.array([2])], 2)
