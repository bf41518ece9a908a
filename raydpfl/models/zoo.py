"""The model zoo: the papers' architectures, all free of BatchNorm.

BatchNorm mixes the examples of a batch, so one record would influence every other
record's gradient and per-sample clipping would no longer bound its contribution.
Every model here is therefore built from layers whose per-sample gradients depend on
that sample alone (Linear, Conv2d, pooling, ReLU; GroupNorm where normalisation is
needed).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from raydpfl import registry
from raydpfl.models.layers import MaxPool2d


class FedAvgCNN(nn.Module):
    """The FedAvg CNN of McMahan et al. (2017) as used by ALI-DPFL and FedFDP (PFLlib).

    Conv(c→32, 5×5) ReLU MaxPool2 → Conv(32→64, 5×5) ReLU MaxPool2 → Linear(·→512)
    ReLU → Linear(512→classes). 582,026 parameters on 1×28×28 inputs, 878,538 on
    3×32×32 (specs/ali-dpfl.md §6.3). ReLUs are not in-place, which `torch.func.vmap`
    needs.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.conv1 = nn.Conv2d(channels, 32, kernel_size=5)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5)
        flat_h = ((height - 4) // 2 - 4) // 2
        flat_w = ((width - 4) // 2 - 4) // 2
        if flat_h < 1 or flat_w < 1:
            raise ValueError(
                f"model.name: fedavg_cnn needs inputs of at least 16x16 pixels, got {input_shape}"
            )
        self.fc1 = nn.Linear(64 * flat_h * flat_w, 512)
        self.fc = nn.Linear(512, num_classes)
        self.pool = MaxPool2d(2)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc(self.relu(self.fc1(x)))


class LogisticRegression(nn.Module):
    """Multinomial logistic regression on flattened inputs (FedProx's synthetic model)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.flatten(x, 1))


class MLP(nn.Module):
    """A two-layer perceptron on flattened inputs (hidden width configurable)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 200) -> None:
        super().__init__()
        self.fc1 = nn.Linear(math.prod(input_shape), hidden)
        self.fc2 = nn.Linear(hidden, num_classes)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(torch.flatten(x, 1))))


ModelFactory = Callable[..., nn.Module]

#: The core zoo (the papers' modules register theirs when `raydpfl.models` is imported).
MODELS: tuple[str, ...] = ("fedavg_cnn", "logreg", "mlp")


def register_model(name: str, factory: ModelFactory) -> None:
    """Adds a built-in model ``factory(input_shape, num_classes, **options)`` to the one
    registry (`raydpfl.registry`; a user's models use `raydpfl.register_model`)."""
    try:
        registry.register("model", name, factory, builtin=True)
    except registry.RegistryError as e:
        raise ValueError(str(e)) from None


for _name, _factory in zip(MODELS, (FedAvgCNN, LogisticRegression, MLP), strict=True):
    register_model(_name, _factory)


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, **options: int
) -> nn.Module:
    """Builds a registered model and checks that it is DP-compatible.

    Raises:
        ValueError: Unknown name, or a layer that mixes examples (BatchNorm).
    """
    if not registry.is_registered("model", name):
        allowed = ", ".join(registry.names("model"))
        raise ValueError(f"model.name: unknown model {name!r}; allowed: {allowed}")
    model = registry.get("model", name).load()(tuple(input_shape), num_classes, **options)
    assert_dp_compatible(model)
    return model


def assert_dp_compatible(model: nn.Module) -> None:
    """Raises ValueError if `model` has a layer whose output mixes examples."""
    for module_name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                f"layer {module_name!r} is {type(module).__name__}: BatchNorm mixes examples and "
                "breaks per-sample clipping; use GroupNorm"
            )


def num_parameters(model: nn.Module) -> int:
    """The number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
