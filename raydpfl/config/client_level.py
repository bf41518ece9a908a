"""Client-level DP-FedAvg's and DP-FTRL's options and their registration (user-level DP).

``dp_fedavg_client`` is registered in `raydpfl.registry` like a user's plugin, with
`ClientLevelOptions` as its options dataclass (``experiment.algorithm.options``), so the
name and its options are checked when a config is loaded, before any data or training.
The algorithm is built lazily by ``raydpfl.experiment.builders.client_level:build``.

Its other settings come from the usual places: ``experiment.algorithm.{rounds,
clients_per_round (K; poisson: q defaults to K/N), local_steps, lr, batch_size}`` and
``experiment.privacy.{epsilon (the client-level budget), delta, accountant, clip_norm (S
unless update_clip_norm is set), noise_multiplier (σ; null = calibrated to the budget)}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raydpfl import registry
from raydpfl.config._base import _check

NAME = "dp_fedavg_client"


@dataclass(frozen=True, kw_only=True)
class ClientLevelOptions:
    """``experiment.algorithm.options`` of ``dp_fedavg_client``."""

    # poisson: each client joins a round independently with rate q (add/remove-one client);
    # fixed: K = clients_per_round clients uniformly without replacement (replace-one client).
    sampling: Literal["poisson", "fixed"] = "poisson"
    # q of poisson sampling, in (0, 1]; null = clients_per_round / num_clients.
    client_sampling_rate: float | None = None
    # S, the L2 bound on each client's model update; null = experiment.privacy.clip_norm.
    update_clip_norm: float | None = None
    # flat: one bound S on the whole update; per_layer: S/sqrt(L) on each of L tensors.
    clipping: Literal["flat", "per_layer"] = "flat"
    # central: the server adds N(0, σ²S²); distributed: each client adds N(0, σ²S²/K).
    noise: Literal["central", "distributed"] = "central"
    # Adaptive clipping (Andrew et al. 2021): S follows a private estimate of the
    # target_quantile of the clients' update norms; the start value is the S above.
    adaptive_clipping: bool = False
    # γ in (0, 1): the fraction of updates meant to stay unclipped.
    target_quantile: float = 0.5
    # η_C > 0: S <- S * exp(-η_C (b - γ)), b the noisy unclipped fraction.
    clip_lr: float = 0.2
    # σ_b, the std of the noise on the count of unclipped updates; null = 0.05 * expected
    # cohort. Must exceed σ/2; the update noise grows to keep the total at σ.
    clip_count_stddev: float | None = None
    # The server's step on the noisy mean update (post-processing: no privacy cost).
    # sgd: θ += server_lr·Δ; momentum: m = β m + Δ, θ += server_lr·m (DP-FedAvgM);
    # adagrad/adam/yogi: FedAdagrad/FedAdam/FedYogi (Reddi et al. 2021) with
    # β1 = server_momentum, β2 = server_beta2 (adam, yogi), τ = server_adam_eps.
    server_optimizer: Literal["sgd", "momentum", "adagrad", "adam", "yogi"] = "sgd"
    # η_s > 0, the server learning rate (1 = plain DP-FedAvg).
    server_lr: float = 1.0
    # β (momentum) or β1 (adam), in [0, 1).
    server_momentum: float = 0.9
    # β2 of adam and yogi, in [0, 1).
    server_beta2: float = 0.99
    # τ of adagrad, adam and yogi (their adaptivity), > 0.
    server_adam_eps: float = 1e-3

    def __post_init__(self) -> None:
        q = self.client_sampling_rate
        _check(q is None or 0 < q <= 1, "client_sampling_rate", f"must be in (0, 1], got {q}")
        _check(
            q is None or self.sampling == "poisson",
            "client_sampling_rate",
            "is for poisson sampling; fixed sampling takes K from "
            "experiment.algorithm.clients_per_round",
        )
        s = self.update_clip_norm
        _check(s is None or s > 0, "update_clip_norm", f"must be > 0, got {s}")
        _check(
            not (self.noise == "distributed" and self.sampling == "poisson"),
            "noise",
            "distributed noise needs sampling: fixed (with Poisson sampling the cohort size "
            "varies, so K shares of sigma^2 S^2 / K would not sum to sigma^2 S^2)",
        )
        g = self.target_quantile
        _check(0 < g < 1, "target_quantile", f"must be in (0, 1), got {g}")
        _check(self.clip_lr > 0, "clip_lr", f"must be > 0, got {self.clip_lr}")
        b = self.clip_count_stddev
        _check(b is None or b > 0, "clip_count_stddev", f"must be > 0, got {b}")
        _check(
            not (self.adaptive_clipping and self.noise == "distributed"),
            "adaptive_clipping",
            "needs noise: central (the noisy count of unclipped updates is added by the server)",
        )
        _check(self.server_lr > 0, "server_lr", f"must be > 0, got {self.server_lr}")
        for name in ("server_momentum", "server_beta2"):
            value = getattr(self, name)
            _check(0 <= value < 1, name, f"must be in [0, 1), got {value}")
        e = self.server_adam_eps
        _check(e > 0, "server_adam_eps", f"must be > 0, got {e}")


FTRL_NAME = "dp_ftrl_client"


@dataclass(frozen=True, kw_only=True)
class DPFTRLOptions:
    """``experiment.algorithm.options`` of ``dp_ftrl_client`` (DP-FTRL, Kairouz et al. 2021):
    K = clients_per_round clients per round, each client at most once per epoch of
    N // K rounds, tree-aggregated noise restarted every epoch; no sampling."""

    # S, the L2 bound on each client's model update; null = experiment.privacy.clip_norm.
    update_clip_norm: float | None = None
    # flat: one bound S on the whole update; per_layer: S/sqrt(L) on each of L tensors.
    clipping: Literal["flat", "per_layer"] = "flat"
    # η_s > 0: θ = θ_epoch_start + η_s · (noisy prefix sum of clipped updates) / K.
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        s = self.update_clip_norm
        _check(s is None or s > 0, "update_clip_norm", f"must be > 0, got {s}")
        _check(self.server_lr > 0, "server_lr", f"must be > 0, got {self.server_lr}")


registry.register(
    "algorithm",
    FTRL_NAME,
    "raydpfl.experiment.builders.client_level:build_ftrl",
    options=DPFTRLOptions,
    replace=True,
    notes={"audit": "a client-level tree mechanism, not DP-FedAvg's Gaussian sum"},
)

registry.register(
    "algorithm",
    NAME,
    "raydpfl.experiment.builders.client_level:build",
    options=ClientLevelOptions,
    replace=True,
    tags=("audit:client",),
)
