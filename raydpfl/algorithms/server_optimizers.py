"""Server optimizers: the server's step on a round's averaged update (Reddi et al. 2021).

An algorithm whose server applies one averaged update Δ̄ per round (FedAvg, DP-FedAvg,
FedProx and DP-FedProx at the record level through `ServerOptimizerMixin`; client-level
DP-FedAvg through `server_step`) can replace θ ← θ + Δ̄ by an optimizer step
that treats −Δ̄ as a pseudo-gradient (Reddi, Charles, Zaheer et al., "Adaptive Federated
Optimization", ICLR 2021, Algorithm 2; momentum: Hsu, Qi & Brown 2019, FedAvgM):

- ``sgd``: θ ← θ + η_s Δ̄ (η_s = 1 is plain FedAvg);
- ``momentum`` (FedAvgM): m ← βm + Δ̄, θ ← θ + η_s m;
- ``adagrad``, ``adam``, ``yogi`` (FedAdagrad, FedAdam, FedYogi): m ← β₁m + (1−β₁)Δ̄,
  v ← v + Δ̄² / β₂v + (1−β₂)Δ̄² / v − (1−β₂)Δ̄² sign(v − Δ̄²), θ ← θ + η_s m/(√v + τ).

Privacy: under DP the step reads only the released (noised) aggregate and the optimizer's
own state, which is itself a function of earlier releases: it is post-processing and
costs no privacy. Nothing here touches a client's data, a ledger or a random stream.

The state (``m``, ``v``) lives on the server and is checkpointed through the algorithm's
`tensor_state` as ``server_m/<name>`` and ``server_v/<name>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from raydpfl.algorithms.aggregators import AGGREGATORS, robust_update
from raydpfl.algorithms.base import WeightedUpdateSum, with_round
from raydpfl.algorithms.tensor_state import pack_tensors, unpack_tensor_state

__all__ = ["SERVER_OPTIMIZERS", "ServerOptimizer", "ServerOptimizerMixin", "server_step"]

#: The server's steps on the averaged update (`server_step`).
SERVER_OPTIMIZERS = ("sgd", "momentum", "adagrad", "adam", "yogi")
#: Fields of `ServerOptimizer.state` and their `tensor_state` prefixes.
_STATE_FIELDS = ("m", "v")


def server_step(
    global_params: Mapping[str, torch.Tensor],
    mean_update: Mapping[str, torch.Tensor],
    state: dict[str, dict[str, torch.Tensor]],
    *,
    optimizer: str,
    lr: float,
    momentum: float = 0.9,
    beta2: float = 0.99,
    eps: float = 1e-3,
) -> dict[str, torch.Tensor]:
    """θ' from θ and the (noisy) mean update Δ̄ (post-processing; `state` holds ``m`` and
    ``v`` and is updated in place). ``sgd``: θ + η_s Δ̄. ``momentum``: m ← βm + Δ̄,
    θ + η_s m. Reddi et al. 2021, Algorithm 2: m ← β₁m + (1−β₁)Δ̄ and θ + η_s m/(√v + τ)
    with ``adagrad`` v ← v + Δ̄², ``adam`` v ← β₂v + (1−β₂)Δ̄², ``yogi``
    v ← v − (1−β₂)Δ̄² sign(v − Δ̄²)."""
    if optimizer == "sgd":
        if lr == 1.0:  # plain (DP-)FedAvg: exactly θ + Δ̄
            return {n: global_params[n] + mean_update[n] for n in global_params}
        return {n: global_params[n] + lr * mean_update[n] for n in global_params}
    m = state.setdefault("m", {n: torch.zeros_like(t) for n, t in mean_update.items()})
    if optimizer == "momentum":
        for n, d in mean_update.items():
            m[n].mul_(momentum).add_(d)
        return {n: global_params[n] + lr * m[n] for n in global_params}
    if optimizer in ("adagrad", "adam", "yogi"):
        v = state.setdefault("v", {n: torch.zeros_like(t) for n, t in mean_update.items()})
        for n, d in mean_update.items():
            m[n].mul_(momentum).add_(d, alpha=1 - momentum)
            square = d * d
            if optimizer == "adagrad":
                v[n].add_(square)
            elif optimizer == "adam":
                v[n].mul_(beta2).add_(square, alpha=1 - beta2)
            else:
                v[n].sub_(square * torch.sign(v[n] - square), alpha=1 - beta2)
        return {n: global_params[n] + lr * m[n] / (v[n].sqrt() + eps) for n in global_params}
    raise ValueError(f"server_optimizer must be one of {SERVER_OPTIMIZERS}, got {optimizer!r}")


def check_server_optimizer(
    optimizer: str, lr: float, momentum: float, beta2: float, eps: float
) -> None:
    """One-line ValueError naming the argument when a setting is out of range."""
    if optimizer not in SERVER_OPTIMIZERS:
        raise ValueError(
            f"server_optimizer must be one of {', '.join(SERVER_OPTIMIZERS)}, got {optimizer!r}"
        )
    if not lr > 0:
        raise ValueError(f"server_lr must be > 0, got {lr}")
    for name, value in (("server_momentum", momentum), ("server_beta2", beta2)):
        if not 0 <= value < 1:
            raise ValueError(f"{name} must be in [0, 1), got {value}")
    if not eps > 0:
        raise ValueError(f"server_adam_eps must be > 0, got {eps}")


class ServerOptimizer:
    """One server optimizer: its settings and its state (``m``, ``v``), which `step`
    updates in place. `plain` (``sgd`` at η_s = 1) is the algorithm's own θ + Δ̄: callers
    keep their existing code path for it, so default runs stay bit for bit the same."""

    def __init__(
        self,
        optimizer: str = "sgd",
        lr: float = 1.0,
        momentum: float = 0.9,
        beta2: float = 0.99,
        eps: float = 1e-3,
    ) -> None:
        check_server_optimizer(optimizer, lr, momentum, beta2, eps)
        self.optimizer = optimizer
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.beta2 = float(beta2)
        self.eps = float(eps)
        self.state: dict[str, dict[str, torch.Tensor]] = {}

    @property
    def plain(self) -> bool:
        """``sgd`` with η_s = 1: θ + Δ̄, no state."""
        return self.optimizer == "sgd" and self.lr == 1.0

    def step(
        self, global_params: Mapping[str, torch.Tensor], mean_update: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """θ' = `server_step` of θ and Δ̄ with this optimizer's settings and state."""
        return server_step(
            global_params,
            mean_update,
            self.state,
            optimizer=self.optimizer,
            lr=self.lr,
            momentum=self.momentum,
            beta2=self.beta2,
            eps=self.eps,
        )

    def tensor_state(self) -> dict[str, torch.Tensor]:
        """``server_m/<name>``, ``server_v/<name>`` (what exists yet)."""
        out: dict[str, torch.Tensor] = {}
        for field, params in sorted(self.state.items()):
            out.update(pack_tensors(f"server_{field}", params))
        return out

    def load_tensor_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restores what `tensor_state` returned ({} = no state yet)."""
        shared, _ = unpack_tensor_state(
            tensors, shared=tuple(f"server_{f}" for f in _STATE_FIELDS)
        )
        self.state = {
            field.removeprefix("server_"): {n: t.clone() for n, t in params.items()}
            for field, params in shared.items()
        }


class ServerOptimizerMixin:
    """A server optimizer for an algorithm whose server applies one weighted-mean update.

    The class attribute `server_opt` is None (plain θ + Δ̄, no state: subclasses and
    objects built without `_set_server_optimizer` keep today's behaviour);
    `_set_server_optimizer` gives the object its own `ServerOptimizer` unless it is plain.
    `aggregate_sum` applies it to the round's weighted mean; `tensor_state` checkpoints
    its state. Post-processing of the (noised) aggregate: no privacy cost.
    """

    server_opt: ClassVar[ServerOptimizer | None] = None
    #: How the round's updates are combined before the step (`raydpfl.algorithms.aggregators`):
    #: ``mean`` (weighted, linear: workers may sum), ``median`` or ``trimmed_mean``.
    aggregator: ClassVar[str] = "mean"
    trim_fraction: ClassVar[float] = 0.1

    def _set_server_optimizer(
        self, *settings: Any, aggregator: str = "mean", trim_fraction: float = 0.1
    ) -> None:
        """`settings`: `ServerOptimizer`'s (optimizer, lr, momentum, beta2, eps); a robust
        `aggregator` makes the algorithm non-linear (the server needs every update)."""
        opt = ServerOptimizer(*settings)
        if not opt.plain:
            self.server_opt = opt  # type: ignore[misc]
        if aggregator not in AGGREGATORS:
            raise ValueError(
                f"aggregator must be one of {', '.join(AGGREGATORS)}, got {aggregator!r}"
            )
        if not 0 <= trim_fraction < 0.5:
            raise ValueError(f"trim_fraction must be in [0, 0.5), got {trim_fraction}")
        if aggregator != "mean":
            self.aggregator = aggregator  # type: ignore[misc]
            self.trim_fraction = float(trim_fraction)  # type: ignore[misc]
            self.linear_aggregation = False  # type: ignore[misc]

    def aggregate(self, global_params, tasks, results, server_round=None):  # type: ignore[no-untyped-def]
        """With a robust aggregator: the server step on Δ = median or trimmed mean of the
        arrived updates (unweighted), emitting ``robust_shift`` = ‖Δ − Δ̄‖₂, its distance
        from the weighted mean; otherwise the base class's sum and `aggregate_sum`."""
        if self.aggregator == "mean":
            aggregate = super().aggregate  # type: ignore[misc]
            return with_round(aggregate, server_round)(global_params, tasks, results)
        if not results:
            return {n: t.clone() for n, t in global_params.items()}
        updates = [
            {n: r.update[n].to(global_params[n].device) for n in global_params} for r in results
        ]
        robust = robust_update(self.aggregator, updates, self.trim_fraction)
        if server_round is not None:
            mean = WeightedUpdateSum()
            for r, u in zip(results, updates, strict=True):
                mean.add(u, r.weight)
            mean_update = mean.mean()
            assert mean_update is not None
            shift = sum(float((robust[n] - mean_update[n]).pow(2).sum()) for n in robust)
            server_round.emit("robust_shift", shift**0.5)
        return self._step(global_params, robust)

    def aggregate_sum(self, global_params, tasks, total, server_round=None):  # type: ignore[no-untyped-def]
        """θ + Δ̄ (plain, the base class's own step), or the server optimizer's step on
        Δ̄ = Σ w_k Δ_k / Σ w_k. A round without results leaves θ and the state unchanged."""
        opt = self.server_opt
        if opt is None:
            aggregate_sum = super().aggregate_sum  # type: ignore[misc]
            return with_round(aggregate_sum, server_round)(global_params, tasks, total)
        mean = total.mean()
        if mean is None:
            return {n: t.clone() for n, t in global_params.items()}
        return self._step(global_params, mean)

    def _step(self, global_params, update):  # type: ignore[no-untyped-def]
        """θ + Δ, or the server optimizer's step on Δ (on the parameters' device)."""
        update = {n: update[n].to(global_params[n].device) for n in global_params}
        if self.server_opt is None:
            return {n: global_params[n] + update[n] for n in global_params}
        return self.server_opt.step(global_params, update)

    def tensor_state(self) -> dict[str, torch.Tensor]:
        opt = self.server_opt
        if opt is None:
            return super().tensor_state()  # type: ignore[misc]
        return opt.tensor_state()

    def load_tensor_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        opt = self.server_opt
        if opt is None:
            super().load_tensor_state(tensors)  # type: ignore[misc]
            return
        opt.load_tensor_state(tensors)
