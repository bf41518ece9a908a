"""End-to-end tests for FederatedDataset, federate() and synthetic_federated()."""

from __future__ import annotations

import numpy as np
import pytest

from raydpfl.data import ArrayDataset, federate, load_dataset, synthetic_federated


@pytest.fixture(scope="module")
def digits() -> ArrayDataset:
    return load_dataset("digits")


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "dirichlet_capped", "shards"])
def test_federate_digits_end_to_end(digits: ArrayDataset, partition: str) -> None:
    fed = federate(digits, num_clients=10, partition=partition, rng=np.random.default_rng(0))

    assert fed.num_clients == 10 and fed.name == "digits" and fed.input_shape == (1, 8, 8)
    used = np.concatenate(fed.client_train + fed.client_test)
    np.testing.assert_array_equal(np.sort(used), np.arange(len(digits.y_train)))
    assert fed.train_sizes().dtype == np.int64 and fed.train_sizes().sum() < len(used)
    x, y = fed.client_arrays(3)
    assert x.shape == (fed.train_sizes()[3], 1, 8, 8) and x.dtype == np.float32
    np.testing.assert_array_equal(y, digits.y_train[fed.client_train[3]])
    x_local_test, _ = fed.client_arrays(3, split="test")
    assert len(x_local_test) == len(fed.client_test[3]) > 0
    assert fed.x_test is digits.x_test
    assert fed.stats().sizes.sum() == fed.train_sizes().sum()


def test_client_arrays_are_copies(digits: ArrayDataset) -> None:
    fed = federate(digits, num_clients=4, partition="iid", rng=np.random.default_rng(0))

    x, _ = fed.client_arrays(0)
    x[:] = 1e6

    assert not np.any(fed.x == 1e6)


def test_federate_dirichlet_skews_labels(digits: ArrayDataset) -> None:
    skewed = federate(
        digits, num_clients=10, partition="dirichlet", alpha=0.05, rng=np.random.default_rng(0)
    )
    balanced = federate(digits, num_clients=10, partition="iid", rng=np.random.default_rng(0))

    assert skewed.stats().mean_classes_per_client < balanced.stats().mean_classes_per_client


@pytest.mark.parametrize("partition", ["iid", "dirichlet_capped"])
def test_federate_pool_all_pools_train_and_test(digits: ArrayDataset, partition: str) -> None:
    fed = federate(
        digits,
        num_clients=10,
        partition=partition,
        alpha=0.05,
        pool="all",
        client_test_fraction=0.25,
        rng=np.random.default_rng(0),
    )

    num_pool = len(digits.y_train) + len(digits.y_test)
    np.testing.assert_array_equal(fed.x, np.concatenate([digits.x_train, digits.x_test]))
    np.testing.assert_array_equal(fed.y, np.concatenate([digits.y_train, digits.y_test]))
    used = np.concatenate(fed.client_train + fed.client_test)
    np.testing.assert_array_equal(np.sort(used), np.arange(num_pool))
    # The central test set is the union of the client test splits, in client order.
    test_idx = np.concatenate(fed.client_test)
    np.testing.assert_array_equal(fed.x_test, fed.x[test_idx])
    np.testing.assert_array_equal(fed.y_test, fed.y[test_idx])
    assert fed.x_test.dtype == np.float32 and fed.y_test.dtype == np.int64
    assert fed.train_sizes().sum() + len(fed.y_test) == num_pool
    assert all(len(t) >= 1 for t in fed.client_test)


def test_federate_pool_train_is_the_default(digits: ArrayDataset) -> None:
    default = federate(digits, num_clients=5, partition="iid", rng=np.random.default_rng(3))
    explicit = federate(
        digits, num_clients=5, partition="iid", pool="train", rng=np.random.default_rng(3)
    )

    assert default.x is digits.x_train and explicit.x is digits.x_train
    assert explicit.x_test is digits.x_test
    assert all(
        np.array_equal(a, b)
        for a, b in zip(default.client_train, explicit.client_train, strict=True)
    )


def test_federate_pfllib_settings_split_75_25_floor(digits: ArrayDataset) -> None:
    fed = federate(
        digits,
        num_clients=10,
        partition="dirichlet_capped",
        alpha=0.5,
        pool="all",
        client_test_fraction=0.25,
        split_rounding="floor_train",
        rng=np.random.default_rng(1),
    )

    shares = [len(a) + len(b) for a, b in zip(fed.client_train, fed.client_test, strict=True)]
    assert fed.train_sizes().tolist() == [int(np.floor(0.75 * n)) for n in shares]
    assert min(shares) >= 10  # dirichlet_capped's default minimum (PFLlib's)


def test_federate_capped_uses_a_given_minimum(digits: ArrayDataset) -> None:
    fed = federate(
        digits,
        num_clients=10,
        partition="dirichlet_capped",
        alpha=0.5,
        min_samples_per_client=100,
        rng=np.random.default_rng(0),
    )

    sizes = [len(a) + len(b) for a, b in zip(fed.client_train, fed.client_test, strict=True)]
    assert min(sizes) >= 100


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"partition": "pathological"}, "partition"),
        ({"num_clients": 10_000}, "num_clients"),
        ({"num_clients": 2000, "pool": "all"}, "num_clients"),
        ({"client_test_fraction": 1.0}, "test_fraction"),
        ({"pool": "everything"}, "pool"),
        ({"pool": "all", "client_test_fraction": 0.0}, "client_test_fraction"),
        ({"split_rounding": "up"}, "split_rounding"),
        ({"partition": "dirichlet_capped", "alpha": 0.0}, "alpha"),
        ({"partition": "dirichlet_capped", "min_samples_per_client": 500}, "min_samples"),
    ],
)
def test_federate_rejects_bad_arguments(
    digits: ArrayDataset, kwargs: dict[str, object], parameter: str
) -> None:
    args = {"num_clients": 5, "partition": "iid", **kwargs}

    with pytest.raises(ValueError, match=parameter):
        federate(digits, rng=np.random.default_rng(0), **args)  # type: ignore[arg-type]


def test_client_arrays_rejects_bad_id_and_split(digits: ArrayDataset) -> None:
    fed = federate(digits, num_clients=3, partition="iid", rng=np.random.default_rng(0))

    with pytest.raises(ValueError, match="client_id"):
        fed.client_arrays(3)
    with pytest.raises(ValueError, match="split"):
        fed.client_arrays(0, split="val")


def test_synthetic_federated_pools_clients_and_unions_tests() -> None:
    fed = synthetic_federated(
        alpha=1.0, beta=1.0, num_clients=6, max_samples=120, rng=np.random.default_rng(0)
    )

    assert fed.name == "synthetic" and fed.input_shape == (60,) and fed.num_clients == 6
    assert fed.x.dtype == np.float32 and fed.y.dtype == np.int64
    test_idx = np.concatenate(fed.client_test)
    np.testing.assert_array_equal(fed.x_test, fed.x[test_idx])
    np.testing.assert_array_equal(fed.y_test, fed.y[test_idx])
    used = np.sort(np.concatenate(fed.client_train + fed.client_test))
    np.testing.assert_array_equal(used, np.arange(len(fed.y)))
    assert all(len(t) >= 1 for t in fed.client_test)


def test_synthetic_federated_is_deterministic_per_seed() -> None:
    first = synthetic_federated(
        alpha=0.5, beta=0.5, num_clients=3, max_samples=80, rng=np.random.default_rng(9)
    )
    again = synthetic_federated(
        alpha=0.5, beta=0.5, num_clients=3, max_samples=80, rng=np.random.default_rng(9)
    )

    np.testing.assert_array_equal(first.x, again.x)
    assert all(
        np.array_equal(a, b) for a, b in zip(first.client_test, again.client_test, strict=True)
    )
