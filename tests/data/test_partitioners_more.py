"""The Flower-style partitioners (issue 22): natural, k_classes, size_skew, dirichlet_sizes.

Every partition is checked to be deterministic from the seed, a true partition (each
record at most once) with every client at min_samples_per_client or more, and to have the
statistics its kind promises.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from raydpfl.data import (
    ArrayDataset,
    client_sizes,
    federate,
    load_dataset,
    partition_dirichlet_sizes,
    partition_k_classes,
    partition_natural,
    partition_size_skew,
)

NUM_CLASSES = 10
LABELS = np.random.default_rng(7).integers(0, NUM_CLASSES, 5000)
IDS = np.random.default_rng(8).integers(0, 40, 5000)

Partitioner = Callable[[np.random.Generator], list[np.ndarray]]
PARTITIONERS: dict[str, Partitioner] = {
    "natural": lambda rng: partition_natural(IDS, 25, rng, 2),
    "k_classes": lambda rng: partition_k_classes(LABELS, 30, 3, rng, 2),
    "size_skew": lambda rng: partition_size_skew(len(LABELS), 30, rng, "lognormal", 1.5),
    "size_skew_power": lambda rng: partition_size_skew(len(LABELS), 30, rng, "power_law"),
    "dirichlet_sizes": lambda rng: partition_dirichlet_sizes(LABELS, 30, 0.3, rng),
}


def _assert_true_partition(parts: list[np.ndarray], n: int, minimum: int) -> None:
    for part in parts:
        assert part.dtype == np.int64 and part.ndim == 1
        assert np.all(np.diff(part) > 0)  # sorted, no repeats
        assert part.size >= minimum and part.min() >= 0 and part.max() < n
    merged = np.concatenate(parts)
    assert len(np.unique(merged)) == len(merged)  # each record at most once


@pytest.mark.parametrize("name", sorted(PARTITIONERS))
def test_each_is_a_true_deterministic_partition(name: str) -> None:
    first = PARTITIONERS[name](np.random.default_rng(5))
    again = PARTITIONERS[name](np.random.default_rng(5))
    other = PARTITIONERS[name](np.random.default_rng(6))

    _assert_true_partition(first, len(LABELS), 2)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("name", ["size_skew", "size_skew_power", "dirichlet_sizes"])
def test_size_partitions_use_every_record(name: str) -> None:
    parts = PARTITIONERS[name](np.random.default_rng(0))

    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


# ---- natural ----------------------------------------------------------------------------
def test_natural_one_client_per_id_in_id_order() -> None:
    ids = np.array([3, 1, 3, 1, 7, 7, 7, 3])

    parts = partition_natural(ids, 3, np.random.default_rng(0), 2)

    assert [p.tolist() for p in parts] == [[1, 3], [0, 2, 7], [4, 5, 6]]


def test_natural_subset_rule_and_min_samples() -> None:
    parts = partition_natural(IDS, 10, np.random.default_rng(1), 2)
    held = [int(np.unique(IDS[p])[0]) for p in parts]

    assert all(len(np.unique(IDS[p])) == 1 for p in parts)  # one id per client
    assert held == sorted(set(held)) and len(held) == 10  # distinct ids, ascending
    assert all(len(p) == int((i == IDS).sum()) for p, i in zip(parts, held, strict=True))
    ids = np.array([0, 0, 1, 2, 2])  # id 1 has a single record
    assert len(partition_natural(ids, 2, np.random.default_rng(0), 2)) == 2
    with pytest.raises(ValueError, match=r"num_clients \(3\) must be <= the 2 natural ids"):
        partition_natural(ids, 3, np.random.default_rng(0), 2)


# ---- k_classes --------------------------------------------------------------------------
@pytest.mark.parametrize(("clients", "k"), [(30, 3), (7, 1), (4, 2), (50, 10)])
def test_k_classes_every_client_holds_exactly_k_labels(clients: int, k: int) -> None:
    parts = partition_k_classes(LABELS, clients, k, np.random.default_rng(2), 2)

    assert [len(np.unique(LABELS[p])) for p in parts] == [k] * clients
    held = set(np.concatenate([np.unique(LABELS[p]) for p in parts]).tolist())
    if clients >= NUM_CLASSES:
        assert held == set(range(NUM_CLASSES))  # every label has a client
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))
    else:  # records of labels no client holds belong to none
        assert len(np.concatenate(parts)) == int(np.isin(LABELS, list(held)).sum())


def test_k_classes_splits_each_label_evenly_among_its_holders() -> None:
    parts = partition_k_classes(LABELS, 20, 2, np.random.default_rng(3), 2)
    for c in range(NUM_CLASSES):
        shares = [int((LABELS[p] == c).sum()) for p in parts if (LABELS[p] == c).any()]
        assert sum(shares) == int((c == LABELS).sum())
        assert max(shares) - min(shares) <= 1


def test_k_classes_refuses_more_labels_than_the_data_has() -> None:
    with pytest.raises(ValueError, match=r"classes_per_client \(11\) must be <= the 10"):
        partition_k_classes(LABELS, 5, 11, np.random.default_rng(0))


# ---- size_skew --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("law", "sigma", "exponent", "log_var"),
    [("lognormal", 1.0, 2.0, 1.0), ("lognormal", 0.5, 2.0, 0.25), ("power_law", 1.0, 2.0, 0.25)],
)
def test_size_skew_log_variance_is_the_configured_one(law, sigma, exponent, log_var) -> None:
    variances = [
        np.var(np.log(client_sizes(400_000, 2000, np.random.default_rng(s), law, sigma, exponent)))
        for s in range(5)
    ]

    assert np.mean(variances) == pytest.approx(log_var, rel=0.1)


def test_size_skew_labels_stay_iid_and_sizes_respect_the_minimum() -> None:
    labels = np.random.default_rng(0).integers(0, 5, 200_000)
    parts = partition_size_skew(
        len(labels), 50, np.random.default_rng(1), "lognormal", 2.0, 2.0, 30
    )

    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 30 and sizes.sum() == len(labels)
    big = max(parts, key=len)
    assert np.bincount(labels[big], minlength=5) / len(big) == pytest.approx([0.2] * 5, abs=0.02)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"distribution": "zipf"}, "size_distribution must be one of"),
        ({"sigma": 0.0}, "size_sigma must be a finite real number > 0"),
        ({"distribution": "power_law", "exponent": -1.0}, "power_law_exponent must be"),
        ({"min_size": 200}, r"min_samples_per_client \(200\) x num_clients \(30\) exceeds"),
    ],
)
def test_client_sizes_refuses_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        client_sizes(5000, 30, np.random.default_rng(0), **kwargs)


# ---- dirichlet_sizes --------------------------------------------------------------------
def test_dirichlet_sizes_has_the_drawn_sizes_and_label_skew() -> None:
    parts = partition_dirichlet_sizes(LABELS, 30, 0.1, np.random.default_rng(4), "lognormal", 1.0)
    skewed_classes = np.mean([len(np.unique(LABELS[p])) for p in parts])
    flat = partition_dirichlet_sizes(LABELS, 30, 100.0, np.random.default_rng(4), "lognormal", 1.0)
    flat_classes = np.mean([len(np.unique(LABELS[p])) for p in flat])

    sizes = client_sizes(len(LABELS), 30, np.random.default_rng(4), "lognormal", 1.0)
    assert [len(p) for p in parts] == sizes.tolist()  # the sizes are drawn first
    assert [len(p) for p in flat] == sizes.tolist()
    assert skewed_classes < 6 < flat_classes


# ---- through federate, the config and the CLI --------------------------------------------
#: sha256 of federate(digits, 10 clients, kind, default_rng(0)) client_train + client_test
#: index bytes, computed with the code as it was before the new partitioners (git HEAD).
BEFORE = {
    "iid": "c544d6eafbd442d0942a6aaaeffbaad8379a6023c51bd08fe072533384a87f73",
    "dirichlet": "94f480fbd9cf2768dbb7467dd6ce62922049fc62d994012461d10a5cf1aa0d49",
    "dirichlet_capped": "506c19c6f9460728337e8009e9e38f2923748f33be821ba637e9c35e3ad73639",
    "shards": "66e01546619c30b2da9f5d1ca2daaaa249aef765127db3320393ce630a58556d",
}


@pytest.mark.parametrize("kind", sorted(BEFORE))
def test_existing_partitions_are_bit_identical(kind: str) -> None:
    fed = federate(
        load_dataset("digits"), num_clients=10, partition=kind, rng=np.random.default_rng(0)
    )

    indices = b"".join(p.tobytes() for p in fed.client_train + fed.client_test)
    assert hashlib.sha256(indices).hexdigest() == BEFORE[kind]


def test_natural_with_pool_all_uses_the_test_ids_too() -> None:
    rng = np.random.default_rng(0)
    ds = ArrayDataset(
        name="toy",
        x_train=rng.random((20, 2), dtype=np.float32),
        y_train=np.arange(20) % 3,
        x_test=rng.random((6, 2), dtype=np.float32),
        y_test=np.arange(6) % 3,
        num_classes=3,
        input_shape=(2,),
        client_ids=np.arange(20) % 4,
        client_ids_test=np.arange(6) % 4,
    )

    fed = federate(ds, num_clients=4, partition="natural", rng=rng, pool="all")

    ids = np.concatenate([ds.client_ids, ds.client_ids_test])
    for train, test in zip(fed.client_train, fed.client_test, strict=True):
        assert len(np.unique(ids[np.concatenate([train, test])])) == 1
    assert (
        sum(len(t) + len(s) for t, s in zip(fed.client_train, fed.client_test, strict=True)) == 26
    )


def test_array_dataset_refuses_client_ids_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="client_ids must be a 1-D integer array with one id"):
        ArrayDataset(
            name="toy",
            x_train=np.zeros((3, 1), np.float32),
            y_train=np.zeros(3, np.int64),
            x_test=np.zeros((1, 1), np.float32),
            y_test=np.zeros(1, np.int64),
            num_classes=1,
            input_shape=(1,),
            client_ids=np.zeros(2, np.int64),
        )


@pytest.mark.parametrize(
    ("partition", "message"),
    [
        ({"kind": "k_classes", "classes_per_client": 0}, "classes_per_client: must be >= 1"),
        ({"size_sigma": 0}, "size_sigma: must be > 0"),
        ({"power_law_exponent": -2}, "power_law_exponent: must be > 0"),
        ({"size_distribution": "zipf"}, "size_distribution: must be one of lognormal, power_law"),
        ({"kind": "natral"}, "kind: must be one of iid, dirichlet, dirichlet_capped, shards, nat"),
    ],
)
def test_partition_config_errors_name_the_field(partition: dict, message: str) -> None:
    from raydpfl.config.load import config_from_dict
    from raydpfl.config.schema import ConfigError

    with pytest.raises(ConfigError, match=message) as info:
        config_from_dict({"experiment": {"data": {"partition": partition}}})
    assert str(info.value).startswith("experiment.data.partition.")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("sets", "expect"),
    [
        (["data.partition.kind=k_classes", "data.partition.classes_per_client=3"], "3.00"),
        (["data.partition.kind=size_skew", "data.partition.size_sigma=1.5"], "12 clients"),
        (
            ["data.partition.kind=dirichlet_sizes", "data.partition.size_distribution=power_law"],
            "12 clients",
        ),
    ],
)
def test_data_stats_cli_shows_the_new_partitions(tmp_path: Path, capsys, sets, expect) -> None:
    from raydpfl.cli.main import main

    config = tmp_path / "c.yaml"
    config.write_text(
        "experiment:\n  data: {dataset: digits, num_clients: 12, client_test_fraction: 0.0}\n"
        "  algorithm: {clients_per_round: 2}\n"
    )
    args = ["data", "stats", str(config)]
    for s in sets:
        args += ["--set", s]

    assert main(args) == 0
    out = capsys.readouterr().out
    assert "digits: 12 clients" in out and expect in out
