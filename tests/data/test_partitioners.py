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

NUM_CLASSES = 10
# 2000 samples, 200 per class: divisible by the shard sizes used below.
LABELS = np.repeat(np.arange(NUM_CLASSES), 200)
np.random.default_rng(123).shuffle(LABELS)

Partitioner = Callable[[np.random.Generator], list[np.ndarray]]
PARTITIONERS: dict[str, Partitioner] = {
    "iid": lambda rng: partition_iid(len(LABELS), 7, rng),
    "dirichlet": lambda rng: partition_dirichlet(LABELS, 7, 0.5, rng),
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
