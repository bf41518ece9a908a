"""RC-DPFL's clustered data builders: rotation / label shift, balance, splits, clusters."""

from __future__ import annotations

import numpy as np
import pytest

from raydpfl.data.cluster_shift import (
    PAPER_CLUSTER_SIZES,
    assign_clusters,
    make_cluster_shift,
    make_label_shift_clusters,
    make_rotation_clusters,
    rotate_images,
    shift_labels,
)
from raydpfl.data.federated import FederatedDataset

NUM_CLASSES = 10


def _source(n: int, channels: int = 2, side: int = 4, seed: int = 0):
    # Continuous random pixels: every image (and each of its rotations) is unique, so a
    # pool record can be traced back to its source image exactly.
    rng = np.random.default_rng(seed)
    x = rng.random((n, channels, side, side), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, size=n).astype(np.int64)
    return x, y


def _lookup(x: np.ndarray) -> dict[bytes, int]:
    return {img.tobytes(): i for i, img in enumerate(x)}


def _client_records(ds: FederatedDataset, client: int) -> np.ndarray:
    return np.concatenate([ds.client_train[client], ds.client_test[client]])


def test_rotation_clusters_rotate_each_client_by_its_cluster_quarter_turns():
    x, y = _source(21 * 10 + 5)
    source = _lookup(x)

    ds, clusters = make_rotation_clusters(x, y, rng=np.random.default_rng(1))

    used = []
    for client, k in enumerate(clusters):
        for pos in _client_records(ds, client):
            # Undo the cluster's rotation and find the source image it came from.
            original = source[np.rot90(ds.x[pos], -int(k), axes=(-2, -1)).tobytes()]
            np.testing.assert_array_equal(ds.x[pos], np.rot90(x[original], int(k), axes=(1, 2)))
            assert ds.y[pos] == y[original]
            used.append(original)
    assert len(used) == len(set(used)) == 21 * 10  # disjoint shards, remainder dropped
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64
    assert ds.input_shape == (2, 4, 4) and ds.num_classes == NUM_CLASSES
    assert ds.name == "images_rotation"


def test_label_shift_clusters_keep_images_and_shift_labels_mod_c():
    x, y = _source(21 * 10)
    source = _lookup(x)

    ds, clusters = make_label_shift_clusters(
        x, y, rng=np.random.default_rng(2), num_classes=NUM_CLASSES
    )

    shifted_some = False
    for client, k in enumerate(clusters):
        for pos in _client_records(ds, client):
            original = source[ds.x[pos].tobytes()]
            assert ds.y[pos] == (y[original] + k) % NUM_CLASSES
            shifted_some |= bool(ds.y[pos] != y[original])
    assert shifted_some


def test_paper_defaults_give_21_balanced_clients_in_clusters_of_3_6_6_6():
    x, y = _source(2100)

    ds, clusters = make_rotation_clusters(x, y, rng=np.random.default_rng(3))

    assert ds.num_clients == 21
    assert np.bincount(clusters).tolist() == list(PAPER_CLUSTER_SIZES) == [3, 6, 6, 6]
    # 2100 // 21 = 100 records per client, round(0.2 * 100) = 20 of them local test.
    assert {len(t) for t in ds.client_train} == {80}
    assert {len(t) for t in ds.client_test} == {20}


def test_splits_are_disjoint_and_the_central_test_set_is_their_union():
    x, y = _source(21 * 12 + 3)

    ds, _ = make_rotation_clusters(x, y, rng=np.random.default_rng(4))

    everything = np.concatenate([*ds.client_train, *ds.client_test])
    assert len(everything) == len(np.unique(everything)) == len(ds.x)
    test_all = np.concatenate(ds.client_test)
    np.testing.assert_array_equal(ds.x_test, ds.x[test_all])
    np.testing.assert_array_equal(ds.y_test, ds.y[test_all])


def test_configurable_sizes_samples_and_fraction():
    x, y = _source(200)

    ds, clusters = make_cluster_shift(
        x,
        y,
        shift="label",
        rng=np.random.default_rng(5),
        cluster_sizes=(1, 2),
        samples_per_client=40,
        test_fraction=0.25,
        shuffle_clients=False,
        num_classes=NUM_CLASSES,
    )

    assert clusters.tolist() == [0, 1, 1]
    assert [len(t) for t in ds.client_train] == [30, 30, 30]
    assert [len(t) for t in ds.client_test] == [10, 10, 10]


def test_client_to_cluster_mapping_is_shuffled_and_reproducible():
    rng_a, rng_b = np.random.default_rng(6), np.random.default_rng(6)

    a = assign_clusters(PAPER_CLUSTER_SIZES, rng_a)
    b = assign_clusters(PAPER_CLUSTER_SIZES, rng_b)
    ordered = assign_clusters(PAPER_CLUSTER_SIZES, rng_a, shuffle=False)

    np.testing.assert_array_equal(a, b)
    assert ordered.tolist() == [0] * 3 + [1] * 6 + [2] * 6 + [3] * 6
    assert sorted(a.tolist()) == ordered.tolist() and a.tolist() != ordered.tolist()


def test_same_seed_same_dataset():
    x, y = _source(300)

    first = make_rotation_clusters(x, y, rng=np.random.default_rng(7))
    second = make_rotation_clusters(x, y, rng=np.random.default_rng(7))

    np.testing.assert_array_equal(first.clusters, second.clusters)
    np.testing.assert_array_equal(first.dataset.x, second.dataset.x)
    for t1, t2 in zip(first.dataset.client_train, second.dataset.client_train, strict=True):
        np.testing.assert_array_equal(t1, t2)


def test_official_train_test_mode_takes_client_tests_from_the_test_set():
    x, y = _source(21 * 8, seed=0)
    xt, yt = _source(21 * 3 + 2, seed=1)
    test_source = _lookup(xt)

    ds, clusters = make_rotation_clusters(
        x, y, rng=np.random.default_rng(8), split_mode="official_train_test", x_test=xt, y_test=yt
    )

    assert {len(t) for t in ds.client_train} == {8}
    assert {len(t) for t in ds.client_test} == {3}
    used = []
    for client, k in enumerate(clusters):
        for pos in ds.client_test[client]:
            original = test_source[np.rot90(ds.x[pos], -int(k), axes=(-2, -1)).tobytes()]
            assert ds.y[pos] == yt[original]
            used.append(original)
    assert len(set(used)) == 21 * 3


def test_rotate_images_and_shift_labels_helpers():
    x, _ = _source(3)

    np.testing.assert_array_equal(rotate_images(x, 1), np.rot90(x, 1, axes=(2, 3)))
    np.testing.assert_array_equal(rotate_images(x, 4), x)
    assert shift_labels(np.array([0, 8, 9]), 3, 10).tolist() == [3, 1, 2]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cluster_sizes": ()}, "at least one cluster"),
        ({"cluster_sizes": (3, 0)}, "cluster_sizes"),
        ({"cluster_sizes": (1, 1, 1, 1, 1)}, "at most 4 clusters"),
        ({"samples_per_client": 11}, "samples_per_client"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"split_mode": "official_train_test"}, "needs x_test"),
        ({"x_test": np.zeros((2, 2, 4, 4), np.float32)}, "official_train_test"),
        ({"num_classes": 3}, "num_classes"),
    ],
)
def test_invalid_arguments_raise(kwargs, match):
    x, y = _source(21 * 10)

    with pytest.raises(ValueError, match=match):
        make_rotation_clusters(x, y, rng=np.random.default_rng(0), **kwargs)


def test_invalid_images_raise():
    rng = np.random.default_rng(0)
    labels = np.zeros(30, dtype=np.int64)

    with pytest.raises(ValueError, match="square"):
        make_rotation_clusters(np.zeros((30, 1, 4, 5), np.float32), labels, rng=rng)
    with pytest.raises(ValueError, match=r"\(n, C, H, W\)"):
        make_rotation_clusters(np.zeros((30, 16), np.float32), labels, rng=rng)
    with pytest.raises(ValueError, match="labels"):
        make_rotation_clusters(np.zeros((30, 1, 4, 4), np.float32), labels[:5], rng=rng)
    with pytest.raises(ValueError, match="at most num_classes"):
        make_label_shift_clusters(
            np.zeros((30, 1, 4, 4), np.float32), labels, rng=rng, num_classes=2
        )
    with pytest.raises(TypeError, match="Generator"):
        make_rotation_clusters(np.zeros((30, 1, 4, 4), np.float32), labels, rng=0)
