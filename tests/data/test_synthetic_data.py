"""Tests for FedProx's Synthetic(alpha, beta) generator."""

from __future__ import annotations

import numpy as np
import pytest

from raydpfl.data import make_synthetic


def _mean_label_entropy(clients: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Mean entropy (nats) of each client's label distribution; low means skewed."""
    entropies = []
    for _, y in clients:
        p = np.bincount(y) / len(y)
        p = p[p > 0]
        entropies.append(float(-(p * np.log(p)).sum()))
    return float(np.mean(entropies))


def test_synthetic_shapes_dtypes_and_labels() -> None:
    clients = make_synthetic(1.0, 1.0, 8, np.random.default_rng(0), max_samples=300)

    assert len(clients) == 8
    for x, y in clients:
        assert x.dtype == np.float32 and y.dtype == np.int64
        assert x.ndim == 2 and x.shape[1] == 60 and len(y) == len(x)
        assert 50 <= len(y) <= 300
        assert y.min() >= 0 and y.max() < 10


def test_synthetic_honours_custom_sizes() -> None:
    clients = make_synthetic(
        0.5,
        0.5,
        3,
        np.random.default_rng(1),
        num_features=5,
        num_classes=3,
        min_samples=7,
        max_samples=9,
    )

    assert all(x.shape[1] == 5 and 7 <= len(x) <= 9 and y.max() < 3 for x, y in clients)


def test_synthetic_max_samples_caps_every_client() -> None:
    uncapped = make_synthetic(0.0, 0.0, 40, np.random.default_rng(2))
    capped = make_synthetic(0.0, 0.0, 40, np.random.default_rng(2), max_samples=60)

    assert max(len(y) for _, y in uncapped) > 60  # lognormal(4, 2) has a heavy tail
    assert max(len(y) for _, y in capped) == 60


def test_synthetic_is_deterministic_per_seed() -> None:
    first = make_synthetic(1.0, 1.0, 4, np.random.default_rng(3), max_samples=100)
    again = make_synthetic(1.0, 1.0, 4, np.random.default_rng(3), max_samples=100)

    for (xa, ya), (xb, yb) in zip(first, again, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def test_large_alpha_beta_gives_more_label_skew() -> None:
    mild = make_synthetic(0.0, 0.0, 100, np.random.default_rng(4), max_samples=200)
    strong = make_synthetic(20.0, 20.0, 100, np.random.default_rng(4), max_samples=200)

    # Synthetic(0, 0) is already skewed (FedProx); large beta pushes each client towards
    # a single label. (alpha alone cannot: u_k shifts all logits of a client equally.)
    assert _mean_label_entropy(strong) < _mean_label_entropy(mild) - 0.08


def test_alpha_alone_leaves_labels_unchanged() -> None:
    base = make_synthetic(0.0, 1.0, 5, np.random.default_rng(6), max_samples=100)
    shifted = make_synthetic(9.0, 1.0, 5, np.random.default_rng(6), max_samples=100)

    for (_, y_base), (_, y_shifted) in zip(base, shifted, strict=True):
        np.testing.assert_array_equal(y_base, y_shifted)


def test_iid_clients_share_one_labelling_function() -> None:
    clients = make_synthetic(0.0, 0.0, 30, np.random.default_rng(5), iid=True, max_samples=200)

    pooled = np.concatenate([y for _, y in clients])
    per_client_share = [np.bincount(y, minlength=10) / len(y) for _, y in clients]
    pooled_share = np.bincount(pooled, minlength=10) / len(pooled)
    # IID clients draw labels from one distribution, so each tracks the pooled one.
    assert np.mean(np.abs(np.array(per_client_share) - pooled_share).sum(axis=1)) < 0.5


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"alpha": -1.0}, "alpha"),
        ({"beta": float("inf")}, "beta"),
        ({"num_clients": 0}, "num_clients"),
        ({"num_classes": 1}, "num_classes"),
        ({"min_samples": 0}, "min_samples"),
        ({"max_samples": 10}, "max_samples"),
    ],
)
def test_synthetic_rejects_bad_arguments(kwargs: dict[str, float], parameter: str) -> None:
    args = {"alpha": 1.0, "beta": 1.0, "num_clients": 2, **kwargs}

    with pytest.raises(ValueError, match=parameter):
        make_synthetic(
            args.pop("alpha"),
            args.pop("beta"),
            args.pop("num_clients"),
            np.random.default_rng(0),
            **args,
        )
