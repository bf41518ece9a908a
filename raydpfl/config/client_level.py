"""Client-level DP-FedAvg's options and its registration (issue 18, user-level DP).

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


registry.register(
    "algorithm",
    NAME,
    "raydpfl.experiment.builders.client_level:build",
    options=ClientLevelOptions,
    replace=True,
)
