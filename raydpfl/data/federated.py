"""Federated datasets: a pool of records plus per-client index arrays."""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from raydpfl.data._checks import check_int, check_nonnegative, check_rng
from raydpfl.data.datasets import ArrayDataset
from raydpfl.data.partition import (
    SPLIT_ROUNDINGS,
    PartitionStats,
    partition_dirichlet,
    partition_dirichlet_capped,
    partition_iid,
    partition_shards,
    partition_stats,
    split_train_test,
)
from raydpfl.data.partition_more import (
    partition_dirichlet_sizes,
    partition_k_classes,
    partition_natural,
    partition_size_skew,
)
from raydpfl.data.synthetic import make_synthetic_pooled

__all__ = ["FederatedDataset", "IndexTable", "federate", "synthetic_federated"]

_PARTITIONS = (
    "iid",
    "dirichlet",
    "dirichlet_capped",
    "shards",
    "natural",
    "k_classes",
    "size_skew",
    "dirichlet_sizes",
)
_POOLS = ("train", "all")
_SPLITS = ("train", "test")


class IndexTable(Sequence[np.ndarray]):
    """Every client's index array in one CSR-style table (issue 19).

    Client k's indices are ``indices[offsets[k]:offsets[k + 1]]``, returned as a
    read-only view. Two numpy arrays instead of one array object per client: memory in
    proportion to the records, not the clients, and a table that pickles as two buffers,
    so Ray puts it in the object store once and every worker on a node maps it zero-copy.
    It is a `Sequence` of arrays, so code written for a tuple of arrays reads it.

    Args:
        offsets: int64, shape (num_clients + 1,), starting at 0, non-decreasing, ending
            at ``len(indices)``.
        indices: int64, shape (total,).

    Raises:
        ValueError: On arrays that do not form a table.
    """

    __slots__ = ("indices", "offsets")

    def __init__(self, offsets: np.ndarray, indices: np.ndarray) -> None:
        offsets = np.asarray(offsets)
        indices = np.asarray(indices)
        if offsets.ndim != 1 or len(offsets) < 1 or indices.ndim != 1:
            raise ValueError("offsets and indices must be 1-D, offsets of length >= 1")
        if offsets.dtype != np.int64 or indices.dtype != np.int64:
            raise ValueError(
                f"offsets and indices must be int64, got {offsets.dtype} and {indices.dtype}"
            )
        if offsets[0] != 0 or offsets[-1] != len(indices) or np.any(np.diff(offsets) < 0):
            raise ValueError("offsets must start at 0, not decrease and end at len(indices)")
        self.offsets = offsets
        self.indices = indices

    @classmethod
    def from_arrays(cls, arrays: Sequence[np.ndarray]) -> IndexTable:
        """The table of `arrays` (each converted to int64)."""
        sizes = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        parts = [np.asarray(a, dtype=np.int64) for a in arrays]
        indices = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return cls(offsets, indices.astype(np.int64, copy=False))

    @classmethod
    def empty(cls, num_clients: int) -> IndexTable:
        """`num_clients` empty arrays."""
        return cls(np.zeros(num_clients + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))

    def sizes(self) -> np.ndarray:
        """int64 length of every client's array."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, slice):
            return tuple(self[k] for k in range(*key.indices(len(self))))
        k = int(key)
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(f"client {key} out of range for {len(self)} clients")
        view = self.indices[self.offsets[k] : self.offsets[k + 1]]
        view.flags.writeable = False
        return view

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[k] for k in range(len(self)))

    def __reduce__(self):  # the two arrays, so pickling (and Ray) sees plain buffers
        return (IndexTable, (self.offsets, self.indices))

    def __repr__(self) -> str:
        return f"IndexTable(clients={len(self)}, indices={len(self.indices)})"


@dataclass(frozen=True, eq=False)
class FederatedDataset:
    """Client data as index arrays into one shared pool, plus a central test set.

    Index arrays (rather than per-client copies) keep memory flat however many
    clients there are, and make the pool cheap to ship to workers once.

    Attributes:
        name: Source dataset name ("synthetic" for FedProx data).
        num_classes: Number of classes; labels lie in [0, num_classes).
        input_shape: Shape of one example.
        x: float32 pool of every client record, shape (N, *input_shape).
        y: int64 labels of the pool, shape (N,).
        client_train: Per-client sorted int64 indices into `x` for local training: a
            tuple of arrays, or an `IndexTable` (one CSR table; what large synthetic
            populations get).
        client_test: Per-client sorted int64 indices into `x` for local evaluation
            (likewise).
        x_test: float32 central test inputs: held out from every client, or (from
            `federate(pool="all")` and `synthetic_federated`) the union of the
            clients' local test splits.
        y_test: int64 central test labels, aligned with `x_test`.
        client_names: Each client's natural name (a FEMNIST writer, a Hugging Face
            ``client_column`` value) under the "natural" partition; () otherwise.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    x: np.ndarray
    y: np.ndarray
    client_train: tuple[np.ndarray, ...] | IndexTable
    client_test: tuple[np.ndarray, ...] | IndexTable
    x_test: np.ndarray
    y_test: np.ndarray
    client_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.client_train) != len(self.client_test):
            raise ValueError(
                f"client_test must have one array per client ({len(self.client_train)}), "
                f"got {len(self.client_test)}"
            )
        if len(self.x) != len(self.y) or len(self.x_test) != len(self.y_test):
            raise ValueError("x/y and x_test/y_test must have matching lengths")
        if self.client_names and len(self.client_names) != len(self.client_train):
            raise ValueError(
                f"client_names must have one name per client ({len(self.client_train)}), "
                f"got {len(self.client_names)}"
            )

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.client_train)

    def train_sizes(self) -> np.ndarray:
        """Returns the int64 number of local training samples of each client."""
        if isinstance(self.client_train, IndexTable):
            return self.client_train.sizes()
        return np.array([len(idx) for idx in self.client_train], dtype=np.int64)

    def client_arrays(self, client_id: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        """Returns copies of one client's inputs and labels.

        Args:
            client_id: Client index in [0, num_clients).
            split: "train" or "test".

        Returns:
            `(x, y)` fancy-indexed (hence copied) from the pool.

        Raises:
            ValueError: If `client_id` or `split` is out of range.
        """
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
        valid_id = isinstance(client_id, numbers.Integral) and not isinstance(client_id, bool)
        if not valid_id or not 0 <= client_id < self.num_clients:
            raise ValueError(
                f"client_id must be an integer in [0, {self.num_clients}), got {client_id!r}"
            )
        indices = (self.client_train if split == "train" else self.client_test)[client_id]
        return self.x[indices], self.y[indices]

    def stats(self) -> PartitionStats:
        """Returns the label statistics of the clients' training splits."""
        return partition_stats(self.y, self.client_train, self.num_classes)


def federate(
    dataset: ArrayDataset,
    *,
    num_clients: int,
    partition: str,
    rng: np.random.Generator,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    client_test_fraction: float = 0.2,
    min_samples_per_client: int | None = None,
    pool: str = "train",
    split_rounding: str = "nearest",
    classes_per_client: int = 2,
    size_distribution: str = "lognormal",
    size_sigma: float = 1.0,
    power_law_exponent: float = 2.0,
) -> FederatedDataset:
    """Partitions a centralised dataset among clients.

    pool="train" (default): the pool is `dataset.x_train` itself (not copied), and
    `dataset.x_test/y_test` is the central test set, disjoint from every client.

    pool="all" (PFLlib's generator, as in the ALI-DPFL experiments; specs/ali-dpfl.md
    §6.1, A20): the pool is the concatenation x_train + x_test, in that order (a copy;
    e.g. Fashion-MNIST gives 70,000 records). There is then no held-out data: the
    central test set is the union of the clients' local test splits, gathered from the
    pool in client order (x_test = x[concat(client_test)]), so it is made of client
    records and each of them is also some client's local test data. This needs
    client_test_fraction > 0.

    Either way each client's share is split into local train/test with
    `split_train_test` (`split_rounding` chooses its rounding; PFLlib's 75/25 split is
    client_test_fraction=0.25 with split_rounding="floor_train", train = floor(0.75 n)).

    Args:
        dataset: The centralised dataset.
        num_clients: Number of clients; in [1, pool size].
        partition: "iid", "dirichlet", "dirichlet_capped" (PFLlib's Dirichlet with a
            size cap, `partition_dirichlet_capped`), "shards", or (see
            `raydpfl.data.partition_more`) "natural" (one client per natural id; needs
            `dataset.client_ids`, and `client_ids_test` with pool="all"), "k_classes",
            "size_skew" or "dirichlet_sizes".
        rng: Source of randomness for both the partition and the local splits.
        alpha: Dirichlet concentration (the Dirichlet partitions only).
        shards_per_client: Shards per client (partition="shards" only).
        client_test_fraction: Fraction of each client's share held out locally, [0, 1).
        min_samples_per_client: Minimum client share (every partition but "iid" and
            "shards"); None uses the partitioner's default (PFLlib's 10 for
            "dirichlet_capped", 2 otherwise).
        pool: "train" or "all", as above.
        split_rounding: "nearest" or "floor_train"; see `split_train_test`.
        classes_per_client: Labels per client (partition="k_classes" only).
        size_distribution: "lognormal" or "power_law": the client-size law of
            "size_skew" and "dirichlet_sizes" (see `partition_more.client_sizes`).
        size_sigma: Standard deviation of the log sizes (lognormal).
        power_law_exponent: Pareto shape of the sizes (power_law).

    Returns:
        The `FederatedDataset`.

    Raises:
        ValueError: If `partition`, `pool` or `split_rounding` is unknown, an argument
            is out of range, or pool="all" with client_test_fraction == 0.
    """
    _check_federate_args(partition, pool, split_rounding, client_test_fraction)
    num_clients = check_int("num_clients", num_clients, 1)
    check_rng(rng)
    x, y = _pooled(dataset, pool)
    if num_clients > len(y):
        raise ValueError(
            f"num_clients ({num_clients}) must be <= the {len(y)} pooled samples "
            f"of {dataset.name} (pool={pool!r})"
        )
    parts = _partition(
        dataset,
        y,
        pool=pool,
        num_clients=num_clients,
        partition=partition,
        rng=rng,
        alpha=alpha,
        shards_per_client=shards_per_client,
        min_samples_per_client=min_samples_per_client,
        classes_per_client=classes_per_client,
        sizes=(size_distribution, size_sigma, power_law_exponent),
    )
    train, test = split_train_test(parts, client_test_fraction, rng, rounding=split_rounding)
    names = _natural_names(dataset, pool, parts) if partition == "natural" else ()
    return _federated_dataset(dataset, x, y, train, test, pool, names)


def _check_federate_args(
    partition: str, pool: str, split_rounding: str, client_test_fraction: float
) -> None:
    if partition not in _PARTITIONS:
        raise ValueError(f"partition must be one of {_PARTITIONS}, got {partition!r}")
    if pool not in _POOLS:
        raise ValueError(f"pool must be one of {_POOLS}, got {pool!r}")
    if split_rounding not in SPLIT_ROUNDINGS:
        raise ValueError(
            f"split_rounding must be one of {SPLIT_ROUNDINGS}, got {split_rounding!r}"
        )
    if pool == "all" and not (
        isinstance(client_test_fraction, numbers.Real) and client_test_fraction > 0
    ):
        raise ValueError(
            "client_test_fraction must be > 0 with pool='all' (the central test set is "
            f"the union of the client test splits), got {client_test_fraction!r}"
        )


def _pooled(dataset: ArrayDataset, pool: str) -> tuple[np.ndarray, np.ndarray]:
    """The records the clients share: x_train itself (pool="train", not copied), or a copy
    of x_train followed by x_test (pool="all")."""
    if pool == "all":
        x = np.concatenate([dataset.x_train, dataset.x_test])
        y = np.concatenate([dataset.y_train, dataset.y_test])
        return x, y
    return dataset.x_train, dataset.y_train


def _partition(
    dataset: ArrayDataset,
    y: np.ndarray,
    *,
    pool: str,
    num_clients: int,
    partition: str,
    rng: np.random.Generator,
    alpha: float,
    shards_per_client: int,
    min_samples_per_client: int | None,
    classes_per_client: int,
    sizes: tuple[str, float, float],
) -> list[np.ndarray]:
    """Each client's share of the pool (labels `y`), by `federate`'s `partition`.

    `sizes` is (size_distribution, size_sigma, power_law_exponent) of the size-skewed
    partitions.
    """
    num_samples = len(y)
    if partition == "iid":
        return partition_iid(num_samples, num_clients, rng)
    if partition == "shards":
        return partition_shards(y, num_clients, shards_per_client, rng)
    # PFLlib's capped Dirichlet keeps its own default minimum share (10); the others, 2.
    default_minimum = 10 if partition == "dirichlet_capped" else 2
    minimum = default_minimum if min_samples_per_client is None else min_samples_per_client
    if partition == "dirichlet":
        return partition_dirichlet(y, num_clients, alpha, rng, minimum)
    if partition == "dirichlet_capped":
        return partition_dirichlet_capped(y, num_clients, alpha, rng, minimum)
    if partition == "natural":
        return partition_natural(_natural_ids(dataset, pool), num_clients, rng, minimum)
    if partition == "k_classes":
        return partition_k_classes(y, num_clients, classes_per_client, rng, minimum)
    if partition == "size_skew":
        return partition_size_skew(num_samples, num_clients, rng, *sizes, minimum)
    return partition_dirichlet_sizes(y, num_clients, alpha, rng, *sizes, minimum)


def _federated_dataset(
    dataset: ArrayDataset,
    x: np.ndarray,
    y: np.ndarray,
    train: Sequence[np.ndarray],
    test: Sequence[np.ndarray],
    pool: str,
    client_names: tuple[str, ...] = (),
) -> FederatedDataset:
    """The pool and the client splits, with the central test set: `dataset`'s own for
    pool="train"; for pool="all" (no held-out data left) the union of the client test
    splits, gathered in client order."""
    if pool == "all":
        test_idx = np.concatenate(test)
        x_test, y_test = x[test_idx], y[test_idx]
    else:
        x_test, y_test = dataset.x_test, dataset.y_test
    return FederatedDataset(
        name=dataset.name,
        num_classes=dataset.num_classes,
        input_shape=tuple(dataset.input_shape),
        x=x,
        y=y,
        client_train=tuple(train),
        client_test=tuple(test),
        x_test=x_test,
        y_test=y_test,
        client_names=client_names,
    )


def _natural_names(
    dataset: ArrayDataset, pool: str, parts: Sequence[np.ndarray]
) -> tuple[str, ...]:
    """The natural name of each client of the "natural" partition (every record of a share
    has the same id): ``dataset.client_names[id]``, or the id itself without names."""
    ids = _natural_ids(dataset, pool)
    owners = [int(ids[share[0]]) for share in parts]
    names = dataset.client_names
    return tuple(names[i] if i < len(names) else str(i) for i in owners)


def _natural_ids(dataset: ArrayDataset, pool: str) -> np.ndarray:
    """The natural client id of every pooled record, or a ValueError saying none exist."""
    ids = dataset.client_ids
    if pool == "all":
        ids = (
            None
            if ids is None or dataset.client_ids_test is None
            else np.concatenate([ids, dataset.client_ids_test])
        )
    if ids is None:
        raise ValueError(
            f"partition 'natural' needs a dataset with natural client ids (femnist, "
            f"shakespeare, or an ArrayDataset with client_ids); {dataset.name} has none"
            + (" for its test records (pool='all')" if dataset.client_ids is not None else "")
        )
    return ids


def synthetic_federated(
    *,
    alpha: float,
    beta: float,
    num_clients: int,
    rng: np.random.Generator,
    iid: bool = False,
    num_features: int = 60,
    num_classes: int = 10,
    min_samples: int = 50,
    max_samples: int | None = None,
    client_test_fraction: float = 0.2,
) -> FederatedDataset:
    """Builds a FedProx Synthetic(alpha, beta) federated dataset.

    Each client's data comes from `make_synthetic` (see it for the generative model
    and argument ranges) and is split locally with `split_train_test`. There is no
    separate central distribution, so the central test set is the union of the client
    test splits (x_test = x[concat(client_test)]).

    Args:
        alpha: Variance of the per-client model mean; >= 0.
        beta: Variance of the per-client feature mean; >= 0.
        num_clients: Number of clients; >= 1.
        rng: Source of randomness for generation and local splits.
        iid: Generate Synthetic-IID instead.
        num_features: Feature dimension.
        num_classes: Number of classes.
        min_samples: Offset of the per-client sample count.
        max_samples: Optional cap on samples per client.
        client_test_fraction: Fraction of each client held out locally, in [0, 1).

    Returns:
        The `FederatedDataset`, named "synthetic", with input_shape (num_features,).

    Raises:
        ValueError: If an argument is out of range.
    """
    x, y, sizes = make_synthetic_pooled(
        alpha,
        beta,
        num_clients,
        rng,
        num_features=num_features,
        num_classes=num_classes,
        iid=iid,
        min_samples=min_samples,
        max_samples=max_samples,
    )
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    if check_nonnegative("client_test_fraction", client_test_fraction) == 0:
        # Nothing held out: each client's train split is its own rows in order, which is
        # what `split_train_test` returns (sorted, after a shuffle whose draws nothing
        # after this reads: `rng` is not used again), without a Python step per client.
        train = IndexTable(offsets, np.arange(offsets[-1], dtype=np.int64))
        test = IndexTable.empty(num_clients)
        test_idx = np.zeros(0, dtype=np.int64)
    else:
        parts = [np.arange(offsets[k], offsets[k + 1], dtype=np.int64) for k in range(num_clients)]
        train, test = split_train_test(parts, client_test_fraction, rng)
        test_idx = np.concatenate(test)
    return FederatedDataset(
        name="synthetic",
        num_classes=int(num_classes),
        input_shape=(int(num_features),),
        x=x,
        y=y,
        client_train=train if isinstance(train, IndexTable) else tuple(train),
        client_test=test if isinstance(test, IndexTable) else tuple(test),
        x_test=x[test_idx],
        y_test=y[test_idx],
    )
