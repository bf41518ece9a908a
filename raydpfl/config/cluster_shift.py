"""Clients in clusters with shifted data (`experiment.data.cluster_shift`): the clustered-FL
benchmark of IFCA and RC-DPFL (rotated or label-swapped clusters), a core data feature."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raydpfl.config._base import ConfigError, _check


def parse_cluster_sizes(text: str) -> tuple[int, ...]:
    """``"3,6,6,6"`` → (3, 6, 6, 6).

    Raises:
        ValueError: If an entry is not a positive integer or the list is empty.
    """
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p.isdigit() or int(p) < 1 for p in parts):
        raise ValueError(f"must be comma-separated positive integers like '3,6,6,6', got {text!r}")
    return tuple(int(p) for p in parts)


@dataclass(frozen=True, kw_only=True)
class ClusterShiftConfig:
    """Clients in clusters with shifted data (`experiment.data.cluster_shift`).

    ``none`` leaves the data as partitioned by `experiment.data.partition`. ``rotation``
    rotates every image of cluster k's clients by k·90° (covariate shift); ``label`` maps
    their labels y → (y + k) mod C (concept shift). Every client gets the same number of
    records; its train/test split follows `split_mode` (`experiment.data.client_test_fraction`
    is the local test share of ``seed_pool_80_20``). `experiment.data.num_clients` must
    equal the sum of `cluster_sizes`.
    """

    kind: Literal["none", "rotation", "label"] = "none"  # the shift (see above)
    cluster_sizes: str = "3,6,6,6"  # clients per cluster; cluster 0 is the minority
    # seed_pool_80_20: the train split cut into equal client shards, each split locally;
    # official_train_test: train shards from the official train split, test shards from
    # the official test split (the paper's FMNIST/CIFAR10 sizes).
    split_mode: Literal["seed_pool_80_20", "official_train_test"] = "seed_pool_80_20"
    samples_per_client: int | None = None  # null: as many as the pool allows
    test_samples_per_client: int | None = None  # official_train_test only
    shuffle_clients: bool = True  # random client↔cluster mapping (per data seed)

    def __post_init__(self) -> None:
        try:
            sizes = parse_cluster_sizes(self.cluster_sizes)
        except ValueError as e:
            raise ConfigError("cluster_sizes", str(e)) from None
        _check(
            self.kind != "rotation" or len(sizes) <= 4,
            "cluster_sizes",
            f"rotation has only 4 distinct angles, got {len(sizes)} clusters",
        )
        for name in ("samples_per_client", "test_samples_per_client"):
            value = getattr(self, name)
            _check(value is None or value >= 1, name, f"must be >= 1 or null, got {value}")
        _check(
            self.test_samples_per_client is None or self.split_mode == "official_train_test",
            "test_samples_per_client",
            "needs split_mode: official_train_test",
        )

    @property
    def sizes(self) -> tuple[int, ...]:
        """`cluster_sizes` as integers."""
        return parse_cluster_sizes(self.cluster_sizes)
