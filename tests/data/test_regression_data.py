"""The regression dataset (diabetes) and the label-quantile partition of real-valued targets."""

from __future__ import annotations

import numpy as np
import pytest

from raydpfl.data.datasets import REGRESSION_DATASETS, find_dataset_files, load_dataset
from raydpfl.data.federated import federate
from raydpfl.data.partition import (
    LABEL_BINS,
    partition_dirichlet,
    partition_shards,
    partition_stats,
    quantile_bins,
)


def test_quantile_bins_split_real_values_into_equal_ordered_bins():
    values = np.random.default_rng(0).normal(size=1000)
    bins = quantile_bins(values)
    assert bins.dtype == np.int64 and bins.min() == 0 and bins.max() == LABEL_BINS - 1
    np.testing.assert_array_equal(np.bincount(bins), np.full(LABEL_BINS, 100))
    order = np.argsort(values)
    assert np.all(np.diff(bins[order]) >= 0)  # bins follow the values' order
    # Ties stay together and nothing is dropped.
    tied = quantile_bins(np.array([0.0] * 5 + [1.0] * 5), num_bins=4)
    assert len(set(tied[:5])) == 1 and len(set(tied[5:])) == 1 and tied[0] < tied[5]
    with pytest.raises(ValueError, match="finite"):
        quantile_bins(np.array([0.0, np.nan]))


def test_dirichlet_on_real_targets_is_the_per_class_scheme_on_the_quantile_bins():
    y = np.random.default_rng(1).gamma(2.0, size=600).astype(np.float32)
    parts = partition_dirichlet(y, 12, 0.5, np.random.default_rng(7), 10)
    by_bins = partition_dirichlet(quantile_bins(y), 12, 0.5, np.random.default_rng(7), 10)
    for a, b in zip(parts, by_bins, strict=True):
        np.testing.assert_array_equal(a, b)
    joined = np.sort(np.concatenate(parts))
    np.testing.assert_array_equal(joined, np.arange(600))  # a disjoint cover
    assert min(len(p) for p in parts) >= 10
    # Small alpha skews the clients' target distributions (their largest bin share).
    stats = partition_stats(y, parts, 1)
    assert stats.num_classes == LABEL_BINS

    def top_share(s):
        return float((s.counts.max(axis=1) / s.sizes).mean())

    iid_like = partition_dirichlet(y, 12, 1000.0, np.random.default_rng(7), 10)
    iid_stats = partition_stats(y, iid_like, 1)
    assert iid_stats.mean_classes_per_client == LABEL_BINS
    assert top_share(stats) > top_share(iid_stats) + 0.1
    with pytest.raises(ValueError, match="labels"):  # the other schemes take classes only
        partition_shards(y, 10, 1, np.random.default_rng(0))


def test_diabetes_is_standardised_with_train_statistics():
    assert "diabetes" in REGRESSION_DATASETS
    assert find_dataset_files("diabetes") == {}  # ships with scikit-learn
    d = load_dataset("diabetes")
    assert d.x_train.shape == (354, 10) and d.x_test.shape == (88, 10)
    assert d.y_train.dtype == np.float32 and d.x_train.dtype == np.float32
    assert d.num_classes == 1 and d.input_shape == (10,)
    np.testing.assert_allclose(d.x_train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(d.x_train.std(axis=0), 1.0, atol=1e-5)
    assert abs(float(d.y_train.mean())) < 1e-5 and abs(float(d.y_train.std()) - 1) < 1e-5
    # The test split is scaled with the train statistics, not its own.
    assert abs(float(d.y_test.mean())) > 1e-3
    from sklearn.datasets import load_diabetes

    raw = load_diabetes(scaled=False)
    y = raw.target
    ys = np.sort(np.concatenate([d.y_train, d.y_test]))
    slope = np.polyfit(np.sort(y), ys, 1)  # an affine image of the raw target
    np.testing.assert_allclose(np.polyval(slope, np.sort(y)), ys, atol=1e-5)
    again = load_dataset("diabetes")
    np.testing.assert_array_equal(again.y_test, d.y_test)


def test_federate_partitions_diabetes_by_target_quantiles():
    d = load_dataset("diabetes")
    fed = federate(
        d,
        num_clients=10,
        partition="dirichlet",
        rng=np.random.default_rng(0),
        alpha=3.0,
        client_test_fraction=0.2,
        min_samples_per_client=10,
    )
    assert fed.y.dtype == np.float32 and fed.num_classes == 1
    pairs = zip(fed.client_train, fed.client_test, strict=True)
    assert sum(len(t) + len(s) for t, s in pairs) == 354
    assert fed.stats().num_classes == LABEL_BINS
