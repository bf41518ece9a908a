"""A new DP algorithm and a new model, written outside raydpfl, registered and run.

DP-FedAvg with server momentum (FedAvgM, Hsu et al. 2019, on DP-FedAvg's clients): each
round the server keeps a velocity v ← β·v + Δ̄ of the averaged client update Δ̄ and moves
the global model by η_s·v. The clients run raydpfl's record-level DP-SGD unchanged, so
each client's privacy cost is DP-FedAvg's; the momentum only post-processes the noised
updates and costs no privacy. Both are registered by name, so a config (or YAML, after
importing this file) names them like built-ins: `algorithm.name: dp_fedavg_server_momentum`
with `algorithm.options: {momentum: 0.5}`, and `model.name: small_cnn`.

Run it (digits from scikit-learn, no download):
    python examples/dp_fedavg_server_momentum.py            # in-process, then Ray (2 workers)
    python examples/dp_fedavg_server_momentum.py --local    # in-process only
It prints each backend's final accuracy, ε and model hash; the hashes are equal.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

import raydpfl
from raydpfl.algorithms import DPFedAvg, WeightedUpdateSum
from raydpfl.algorithms.base import ClientTask, Params


@raydpfl.register_model("small_cnn")
def small_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The registered factory: (input shape, classes) → a fresh model."""
    return SmallCNN(num_classes)


class SmallCNN(nn.Module):
    """A small convolutional net for 8×8 digits (no BatchNorm: it would mix samples)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, kernel_size=3, padding=1),
            nn.GroupNorm(2, 8),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(8 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.reshape(-1, 1, 8, 8)).flatten(1))


@dataclass(frozen=True)
class MomentumOptions:
    """`algorithm.options`: the server's momentum β and step size η_s."""

    momentum: float = 0.9
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.momentum < 1.0:
            raise raydpfl.ConfigError("momentum", f"must be in [0, 1), got {self.momentum}")


@raydpfl.register_algorithm("dp_fedavg_server_momentum", options=MomentumOptions)
class DPFedAvgServerMomentum(DPFedAvg):
    """DP-FedAvg whose server applies momentum to the averaged (noised) client update.

    Built from the config: `momentum`, `server_lr` from `algorithm.options`; DP-FedAvg's
    arguments from `algorithm` (clients_per_round, local_steps, lr) and `privacy`.
    """

    name = "dp_fedavg_server_momentum"

    def __init__(self, *, momentum: float, server_lr: float, **dp_fedavg) -> None:
        super().__init__(**dp_fedavg)
        self.server_lr, self.momentum = server_lr, momentum
        self.velocity: Params | None = None

    def aggregate_sum(
        self, global_params: Params, tasks: Sequence[ClientTask], total: WeightedUpdateSum
    ) -> Params:
        mean = total.mean()  # Σ w_k Δ_k / Σ w_k over the clients that trained
        if mean is None:
            return {n: t.clone() for n, t in global_params.items()}
        if self.velocity is None:
            self.velocity = {n: torch.zeros_like(t) for n, t in mean.items()}
        for n, delta in mean.items():
            self.velocity[n].mul_(self.momentum).add_(delta)
        return {n: p + self.server_lr * self.velocity[n] for n, p in global_params.items()}

    # Checkpoints keep the velocity, so `raydpfl run --resume` continues exactly.
    def tensor_state(self) -> dict[str, torch.Tensor]:
        return {f"velocity/{n}": t for n, t in (self.velocity or {}).items()}

    def load_tensor_state(self, tensors: dict[str, torch.Tensor]) -> None:
        prefix = "velocity/"
        self.velocity = {k[len(prefix) :]: t.clone() for k, t in tensors.items()} or None


CONFIG = {
    "experiment": {
        "name": "dp-fedavg-momentum",
        "data": {"dataset": "digits", "num_clients": 10, "partition": {"kind": "iid"}},
        "model": {"name": "small_cnn"},
        "algorithm": {
            "name": "dp_fedavg_server_momentum",
            "options": {"momentum": 0.5},
            "rounds": 8,
            "clients_per_round": 5,
            "local_steps": 5,
            "lr": 0.5,
            "eval_every": 4,
        },
        "privacy": {"epsilon": 8.0, "delta": 1e-4, "clip_norm": 1.0, "sampling_rate": 0.2},
    },
    "runtime": {"seed": 0, "progress": False, "checkpoint_every": 4, "workers": 2},
}


def run(backend: str) -> raydpfl.SimulationResult:
    """One run on `backend` (`local`, or `ray` with two workers)."""
    return raydpfl.run_simulation(CONFIG, overrides=[f"runtime.backend={backend}"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true", help="in-process only (no Ray)")
    args = parser.parse_args(argv)
    hashes = []
    for backend in ["local"] if args.local else ["local", "ray"]:
        result = run(backend)
        s = result.summary
        print(
            f"{backend:>5}: accuracy {s['final_test_accuracy']:.4f}, epsilon_max "
            f"{s['epsilon_max']:.3f} at delta {s['delta']:g} ({s['epsilon_unit']} level), "
            f"model {result.model_sha256[:16]}"
        )
        hashes.append(result.model_sha256)
    if len(set(hashes)) != 1:
        print("the backends disagree")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
