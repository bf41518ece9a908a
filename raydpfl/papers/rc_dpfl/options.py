"""Config of RC-DPFL and its baselines (issue 7; shared/specs/robust-clustering.md).

`NAMES` are the algorithm names this section serves; `MODEL_NAMES` the models it adds
to `experiment.model.name`. The options live under `experiment.algorithm.options` (or
their section `experiment.algorithm.rc_dpfl`); the cluster-structured data under
`experiment.data.cluster_shift` (`raydpfl.config.cluster_shift`, a core data feature).

Algorithms (all clients train every round; DP-SGD with Poisson rate b/|D_i| and
K·⌈|D_i|/b⌉ steps per round; σ calibrated per client when
`experiment.privacy.noise_multiplier` is null):

- ``rc_dpfl``: Algorithm 1 (full-batch round 1, GMM on the round-1 updates, rounds with
  assignments sampled from the GMM posteriors, then loss-based assignment), two-stage
  accounting;
- ``rc_dp_fedavg``: DP-FedAvg (one global model) with the same DP-SGD schedule;
- ``km_cdpfl``: k-means++ on each round's updates (myopic clustering);
- ``f_cdpfl``: IFCA-style loss-based clustering from M random initialisations;
- ``o_cdpfl``: the oracle, DP-FedAvg inside each true cluster;
- ``rc_local``: local DP-SGD only, one model per client;
- ``mr_mtl``: mean-regularised multi-task learning (personal models pulled to their mean).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raydpfl.config._base import _check

NAMES: tuple[str, ...] = (
    "rc_dpfl",
    "rc_dp_fedavg",
    "km_cdpfl",
    "f_cdpfl",
    "o_cdpfl",
    "rc_local",
    "mr_mtl",
)
MODEL_NAMES: tuple[str, ...] = ("rc_cnn", "rc_resnet18")


@dataclass(frozen=True, kw_only=True)
class RcDpflConfig:
    """RC-DPFL options (`experiment.algorithm.rc_dpfl`); defaults are the spec's [REC]s."""

    num_clusters: int = 4  # M (the paper assumes it known)
    # given: M = num_clusters; mss: M in 2..min(10, n-1) maximising the GMM's minimum
    # separation score on the round-1 updates (rc_dpfl only; §6.4).
    select_num_clusters: Literal["given", "mss"] = "given"
    batch_size: int = 32  # b: expected Poisson batch of DP-SGD in every round > 1
    local_epochs: int = 1  # K: each round runs K·⌈|D_i|/b⌉ DP-SGD steps
    # E_c: rounds trained with assignments sampled from the GMM (rounds 2..E_c+1);
    # null = int((1 - max GMM overlap)·E/2), the authors' rule (§6.7).
    gmm_stage_rounds: int | None = None
    gmm_feature_space: Literal["pca", "raw"] = "pca"  # GMM input (§6.5)
    d_pca: int = 2  # principal components kept (pca)
    scaler: Literal["minmax", "standard", "none"] = "minmax"  # pca scores' scaling
    # Cluster models after round 1: init = θ^init (Algorithm 1 as printed); pi_weighted =
    # θ^init + the π-weighted mean of the round-1 updates (post-processing, §6.2).
    round1_init: Literal["init", "pi_weighted"] = "init"
    # Loss-based assignment: none = raw argmin of train losses (the seed; listed in
    # unaccounted_releases); gumbel = exponential mechanism on train accuracies, charged
    # to the ledger, used for `selection_rounds` rounds, then frozen (§5.4).
    selection_privacy: Literal["none", "gumbel"] = "none"
    selection_epsilon_fraction: float = 0.03  # ε_select = fraction·ε per selection
    selection_rounds: int | None = None  # null = ⌈0.1·E⌉ private selections
    kmeans_features: Literal["raw", "pca"] = "raw"  # km_cdpfl's k-means input
    mr_mtl_lambda: float = 1.0  # mr_mtl's λ (the authors' 1.0)

    def __post_init__(self) -> None:
        _check(self.num_clusters >= 1, "num_clusters", f"must be >= 1, got {self.num_clusters}")
        _check(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        _check(self.local_epochs >= 1, "local_epochs", f"must be >= 1, got {self.local_epochs}")
        _check(
            self.gmm_stage_rounds is None or self.gmm_stage_rounds >= 0,
            "gmm_stage_rounds",
            f"must be >= 0 or null, got {self.gmm_stage_rounds}",
        )
        _check(self.mr_mtl_lambda >= 0, "mr_mtl_lambda", f"must be >= 0, got {self.mr_mtl_lambda}")
        _check(self.d_pca >= 1, "d_pca", f"must be >= 1, got {self.d_pca}")
        _check(
            self.gmm_feature_space == "pca" or self.scaler == "none",
            "scaler",
            "gmm_feature_space: raw needs scaler: none",
        )
        _check(
            0 < self.selection_epsilon_fraction < 1,
            "selection_epsilon_fraction",
            f"must be in (0, 1), got {self.selection_epsilon_fraction}",
        )
        _check(
            self.selection_rounds is None or self.selection_rounds >= 1,
            "selection_rounds",
            f"must be >= 1 or null, got {self.selection_rounds}",
        )
