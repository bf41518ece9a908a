"""More partitioners, as users know them from Flower Datasets: natural ids, k classes per
client, size skew and Dirichlet labels with skewed sizes.

Each is a pure function of its arguments and a `numpy.random.Generator` (equal seeds give
equal partitions) and returns one sorted int64 index array per client. The arrays are
disjoint (each record at most once; `natural` and `k_classes` may leave records out, as
documented) and every client holds at least `min_samples_per_client` records.

| kind | Flower Datasets' counterpart | what a client gets |
| --- | --- | --- |
| `partition_natural` | `NaturalIdPartitioner` | the records of one natural id (a writer) |
| `partition_k_classes` | `PathologicalPartitioner` | records of exactly k labels |
| `partition_size_skew` | `SizePartitioner` (random sizes) | IID labels, skewed size |
| `partition_dirichlet_sizes` | `InnerDirichletPartitioner` | Dir(α) labels, skewed size |
"""

from __future__ import annotations

import numpy as np

from raydpfl.data._checks import check_int, check_labels, check_nonnegative, check_rng

__all__ = [
    "SIZE_DISTRIBUTIONS",
    "client_sizes",
    "partition_dirichlet_sizes",
    "partition_k_classes",
    "partition_natural",
    "partition_size_skew",
]

#: How `client_sizes` draws the client sizes.
SIZE_DISTRIBUTIONS = ("lognormal", "power_law")
_MAX_TRIES = 1000


def _sorted(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _check_positive(name: str, value: object) -> float:
    value = check_nonnegative(name, value)
    if value == 0:
        raise ValueError(f"{name} must be a finite real number > 0, got 0")
    return value


def partition_natural(
    client_ids: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    min_samples_per_client: int = 2,
) -> list[np.ndarray]:
    """One client per natural id (e.g. a LEAF FEMNIST writer): Flower's NaturalIdPartitioner.

    The eligible ids are those with at least `min_samples_per_client` records. With
    `num_clients` equal to their number, client j holds the records of the j-th smallest
    eligible id. With fewer clients (the subset rule), `num_clients` eligible ids are drawn
    uniformly without replacement and assigned in ascending id order; the records of the
    other ids belong to no client. More clients than eligible ids is an error.

    Args:
        client_ids: 1-D non-negative integer natural id of every record.
        num_clients: Number of clients; in [1, number of eligible ids].
        rng: Source of randomness (used only by the subset rule).
        min_samples_per_client: Fewest records an id needs to become a client; >= 0.

    Returns:
        `num_clients` sorted int64 index arrays, each the records of one id.

    Raises:
        ValueError: An argument is out of range, or fewer ids than clients are eligible.
    """
    ids = check_labels(client_ids)
    num_clients = check_int("num_clients", num_clients, 1)
    check_rng(rng)
    min_samples_per_client = check_int("min_samples_per_client", min_samples_per_client, 0)
    unique, counts = np.unique(ids, return_counts=True)
    eligible = unique[counts >= max(min_samples_per_client, 1)]
    if num_clients > len(eligible):
        raise ValueError(
            f"num_clients ({num_clients}) must be <= the {len(eligible)} natural ids with "
            f">= {min_samples_per_client} records (of {len(unique)} ids); lower num_clients "
            "or min_samples_per_client"
        )
    if num_clients < len(eligible):
        eligible = np.sort(rng.choice(eligible, size=num_clients, replace=False))
    order = np.argsort(ids, kind="stable")
    starts = np.searchsorted(ids[order], eligible, side="left")
    ends = np.searchsorted(ids[order], eligible, side="right")
    return _sorted([order[s:e] for s, e in zip(starts, ends, strict=True)])


def partition_k_classes(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    rng: np.random.Generator,
    min_samples_per_client: int = 2,
) -> list[np.ndarray]:
    """Pathological label skew: every client holds exactly `classes_per_client` labels.

    NIID-Bench's "#C=k" (Li et al. 2022; Flower's PathologicalPartitioner with
    `class_assignment_mode="first-deterministic"`): client i's first label is the
    (i mod C)-th of the C labels present, so every label is held whenever
    num_clients >= C; its other k − 1 labels are drawn uniformly without replacement from
    the rest. Each label's shuffled records are then split as evenly as possible among the
    clients holding it. Records of a label no client holds (only when num_clients · k < C)
    belong to no client. The draw of labels is repeated (continuing the same rng) up to
    1000 times until every client holds at least `min_samples_per_client` records and every
    label is held by at most as many clients as it has records.

    Args:
        labels: 1-D non-negative integer class labels; its length is the sample count.
        num_clients: Number of clients; >= 1.
        classes_per_client: k, in [1, number of distinct labels].
        rng: Source of randomness.
        min_samples_per_client: Fewest records per client; >= 0.

    Returns:
        `num_clients` sorted int64 index arrays, each with records of exactly k labels.

    Raises:
        ValueError: An argument is out of range or no draw in 1000 tries fits.
    """
    labels = check_labels(labels)
    num_clients = check_int("num_clients", num_clients, 1)
    k = check_int("classes_per_client", classes_per_client, 1)
    check_rng(rng)
    min_samples_per_client = check_int("min_samples_per_client", min_samples_per_client, 0)
    classes = np.unique(labels)
    if k > len(classes):
        raise ValueError(
            f"classes_per_client ({k}) must be <= the {len(classes)} labels in the data"
        )
    if num_clients * max(min_samples_per_client, 1) > len(labels):
        raise ValueError(
            f"min_samples_per_client ({min_samples_per_client}) x num_clients "
            f"({num_clients}) exceeds the {len(labels)} samples; lower either"
        )
    by_class = [np.flatnonzero(labels == c) for c in classes]
    num_labels = len(classes)
    for _ in range(_MAX_TRIES):
        held = np.zeros((num_clients, num_labels), dtype=bool)
        for client in range(num_clients):
            first = client % num_labels
            others = np.delete(np.arange(num_labels), first)
            held[client, first] = True
            held[client, rng.choice(others, size=k - 1, replace=False)] = True
        holders = held.sum(axis=0)
        if np.any(holders > np.array([len(m) for m in by_class])):
            continue  # some holder of a small class would get no record of it
        shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c, members in enumerate(by_class):
            owners = np.flatnonzero(held[:, c])
            if owners.size == 0:
                continue
            chunks = np.array_split(rng.permutation(members), owners.size)
            for owner, chunk in zip(owners, chunks, strict=True):
                shares[owner].append(chunk)
        parts = [np.concatenate(s) for s in shares]
        if min(len(p) for p in parts) >= min_samples_per_client:
            return _sorted(parts)
    raise ValueError(
        f"partition_k_classes: no draw in {_MAX_TRIES} tries gave every client "
        f">= {min_samples_per_client} samples of {k} labels; lower num_clients, "
        "classes_per_client or min_samples_per_client"
    )


def client_sizes(
    num_samples: int,
    num_clients: int,
    rng: np.random.Generator,
    distribution: str = "lognormal",
    sigma: float = 1.0,
    exponent: float = 2.0,
    min_size: int = 2,
) -> np.ndarray:
    """Client sizes summing to `num_samples`, each >= `min_size`, skewed at random.

    Weights w_1..w_K are drawn i.i.d.: `lognormal`: w = exp(N(0, sigma²)), so log w has
    standard deviation `sigma`; `power_law`: a Pareto law with shape `exponent` and scale 1
    (P(w > t) = t^−exponent, t >= 1), so log w ~ Exp(exponent), standard deviation
    1 / exponent. Client i then gets min_size + its share w_i / Σw of the other
    num_samples − K·min_size records, rounded down, the leftover records going one each to
    the largest fractional parts (ties to the lower index). When min_size is small next to
    the mean size, the sizes' log-variance is close to that of the weights.

    Returns:
        An int64 array of K sizes.

    Raises:
        ValueError: An argument is out of range or K·min_size > num_samples.
    """
    num_samples = check_int("num_samples", num_samples, 0)
    num_clients = check_int("num_clients", num_clients, 1)
    check_rng(rng)
    min_size = check_int("min_samples_per_client", min_size, 0)
    if distribution not in SIZE_DISTRIBUTIONS:
        raise ValueError(
            f"size_distribution must be one of {SIZE_DISTRIBUTIONS}, got {distribution!r}"
        )
    if num_clients * max(min_size, 1) > num_samples:
        raise ValueError(
            f"min_samples_per_client ({min_size}) x num_clients ({num_clients}) exceeds "
            f"the {num_samples} samples; lower either"
        )
    if distribution == "lognormal":
        weights = rng.lognormal(0.0, _check_positive("size_sigma", sigma), num_clients)
    else:
        weights = rng.pareto(_check_positive("power_law_exponent", exponent), num_clients) + 1
    floor_size = max(min_size, 1)
    spare = num_samples - num_clients * floor_size
    raw = weights / weights.sum() * spare
    extra = np.floor(raw).astype(np.int64)
    leftover = spare - int(extra.sum())
    order = np.lexsort((np.arange(num_clients), -(raw - extra)))
    extra[order[:leftover]] += 1
    return floor_size + extra


def partition_size_skew(
    num_samples: int,
    num_clients: int,
    rng: np.random.Generator,
    distribution: str = "lognormal",
    sigma: float = 1.0,
    exponent: float = 2.0,
    min_samples_per_client: int = 2,
) -> list[np.ndarray]:
    """Quantity skew with IID labels: sizes from `client_sizes`, records shuffled and dealt.

    Args:
        num_samples: Number of records; every one goes to a client.
        num_clients: Number of clients; >= 1.
        rng: Source of randomness.
        distribution: "lognormal" or "power_law" (see `client_sizes`).
        sigma: Standard deviation of the log weights (lognormal); > 0.
        exponent: Pareto shape (power_law); > 0; log weights have std 1/exponent.
        min_samples_per_client: Fewest records per client; >= 0.

    Returns:
        `num_clients` sorted int64 index arrays covering range(num_samples) exactly once.
    """
    sizes = client_sizes(
        num_samples, num_clients, rng, distribution, sigma, exponent, min_samples_per_client
    )
    order = rng.permutation(num_samples)
    return _sorted(np.split(order, np.cumsum(sizes)[:-1]))


def partition_dirichlet_sizes(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    distribution: str = "lognormal",
    sigma: float = 1.0,
    exponent: float = 2.0,
    min_samples_per_client: int = 2,
) -> list[np.ndarray]:
    """Label skew and quantity skew together: Flower's InnerDirichletPartitioner.

    Client sizes come from `client_sizes` (so every record is used and every client holds
    at least `min_samples_per_client`); client i's label proportions are
    p_i ~ Dir(alpha · 1_C). The sizes are then filled in rounds: each client with room r_i
    asks for Multinomial(r_i, p_i restricted to the labels with records left,
    renormalised) records; a label asked for more than it has left grants its records to a
    uniformly random subset of the requests (multivariate hypergeometric). At least one
    label runs out in each round that leaves room, so at most C + 1 rounds are needed. A
    client whose p_i is zero on every label still available (possible at tiny alpha) asks
    in proportion to the records left.

    Args:
        labels: 1-D non-negative integer class labels; its length is the sample count.
        num_clients: Number of clients; >= 1.
        alpha: Dirichlet concentration; > 0.
        rng: Source of randomness.
        distribution, sigma, exponent: The size law (see `client_sizes`).
        min_samples_per_client: Fewest records per client; >= 0.

    Returns:
        `num_clients` sorted int64 index arrays covering every sample exactly once.
    """
    labels = check_labels(labels)
    num_clients = check_int("num_clients", num_clients, 1)
    alpha = _check_positive("alpha", alpha)
    check_rng(rng)
    sizes = client_sizes(
        len(labels), num_clients, rng, distribution, sigma, exponent, min_samples_per_client
    )
    classes = np.unique(labels)
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    left = np.array([len(m) for m in by_class], dtype=np.int64)
    taken = np.zeros(len(classes), dtype=np.int64)
    proportions = rng.dirichlet(np.full(len(classes), alpha), size=num_clients)
    room = sizes.copy()
    grants = np.zeros((num_clients, len(classes)), dtype=np.int64)
    while room.sum() > 0:
        open_labels = left > 0
        asks = np.zeros_like(grants)
        for client in np.flatnonzero(room > 0):
            p = np.where(open_labels, proportions[client], 0.0)
            if not p.sum() > 0:
                p = left.astype(np.float64)
            asks[client] = rng.multinomial(room[client], p / p.sum())
        for c in range(len(classes)):
            demand = asks[:, c]
            if demand.sum() > left[c]:
                demand = rng.multivariate_hypergeometric(demand, int(left[c]))
            grants[:, c] += demand
            room -= demand
            left[c] -= int(demand.sum())
    shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, members in enumerate(by_class):
        for client in np.flatnonzero(grants[:, c]):
            count = int(grants[client, c])
            shares[client].append(members[taken[c] : taken[c] + count])
            taken[c] += count
    return _sorted([np.concatenate(s) if s else np.empty(0, np.int64) for s in shares])
