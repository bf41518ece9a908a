"""Splitting a centralised dataset among federated clients.

Every partitioner returns one sorted int64 index array per client; the arrays are
disjoint and hold only indices into the input. All randomness comes from the
`numpy.random.Generator` passed in, so equal seeds give equal partitions.

Real-valued (regression) targets are partitioned by their label quantiles:
`partition_dirichlet` (and `partition_stats`) first bin a floating-point `labels` array into
`LABEL_BINS` = 10 quantile bins (`quantile_bins`) and treat the bins as classes, so the
per-class Dirichlet scheme skews each client's target distribution (DPFL-BCS spec §11.2:
"Lending Club is regression, so bin the label into 10 quantile bins and apply the per-class
scheme to the bins"). The other label-based partitioners accept class labels only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydpfl.data._checks import check_int, check_labels, check_nonnegative, check_rng

__all__ = [
    "LABEL_BINS",
    "SPLIT_ROUNDINGS",
    "PartitionStats",
    "partition_dirichlet",
    "partition_dirichlet_capped",
    "partition_iid",
    "partition_shards",
    "partition_stats",
    "quantile_bins",
    "split_train_test",
]

_DIRICHLET_MAX_TRIES = 1000
SPLIT_ROUNDINGS = ("nearest", "floor_train")
_SUMMARY_MAX_CLIENT_ROWS = 10
#: Number of quantile bins that stand for classes when the targets are real values.
LABEL_BINS = 10


def quantile_bins(values: np.ndarray, num_bins: int = LABEL_BINS) -> np.ndarray:
    """Bin ids in [0, num_bins) of real values by their empirical quantiles.

    The cut points are the i/num_bins quantiles (i = 1..num_bins−1) of `values`; a value
    goes to the number of cut points at or below it, so each bin holds about
    len(values)/num_bins values (ties can only make bins unequal, never leave a value
    out). Returns an int64 array shaped like `values`.
    """
    num_bins = check_int("num_bins", num_bins, 1)
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or not np.all(np.isfinite(v)):
        raise ValueError(f"values must be a 1-D array of finite reals, got shape {v.shape}")
    if v.size == 0:
        return np.zeros(0, dtype=np.int64)
    cuts = np.quantile(v, np.arange(1, num_bins) / num_bins)
    return np.searchsorted(cuts, v, side="right").astype(np.int64)


def _strata(labels: object) -> object:
    """Class labels as they are; real-valued targets as their quantile bins."""
    array = np.asarray(labels)
    if array.size and np.issubdtype(array.dtype, np.floating):
        return quantile_bins(array)
    return labels


def _sorted_parts(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _check_clients_fit(num_clients: int, num_samples: int) -> None:
    if num_clients > num_samples:
        raise ValueError(
            f"num_clients ({num_clients}) must be <= the number of samples ({num_samples})"
        )


def partition_iid(
    num_samples: int, num_clients: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Shuffles all indices and splits them as evenly as possible.

    Args:
        num_samples: Number of samples to distribute; >= num_clients.
        num_clients: Number of clients; >= 1.
        rng: Source of randomness.

    Returns:
        `num_clients` sorted int64 index arrays covering range(num_samples) exactly
        once; sizes differ by at most 1.

    Raises:
        ValueError: If an argument is out of range.
    """
    num_samples = check_int("num_samples", num_samples, 0)
    num_clients = check_int("num_clients", num_clients, 1)
    check_rng(rng)
    _check_clients_fit(num_clients, num_samples)
    return _sorted_parts(np.array_split(rng.permutation(num_samples), num_clients))


def _dirichlet_draw(
    by_class: list[np.ndarray], num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for members in by_class:
        members = rng.permutation(members)
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        # Clip guards against a cumulative sum that rounds a hair above 1.
        cuts = np.clip(np.cumsum(proportions)[:-1] * len(members), 0, len(members))
        cuts = cuts.astype(np.int64)
        for client, chunk in enumerate(np.split(members, cuts)):
            shares[client].append(chunk)
    return [np.concatenate(s) if s else np.empty(0, np.int64) for s in shares]


def _redraw_until_large_enough(
    name: str,
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_samples_per_client: int,
    draw: Callable[[list[np.ndarray], int, float, int], list[np.ndarray] | None],
) -> list[np.ndarray]:
    """Checks a Dirichlet partitioner's arguments, then repeats `draw(by_class, num_clients,
    alpha, num_samples)` (None = retry) until every client has `min_samples_per_client`."""
    labels = check_labels(labels)
    num_clients = check_int("num_clients", num_clients, 1)
    alpha = check_nonnegative("alpha", alpha)
    if alpha == 0:
        raise ValueError("alpha must be a finite real number > 0, got 0")
    check_rng(rng)
    min_samples_per_client = check_int("min_samples_per_client", min_samples_per_client, 0)
    _check_clients_fit(num_clients, len(labels))
    if num_clients * min_samples_per_client > len(labels):
        raise ValueError(
            f"min_samples_per_client ({min_samples_per_client}) x num_clients "
            f"({num_clients}) exceeds the {len(labels)} samples; lower either"
        )
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(_DIRICHLET_MAX_TRIES):
        parts = draw(by_class, num_clients, alpha, len(labels))
        if parts is not None and min(len(p) for p in parts) >= min_samples_per_client:
            return _sorted_parts(parts)
    raise ValueError(
        f"{name}: no draw in {_DIRICHLET_MAX_TRIES} tries gave every client "
        f">= {min_samples_per_client} samples; increase alpha, lower num_clients or "
        "lower min_samples_per_client"
    )


def partition_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_samples_per_client: int = 2,
) -> list[np.ndarray]:
    """Label-skewed partition with per-class Dirichlet proportions.

    The scheme of Hsu et al. (2019) as used in FL benchmarks: for each class, draw
    p ~ Dir(alpha * 1_K) over the K clients and split that class's shuffled indices at
    the cumulative proportions. The whole draw is repeated (continuing the same rng) up
    to 1000 times until every client holds at least `min_samples_per_client` samples.
    Small alpha (e.g. 0.1) gives each client few classes; large alpha (e.g. 100)
    approaches an IID split.

    Args:
        labels: 1-D non-negative integer class labels (or real-valued targets, split by
            their quantile bins); its length is the sample count.
        num_clients: Number of clients; >= 1.
        alpha: Dirichlet concentration; > 0.
        rng: Source of randomness.
        min_samples_per_client: Minimum client size to accept a draw; >= 0.

    Returns:
        `num_clients` sorted int64 index arrays covering every sample exactly once.

    Raises:
        ValueError: If an argument is out of range or no draw within 1000 tries meets
            `min_samples_per_client`.
    """
    return _redraw_until_large_enough(
        "partition_dirichlet",
        _strata(labels),
        num_clients,
        alpha,
        rng,
        min_samples_per_client,
        lambda by_class, n, a, total: _dirichlet_draw(by_class, n, a, rng),
    )


def _capped_dirichlet_draw(
    by_class: list[np.ndarray],
    num_clients: int,
    alpha: float,
    num_samples: int,
    rng: np.random.Generator,
) -> list[np.ndarray] | None:
    """One pass of the capped scheme; None if a class found no client to take it."""
    shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients, dtype=np.int64)
    for members in by_class:
        members = rng.permutation(members)
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        # The cap: a client already holding >= num_samples / num_clients gets nothing
        # (integer form of PFLlib's `len(idx_j) < N / num_clients`).
        proportions = np.where(sizes * num_clients < num_samples, proportions, 0.0)
        total = proportions.sum()
        if not total > 0:
            # Every client under the cap drew an exact 0 (possible at tiny alpha);
            # PFLlib would divide 0 by 0 here. Treat the draw as failed.
            return None
        cumulative = np.cumsum(proportions / total)
        # Trailing zero-proportion (capped) clients must get nothing, even when the
        # cumulative sum rounds to a hair below 1.
        cumulative[np.flatnonzero(proportions)[-1] :] = 1.0
        cuts = np.clip(cumulative[:-1] * len(members), 0, len(members)).astype(np.int64)
        for client, chunk in enumerate(np.split(members, cuts)):
            shares[client].append(chunk)
            sizes[client] += len(chunk)
    return [np.concatenate(s) if s else np.empty(0, np.int64) for s in shares]


def partition_dirichlet_capped(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_samples_per_client: int = 10,
) -> list[np.ndarray]:
    """Label-skewed Dirichlet partition with PFLlib's per-client size cap.

    The scheme of PFLlib's `separate_data(partition="dir")`, which the ALI-DPFL
    experiments use (specs/ali-dpfl.md §6.1, ambiguity A20). With |D| = len(labels)
    and N = num_clients, classes are processed in ascending label order; for each:

    1. shuffle the class's indices and draw p ~ Dir(alpha * 1_N);
    2. zero p_i for every client i that already holds >= |D| / N samples (the cap);
    3. renormalise p and split the shuffled indices at floor(cumsum(p) * n_class).

    The whole draw is repeated (continuing the same rng) until every client holds at
    least `min_samples_per_client` samples (PFLlib/ALI-DPFL: 10), at most 1000 times.

    What the cap guarantees: a client receives a chunk of a class only while it holds
    fewer than |D| / N samples, so a client at or over the cap never grows again and
    every client's final size is < |D| / N + (size of the last class chunk it
    received) <= |D| / N + (largest class size). Equivalently, for each client the
    samples of all classes before its last non-empty class number < |D| / N.

    Differences from PFLlib: the randomness is this numpy `Generator`, not the legacy
    global `np.random` seeded with 1, so the draws (and the resulting client sizes)
    differ from PFLlib's seed-1 partitions. A trailing capped client is also never
    handed a stray sample when the cumulative proportions round a hair below 1, and a
    draw in which every uncapped client gets an exact-zero proportion is retried
    (PFLlib would divide by zero).

    Args:
        labels: 1-D non-negative integer class labels; its length is the sample count.
        num_clients: Number of clients; >= 1.
        alpha: Dirichlet concentration; > 0 (ALI-DPFL uses 0.05, 0.5 and 1).
        rng: Source of randomness.
        min_samples_per_client: Minimum client size to accept a draw; >= 0.

    Returns:
        `num_clients` sorted int64 index arrays covering every sample exactly once.

    Raises:
        ValueError: If an argument is out of range or no draw within 1000 tries meets
            `min_samples_per_client`.
    """
    return _redraw_until_large_enough(
        "partition_dirichlet_capped",
        labels,
        num_clients,
        alpha,
        rng,
        min_samples_per_client,
        lambda by_class, n, a, total: _capped_dirichlet_draw(by_class, n, a, total, rng),
    )


def partition_shards(
    labels: np.ndarray,
    num_clients: int,
    shards_per_client: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Pathological non-IID partition of McMahan et al. (2017).

    Samples are sorted by label (ties broken by a random shuffle), cut into
    num_clients * shards_per_client contiguous shards of equal size (sizes differ by at
    most 1 when the count does not divide evenly, so every sample is used) and the
    shards are dealt to clients at random. A client therefore sees at most
    `shards_per_client` labels whenever class sizes are multiples of the shard size; a
    shard may straddle two labels otherwise.

    Args:
        labels: 1-D non-negative integer class labels; its length is the sample count.
        num_clients: Number of clients; >= 1.
        shards_per_client: Shards per client; >= 1.
        rng: Source of randomness.

    Returns:
        `num_clients` sorted int64 index arrays covering every sample exactly once.

    Raises:
        ValueError: If an argument is out of range or there are fewer samples than
            shards.
    """
    labels = check_labels(labels)
    num_clients = check_int("num_clients", num_clients, 1)
    shards_per_client = check_int("shards_per_client", shards_per_client, 1)
    check_rng(rng)
    num_shards = num_clients * shards_per_client
    if len(labels) < num_shards:
        raise ValueError(
            f"num_clients x shards_per_client ({num_shards} shards) exceeds the "
            f"{len(labels)} samples; lower num_clients or shards_per_client"
        )
    shuffled = rng.permutation(len(labels))
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(order, num_shards)
    deal = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return _sorted_parts([np.concatenate([shards[s] for s in row]) for row in deal])


def split_train_test(
    parts: Sequence[np.ndarray],
    test_fraction: float,
    rng: np.random.Generator,
    *,
    rounding: str = "nearest",
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Randomly splits each client's indices into a train and a test part.

    With f = test_fraction and n a client's size, the test count is
    - rounding="nearest" (default): round(f * n), halves rounded up;
    - rounding="floor_train": n - floor((1 - f) * n), i.e. train = floor((1 - f) * n).
      This is sklearn's `train_test_split(train_size=1 - f)` as PFLlib's generator
      calls it (train_size 0.75, so train = floor(0.75 n); specs/ali-dpfl.md §6.1).
      The two differ whenever f * n has a fractional part in (0, 0.5): for f = 0.25,
      n = 9 "nearest" gives 7 train / 2 test and "floor_train" 6 / 3.

    Either count is then clamped so that any client with n >= 2 keeps at least one
    train and, when test_fraction > 0, at least one test sample. A client with a single
    sample keeps it for training (sklearn would raise there instead).

    Args:
        parts: One 1-D integer index array per client.
        test_fraction: Fraction held out per client, in [0, 1).
        rng: Source of randomness.
        rounding: "nearest" or "floor_train", as above.

    Returns:
        `(train_parts, test_parts)`, lists of sorted int64 arrays aligned with `parts`;
        with test_fraction == 0 every test array is empty.

    Raises:
        ValueError: If `test_fraction` is outside [0, 1), `rounding` is unknown or a
            part is not a 1-D integer array.
    """
    test_fraction = check_nonnegative("test_fraction", test_fraction)
    if test_fraction >= 1:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    if rounding not in SPLIT_ROUNDINGS:
        raise ValueError(f"rounding must be one of {SPLIT_ROUNDINGS}, got {rounding!r}")
    check_rng(rng)
    train_parts, test_parts = [], []
    for client, part in enumerate(parts):
        indices = np.asarray(part)
        is_integer = np.issubdtype(indices.dtype, np.integer) or indices.size == 0
        if indices.ndim != 1 or not is_integer:
            raise ValueError(f"parts[{client}] must be a 1-D integer index array")
        n = len(indices)
        if rounding == "nearest":
            n_test = int(np.floor(test_fraction * n + 0.5))
        else:
            n_test = n - int(np.floor((1 - test_fraction) * n))
        if test_fraction > 0 and n >= 2:
            n_test = min(max(n_test, 1), n - 1)
        elif n < 2:
            n_test = 0
        shuffled = rng.permutation(indices.astype(np.int64))
        test_parts.append(np.sort(shuffled[:n_test]))
        train_parts.append(np.sort(shuffled[n_test:]))
    return train_parts, test_parts


@dataclass(frozen=True, eq=False)
class PartitionStats:
    """Per-client label counts of a partition and summary figures.

    Attributes:
        counts: (num_clients, num_classes) int64 matrix of label counts.
        sizes: (num_clients,) int64 client sizes.
        min_size: Smallest client size.
        median_size: Median client size.
        max_size: Largest client size.
        mean_classes_per_client: Mean number of distinct labels per client.
    """

    counts: np.ndarray
    sizes: np.ndarray
    min_size: int
    median_size: float
    max_size: int
    mean_classes_per_client: float

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return int(self.counts.shape[0])

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return int(self.counts.shape[1])

    def summary(self) -> str:
        """Returns a short table; per-client rows only when there are few clients."""
        classes = (self.counts > 0).sum(axis=1)
        lines = [
            f"{self.num_clients} clients, {int(self.sizes.sum())} samples, "
            f"{self.num_classes} classes",
            f"{'':<18}{'min':>8} {'median':>8} {'max':>8} {'mean':>8}",
            f"{'samples/client':<18}{self.min_size:>8} {self.median_size:>8.1f} "
            f"{self.max_size:>8} {float(self.sizes.mean()):>8.1f}",
            f"{'classes/client':<18}{int(classes.min()):>8} "
            f"{float(np.median(classes)):>8.1f} {int(classes.max()):>8} "
            f"{self.mean_classes_per_client:>8.2f}",
        ]
        if self.num_clients <= _SUMMARY_MAX_CLIENT_ROWS:
            for client in range(self.num_clients):
                counts = " ".join(str(int(c)) for c in self.counts[client])
                lines.append(f"client {client:<4} n={int(self.sizes[client]):<7} [{counts}]")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-serialisable dict (plain Python ints, floats and lists)."""
        return {
            "num_clients": self.num_clients,
            "num_classes": self.num_classes,
            "counts": self.counts.tolist(),
            "sizes": self.sizes.tolist(),
            "min_size": self.min_size,
            "median_size": self.median_size,
            "max_size": self.max_size,
            "mean_classes_per_client": self.mean_classes_per_client,
        }


def partition_stats(
    labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int
) -> PartitionStats:
    """Counts the labels held by each client.

    Args:
        labels: 1-D integer labels in [0, num_classes) that `parts` index into; real-valued
            targets are counted by their `LABEL_BINS` quantile bins (the "classes").
        parts: One 1-D integer index array per client; at least one.
        num_classes: Number of classes; >= 1.

    Returns:
        The `PartitionStats` of the partition.

    Raises:
        ValueError: If `parts` is empty, an index is out of range or a label is
            >= num_classes.
    """
    if np.issubdtype(np.asarray(labels).dtype, np.floating):  # regression: quantile bins
        labels, num_classes = quantile_bins(labels), max(int(num_classes), LABEL_BINS)
    labels = check_labels(labels)
    num_classes = check_int("num_classes", num_classes, 1)
    if len(parts) == 0:
        raise ValueError("parts must hold at least one client index array")
    if labels.size and labels.max() >= num_classes:
        raise ValueError(f"labels must be < num_classes ({num_classes}), got {labels.max()}")
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for client, part in enumerate(parts):
        indices = np.asarray(part, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(labels)):
            raise ValueError(f"parts[{client}] has indices outside [0, {len(labels)})")
        counts[client] = np.bincount(labels[indices], minlength=num_classes)
    sizes = counts.sum(axis=1)
    return PartitionStats(
        counts=counts,
        sizes=sizes,
        min_size=int(sizes.min()),
        median_size=float(np.median(sizes)),
        max_size=int(sizes.max()),
        mean_classes_per_client=float((counts > 0).sum(axis=1).mean()),
    )
