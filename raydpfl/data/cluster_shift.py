"""Clustered federated image data for RC-DPFL: covariate shift and concept shift.

Paper: "Mitigating Disparate Impact of Differential Privacy in Federated Learning through
Robust Clustering" (seed 004; spec shared/specs/robust-clustering.md, cited as §). §5 and
Appendix A of the paper: n = 21 clients in M = 4 clusters of {3, 6, 6, 6} clients, cluster
0 being the minority; samples are allocated to clients "in a uniform way" (balanced), and
each client's data is split 80% train / 20% test. Heterogeneity between clusters is either

- covariate shift: every image of a client in cluster k is rotated by k·90° (§6.10), or
- concept shift: every label y of a client in cluster k becomes (y + k) mod C (§6.10).

The transform is applied to a client's train *and* test records (§6.9), so the per-client
test accuracy measures the client's own distribution. Because the records of different
clusters differ, the builders materialise a new pool holding every client's (transformed)
records once; `FederatedDataset.client_train/client_test` index into that pool.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

from raydpfl.data._checks import check_int, check_labels, check_rng
from raydpfl.data.federated import FederatedDataset
from raydpfl.data.partition import split_train_test

__all__ = [
    "PAPER_CLUSTER_SIZES",
    "SHIFTS",
    "SPLIT_MODES",
    "ClusteredFederated",
    "assign_clusters",
    "make_cluster_shift",
    "make_label_shift_clusters",
    "make_rotation_clusters",
    "rotate_images",
    "shift_labels",
]

#: §7: 21 clients in clusters of {3, 6, 6, 6}; cluster 0 is the minority.
PAPER_CLUSTER_SIZES: tuple[int, ...] = (3, 6, 6, 6)

SHIFTS: tuple[str, ...] = ("rotation", "label")

#: §6.9 split modes. "seed_pool_80_20": one pool cut into disjoint equal client shards,
#: each split 80/20 locally (the paper's Appendix A). "official_train_test": the official
#: train set cut into disjoint client train shards and the official test set into disjoint
#: client test shards (matches Table 2's FMNIST/CIFAR10 sizes). The spec's third mode,
#: "code_overlap" (the later paper version's overlapping per-client samples), is not built.
SPLIT_MODES: tuple[str, ...] = ("seed_pool_80_20", "official_train_test")


class ClusteredFederated(NamedTuple):
    """A clustered federated dataset and the true cluster s(i) of every client.

    Attributes:
        dataset: The `FederatedDataset` (records already transformed per cluster).
        clusters: int64 array of shape (num_clients,), the true cluster of each client;
            cluster k has `cluster_sizes[k]` clients and received shift k.
    """

    dataset: FederatedDataset
    clusters: np.ndarray


def rotate_images(x: np.ndarray, quarter_turns: int) -> np.ndarray:
    """Rotates images of shape (..., H, W) by `quarter_turns`·90° counter-clockwise (App. A).

    Counter-clockwise matches `torchvision.transforms.functional.rotate` with a positive
    angle, which the authors' code uses (§6.10).

    Args:
        x: Images with the two spatial axes last, e.g. (n, C, H, W).
        quarter_turns: Number of 90° turns k (any integer; taken mod 4).

    Returns:
        A new C-contiguous array `np.rot90(x, k, axes=(-2, -1))`.

    Raises:
        ValueError: If `x` has fewer than 2 dimensions, or H != W and k is odd (the shape
            would change and the images could not share one pool).
    """
    array = np.asarray(x)
    if array.ndim < 2:
        raise ValueError(f"x must have at least 2 dimensions (..., H, W), got {array.shape}")
    if isinstance(quarter_turns, bool) or not isinstance(quarter_turns, numbers.Integral):
        raise ValueError(f"quarter_turns must be an integer, got {quarter_turns!r}")
    k = int(quarter_turns) % 4
    if k % 2 == 1 and array.shape[-1] != array.shape[-2]:
        raise ValueError(
            f"odd quarter turns need square images, got H={array.shape[-2]}, W={array.shape[-1]}"
        )
    return np.ascontiguousarray(np.rot90(array, k, axes=(-2, -1)))


def shift_labels(y: np.ndarray, shift: int, num_classes: int) -> np.ndarray:
    """Concept shift of App. A: y ↦ (y + shift) mod num_classes.

    Args:
        y: Non-negative integer labels below `num_classes`.
        shift: The cluster index k (any integer).
        num_classes: Number of classes C >= 1.

    Returns:
        A new int64 array of shifted labels.

    Raises:
        ValueError: If the labels or `num_classes` are invalid.
    """
    num_classes = check_int("num_classes", num_classes, 1)
    labels = check_labels(y)
    if labels.size and labels.max() >= num_classes:
        raise ValueError(f"labels must be < num_classes={num_classes}, got {labels.max()}")
    if isinstance(shift, bool) or not isinstance(shift, numbers.Integral):
        raise ValueError(f"shift must be an integer, got {shift!r}")
    return (labels + int(shift)) % num_classes


def assign_clusters(
    cluster_sizes: Sequence[int], rng: np.random.Generator, *, shuffle: bool = True
) -> np.ndarray:
    """The true cluster s(i) of every client, cluster k holding `cluster_sizes[k]` clients.

    Without shuffling, clients come in cluster order (0, 0, 0, 1, ... as the authors' code,
    §6.10). With shuffling ([REC] §6.10) the client↔cluster mapping is a random permutation,
    so no method can exploit the client index order.

    Args:
        cluster_sizes: Number of clients of each cluster, each >= 1.
        rng: Source of randomness (used only when `shuffle`).
        shuffle: Randomly permute the clients.

    Returns:
        int64 array of length sum(cluster_sizes).

    Raises:
        ValueError: If `cluster_sizes` is empty or holds a non-positive size.
    """
    check_rng(rng)
    sizes = _check_cluster_sizes(cluster_sizes)
    clusters = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    return rng.permutation(clusters) if shuffle else clusters


def _check_cluster_sizes(cluster_sizes: Sequence[int]) -> tuple[int, ...]:
    if isinstance(cluster_sizes, (str, bytes)) or not isinstance(cluster_sizes, Sequence):
        raise ValueError(f"cluster_sizes must be a sequence of ints, got {cluster_sizes!r}")
    if len(cluster_sizes) == 0:
        raise ValueError("cluster_sizes must hold at least one cluster")
    return tuple(check_int(f"cluster_sizes[{k}]", s, 1) for k, s in enumerate(cluster_sizes))


def _check_images(name: str, x: object, y: object) -> tuple[np.ndarray, np.ndarray]:
    images = np.asarray(x)
    if images.ndim != 4:
        raise ValueError(f"{name} must have shape (n, C, H, W), got {images.shape}")
    if not np.issubdtype(images.dtype, np.floating):
        raise ValueError(f"{name} must be a float array, got dtype {images.dtype}")
    labels = check_labels(y)
    if len(labels) != len(images):
        raise ValueError(f"{name} has {len(images)} images but {len(labels)} labels")
    return images, labels


def _equal_shards(
    num_records: int, num_clients: int, per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    # Disjoint, equal shards of a random permutation; the remainder (< num_clients records
    # by default) is dropped so that every client holds exactly the same amount (App. A).
    chosen = rng.permutation(num_records)[: num_clients * per_client]
    return [np.sort(part) for part in chosen.reshape(num_clients, per_client)]


def _per_client(name: str, value: int | None, available: int, num_clients: int) -> int:
    most = available // num_clients
    if value is None:
        value = most
    value = check_int(name, value, 1)
    if value > most:
        raise ValueError(
            f"{name}={value} needs {value * num_clients} records, only {available} available"
        )
    return value


def make_cluster_shift(
    x: np.ndarray,
    y: np.ndarray,
    *,
    shift: Literal["rotation", "label"],
    rng: np.random.Generator,
    cluster_sizes: Sequence[int] = PAPER_CLUSTER_SIZES,
    num_classes: int | None = None,
    samples_per_client: int | None = None,
    test_fraction: float = 0.2,
    split_mode: Literal["seed_pool_80_20", "official_train_test"] = "seed_pool_80_20",
    x_test: np.ndarray | None = None,
    y_test: np.ndarray | None = None,
    test_samples_per_client: int | None = None,
    shuffle_clients: bool = True,
    name: str = "images",
) -> ClusteredFederated:
    """Builds RC-DPFL's clustered federated data from a centralised image dataset (App. A).

    Steps (all randomness from `rng`):
    1. the true cluster of each client (`assign_clusters`, shuffled by default, §6.10);
    2. balanced, disjoint client shards of the source records (App. A: "allocate samples
       to all clients in a uniform way", "all users have the same amount of samples");
    3. "seed_pool_80_20": each shard split locally into train/test (80/20 by default);
       "official_train_test": train shards from (x, y), test shards from (x_test, y_test);
    4. the cluster's shift applied to every record of the client, train and test (§6.9).

    The central test set of the returned `FederatedDataset` is the union of the client test
    splits (as for `synthetic_federated`): with per-cluster shifts there is no single
    central distribution to evaluate on.

    Args:
        x: float images of shape (n, C, H, W); the training pool (or the whole pool in
            "seed_pool_80_20" mode). Cast to float32 in the output.
        y: int labels of shape (n,).
        shift: "rotation" (covariate shift, k·90°) or "label" (concept shift, y + k mod C).
        rng: Source of all randomness.
        cluster_sizes: Clients per cluster; cluster 0 is the minority in the default
            (3, 6, 6, 6) of the paper.
        num_classes: Number of classes C; default max(labels) + 1.
        samples_per_client: Records per client taken from `x` (train + test in
            "seed_pool_80_20", train only in "official_train_test"); default
            len(x) // num_clients, e.g. 60000 // 21 = 2857 for MNIST (§6.9).
        test_fraction: Local test fraction in [0, 1) ("seed_pool_80_20" only); the count
            is round(f·N) as in `split_train_test`, e.g. 571 of 2857.
        split_mode: One of `SPLIT_MODES`.
        x_test, y_test: The official test set ("official_train_test" only).
        test_samples_per_client: Test records per client from `x_test` ("official_train_test"
            only); default len(x_test) // num_clients.
        shuffle_clients: Randomly permute the client↔cluster mapping (§6.10 [REC]).
        name: Source dataset name; the result is named f"{name}_{shift}".

    Returns:
        `ClusteredFederated(dataset, clusters)`.

    Raises:
        ValueError: On malformed arrays or out-of-range arguments, e.g. rotation of
            non-square images, more rotation clusters than the 4 distinct quarter turns,
            more label clusters than classes, or too few records.
        TypeError: If `rng` is not a `numpy.random.Generator`.
    """
    check_rng(rng)
    sizes, images, labels, test_set, num_classes = _check_cluster_shift_args(
        x,
        y,
        shift=shift,
        cluster_sizes=cluster_sizes,
        num_classes=num_classes,
        split_mode=split_mode,
        x_test=x_test,
        y_test=y_test,
        test_samples_per_client=test_samples_per_client,
    )
    clusters = assign_clusters(sizes, rng, shuffle=shuffle_clients)
    num_clients = len(clusters)
    per_client = _per_client("samples_per_client", samples_per_client, len(images), num_clients)
    if test_set is None:
        sources, train, test = _pool_80_20_shards(
            images, labels, num_clients, per_client, test_fraction, rng
        )
    else:
        sources, train, test = _official_shards(
            images, labels, *test_set, num_clients, per_client, test_samples_per_client, rng
        )
    x_pool, y_pool = _shifted_pool(sources, clusters, shift, num_classes, images.shape[1:])
    dataset = _pooled_dataset(f"{name}_{shift}", num_classes, x_pool, y_pool, train, test)
    return ClusteredFederated(dataset, clusters)


#: Where a block of the pool comes from: (images, labels, indices of the records taken).
_Source = tuple[np.ndarray, np.ndarray, np.ndarray]


def _check_cluster_shift_args(
    x: np.ndarray,
    y: np.ndarray,
    *,
    shift: str,
    cluster_sizes: Sequence[int],
    num_classes: int | None,
    split_mode: str,
    x_test: np.ndarray | None,
    y_test: np.ndarray | None,
    test_samples_per_client: int | None,
) -> tuple[tuple[int, ...], np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None, int]:
    """`make_cluster_shift`'s arguments checked, before any randomness is drawn.

    Returns:
        (cluster sizes, images, labels, (test images, test labels) or None outside
        "official_train_test", num_classes resolved).
    """
    if shift not in SHIFTS:
        raise ValueError(f"shift must be one of {SHIFTS}, got {shift!r}")
    if split_mode not in SPLIT_MODES:
        raise ValueError(f"split_mode must be one of {SPLIT_MODES}, got {split_mode!r}")
    sizes = _check_cluster_sizes(cluster_sizes)
    images, labels = _check_images("x", x, y)
    test_set = None
    if split_mode == "official_train_test":
        if x_test is None or y_test is None:
            raise ValueError("split_mode='official_train_test' needs x_test and y_test")
        test_set = _check_images("x_test", x_test, y_test)
        if test_set[0].shape[1:] != images.shape[1:]:
            raise ValueError(
                f"x_test images have shape {test_set[0].shape[1:]}, x has {images.shape[1:]}"
            )
    elif x_test is not None or y_test is not None or test_samples_per_client is not None:
        raise ValueError("x_test, y_test and test_samples_per_client need official_train_test")
    all_labels = labels if test_set is None else np.r_[labels, test_set[1]]
    inferred = int(all_labels.max()) + 1 if all_labels.size else 1
    num_classes = inferred if num_classes is None else check_int("num_classes", num_classes, 1)
    if inferred > num_classes:
        raise ValueError(f"labels must be < num_classes={num_classes}, got {inferred - 1}")
    _check_shift_fits(shift, len(sizes), images.shape, num_classes)
    return sizes, images, labels, test_set, num_classes


def _check_shift_fits(
    shift: str, num_clusters: int, image_shape: tuple[int, ...], num_classes: int
) -> None:
    """Every cluster must receive a distinct shift."""
    if shift == "rotation":
        # np.rot90 has only 4 distinct angles: a 5th cluster would repeat cluster 0's
        # distribution (the authors' code rotates by k·360/M instead, §6.10, which for
        # M = 4 is the same k·90°).
        if num_clusters > 4:
            raise ValueError(f"rotation supports at most 4 clusters, got {num_clusters}")
        if num_clusters > 1 and image_shape[-1] != image_shape[-2]:
            raise ValueError(f"rotation needs square images, got shape {image_shape[1:]}")
    elif num_clusters > num_classes:
        raise ValueError(
            f"label shift supports at most num_classes={num_classes} clusters, got {num_clusters}"
        )


def _pool_80_20_shards(
    images: np.ndarray,
    labels: np.ndarray,
    num_clients: int,
    per_client: int,
    test_fraction: float,
    rng: np.random.Generator,
) -> tuple[list[_Source], list[np.ndarray], list[np.ndarray]]:
    """ "seed_pool_80_20": one shard of the pool per client, split locally into train/test.

    Returns:
        (sources, train, test): the pool's blocks in client order, and each client's
        train and test positions in the pool.
    """
    shards = _equal_shards(len(images), num_clients, per_client, rng)
    sources = [(images, labels, shard) for shard in shards]
    positions = np.arange(num_clients * per_client, dtype=np.int64)
    parts = list(positions.reshape(num_clients, per_client))
    train, test = split_train_test(parts, test_fraction, rng)
    return sources, train, test


def _official_shards(
    images: np.ndarray,
    labels: np.ndarray,
    test_images: np.ndarray,
    test_labels: np.ndarray,
    num_clients: int,
    per_client: int,
    test_samples_per_client: int | None,
    rng: np.random.Generator,
) -> tuple[list[_Source], list[np.ndarray], list[np.ndarray]]:
    """ "official_train_test": train shards of (x, y), then test shards of (x_test, y_test).

    Returns:
        (sources, train, test) as `_pool_80_20_shards`: the train blocks of all clients
        come first in the pool, then their test blocks.
    """
    per_test = _per_client(
        "test_samples_per_client", test_samples_per_client, len(test_images), num_clients
    )
    train_shards = _equal_shards(len(images), num_clients, per_client, rng)
    test_shards = _equal_shards(len(test_images), num_clients, per_test, rng)
    sources = [(images, labels, s) for s in train_shards]
    sources += [(test_images, test_labels, s) for s in test_shards]
    offset = num_clients * per_client
    train = [np.arange(c * per_client, (c + 1) * per_client) for c in range(num_clients)]
    test = [
        np.arange(offset + c * per_test, offset + (c + 1) * per_test) for c in range(num_clients)
    ]
    return sources, train, test


def _shifted_pool(
    sources: Sequence[_Source],
    clusters: np.ndarray,
    shift: str,
    num_classes: int,
    record_shape: tuple[int, ...],
) -> tuple[np.ndarray, np.ndarray]:
    """(x_pool, y_pool): every block's records, transformed by its client's cluster shift."""
    # The pool holds each client's records once, already transformed by its cluster's
    # shift; block b (client b mod n) fills rows [start_b, start_b + len(block)). It is
    # preallocated so that a large dataset (CIFAR10) is copied only once.
    num_clients = len(clusters)
    total = sum(len(idx) for _, _, idx in sources)
    x_pool = np.empty((total, *record_shape), dtype=np.float32)
    y_pool = np.empty(total, dtype=np.int64)
    start = 0
    for block, (src_x, src_y, idx) in enumerate(sources):
        k = int(clusters[block % num_clients])
        stop = start + len(idx)
        x_pool[start:stop] = rotate_images(src_x[idx], k) if shift == "rotation" else src_x[idx]
        y_pool[start:stop] = (
            shift_labels(src_y[idx], k, num_classes) if shift == "label" else src_y[idx]
        )
        start = stop
    return x_pool, y_pool


def _pooled_dataset(
    name: str,
    num_classes: int,
    x_pool: np.ndarray,
    y_pool: np.ndarray,
    train: Sequence[np.ndarray],
    test: Sequence[np.ndarray],
) -> FederatedDataset:
    """The `FederatedDataset` of the pool, whose central test set is the union of the
    client test splits: with per-cluster shifts there is no single central distribution."""
    train = [np.asarray(t, dtype=np.int64) for t in train]
    test = [np.asarray(t, dtype=np.int64) for t in test]
    test_all = np.concatenate(test) if test else np.empty(0, np.int64)
    return FederatedDataset(
        name=name,
        num_classes=num_classes,
        input_shape=tuple(int(d) for d in x_pool.shape[1:]),
        x=x_pool,
        y=y_pool,
        client_train=tuple(train),
        client_test=tuple(test),
        x_test=x_pool[test_all],
        y_test=y_pool[test_all],
    )


def make_rotation_clusters(
    x: np.ndarray, y: np.ndarray, *, rng: np.random.Generator, **kwargs: object
) -> ClusteredFederated:
    """Covariate shift (App. A): cluster k's images rotated by k·90°.

    Shorthand for `make_cluster_shift(x, y, shift="rotation", rng=rng, **kwargs)`.
    """
    return make_cluster_shift(x, y, shift="rotation", rng=rng, **kwargs)  # type: ignore[arg-type]


def make_label_shift_clusters(
    x: np.ndarray, y: np.ndarray, *, rng: np.random.Generator, **kwargs: object
) -> ClusteredFederated:
    """Concept shift (App. A): cluster k's labels mapped to (y + k) mod C.

    Shorthand for `make_cluster_shift(x, y, shift="label", rng=rng, **kwargs)`.
    """
    return make_cluster_shift(x, y, shift="label", rng=rng, **kwargs)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, eq=False)
class ClusteredDataset(FederatedDataset):
    """A `FederatedDataset` that knows each client's true cluster s(i).

    `clusters[i]` is the cluster of client i (cluster k got shift k; see
    `raydpfl.data.cluster_shift`). Used by the oracle and the clustering-accuracy
    diagnostics only.
    """

    clusters: tuple[int, ...] = ()


def true_clusters(dataset: FederatedDataset) -> np.ndarray | None:
    """s(i) when the dataset carries it (`ClusteredDataset`), else None."""
    clusters = getattr(dataset, "clusters", ())
    return np.asarray(clusters, dtype=np.int64) if len(clusters) else None
