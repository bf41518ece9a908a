"""Models of the dpfl_bcs paper (registered in the zoo; see `raydpfl.papers.dpfl_bcs.options`).

Architectures of shared/specs/dpfl-bcs.md §11.4, which reproduce the paper's parameter counts
exactly (for 1×28×28 / 3×32×32 inputs and 10 / 62 classes). BatchNorm is replaced by GroupNorm
with the same affine parameters (§13.17: per-sample clipping is undefined under batch
statistics), so the counts are unchanged.

- ``bcs_mnist_cnn``: Conv(C→4, 3×3, pad 1) → ReLU → MaxPool2 → Conv(4→8, 3×3, pad 1) → ReLU →
  MaxPool2 → Linear(8·(H/4)·(W/4) → classes). 4,266 parameters on MNIST.
- ``bcs_lenet5``: classic LeNet-5 with ReLU and max-pooling: Conv(C→6, 5×5, pad 2) → pool →
  Conv(6→16, 5×5) → pool → 120 → 84 → classes. 61,706 parameters on (Fashion-)MNIST.
- ``bcs_femnist_cnn``: Conv(C→16, 5×5, pad 2) → GN(4 groups) → ReLU → pool → Conv(16→8, 5×5,
  pad 2) → GN(2 groups) → ReLU → pool → 128 → 68 → classes. 67,026 parameters on FEMNIST (62).
- ``bcs_resnet20``: He et al.'s CIFAR ResNet-20 (16/32/64 channels, 3 basic blocks per stage,
  no conv bias) with option-B shortcuts (1×1 conv + norm where the shape changes) and
  GroupNorm (``groups`` option, default 8). 272,474 parameters on CIFAR-10.
- ``bcs_linear``: a linear model on the flattened input (Linear(features → classes)): on a
  classification dataset, multinomial logistic regression.
- ``bcs_linreg``: the paper's linear regression (§11.4, Lending Club): Linear(features → 1)
  with bias and an MSE loss, 11 parameters on 10 features. Regression datasets only (one
  output; the config refuses it with a classification dataset, and any other model with a
  regression dataset). Lending Club is not available offline; the stand-in is scikit-learn's
  ``diabetes`` (10 features, so the same 11 parameters).

PRIVATEFL's personalised input transformation lives in `raydpfl.models.input_transform`
(re-exported here).
"""

from __future__ import annotations

import math

from torch import nn

from raydpfl.models.input_transform import (  # noqa: F401  (re-exported)
    INPUT_TRANSFORM,
    TRANSFORM_SCALE,
    TRANSFORM_SHIFT,
    apply_input_transform,
    identity_input_transform,
)
from raydpfl.models.layers import MaxPool2d


def _pooled(size: int, times: int) -> int:
    for _ in range(times):
        size //= 2
    return size


class _FeaturesClassifier(nn.Module):
    """A CNN in two parts, built by the subclass's `layers`: `features` (ending in a
    flatten) then `classifier`."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.features, self.classifier = self.layers(*input_shape, num_classes)

    @staticmethod
    def layers(c: int, h: int, w: int, num_classes: int) -> tuple[nn.Module, nn.Module]:
        raise NotImplementedError

    def forward(self, x):
        return self.classifier(self.features(x))


class BcsMnistCnn(_FeaturesClassifier):
    """The paper's 4,266-parameter MNIST CNN (two conv layers and one dense layer)."""

    @staticmethod
    def layers(c: int, h: int, w: int, num_classes: int) -> tuple[nn.Module, nn.Module]:
        features = nn.Sequential(
            nn.Conv2d(c, 4, 3, padding=1),
            nn.ReLU(),
            MaxPool2d(2),
            nn.Conv2d(4, 8, 3, padding=1),
            nn.ReLU(),
            MaxPool2d(2),
            nn.Flatten(),
        )
        return features, nn.Linear(8 * _pooled(h, 2) * _pooled(w, 2), num_classes)


class BcsLeNet5(_FeaturesClassifier):
    """LeNet-5 (61,706 parameters on 1×28×28 inputs, 10 classes)."""

    @staticmethod
    def layers(c: int, h: int, w: int, num_classes: int) -> tuple[nn.Module, nn.Module]:
        features = nn.Sequential(
            nn.Conv2d(c, 6, 5, padding=2),
            nn.ReLU(),
            MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            MaxPool2d(2),
            nn.Flatten(),
        )
        flat = 16 * ((_pooled(h, 1) - 4) // 2) * ((_pooled(w, 1) - 4) // 2)
        classifier = nn.Sequential(
            nn.Linear(flat, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )
        return features, classifier


class BcsFemnistCnn(_FeaturesClassifier):
    """The FEMNIST CNN reconstruction (67,026 parameters on 1×28×28 inputs, 62 classes)."""

    @staticmethod
    def layers(c: int, h: int, w: int, num_classes: int) -> tuple[nn.Module, nn.Module]:
        features = nn.Sequential(
            nn.Conv2d(c, 16, 5, padding=2),
            nn.GroupNorm(4, 16),
            nn.ReLU(),
            MaxPool2d(2),
            nn.Conv2d(16, 8, 5, padding=2),
            nn.GroupNorm(2, 8),
            nn.ReLU(),
            MaxPool2d(2),
            nn.Flatten(),
        )
        classifier = nn.Sequential(
            nn.Linear(8 * _pooled(h, 2) * _pooled(w, 2), 128),
            nn.ReLU(),
            nn.Linear(128, 68),
            nn.ReLU(),
            nn.Linear(68, num_classes),
        )
        return features, classifier


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(min(groups, cout), cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(min(groups, cout), cout)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:  # option B
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(min(groups, cout), cout)
            )

    def forward(self, x):
        out = self.relu(self.norm1(self.conv1(x)))
        return self.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class BcsResNet20(nn.Module):
    """CIFAR ResNet-20, option-B shortcuts, GroupNorm (272,474 parameters for 10 classes)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, groups: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], 16, 3, 1, 1, bias=False),
            nn.GroupNorm(min(groups, 16), 16),
            nn.ReLU(),
        )
        blocks, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(3):
                blocks.append(_Block(cin, cout, stride if i == 0 else 1, groups))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.fc(self.pool(self.blocks(self.stem(x))).flatten(1))


class BcsLinear(nn.Module):
    """Linear(features → outputs) on the flattened input (linear regression with 1 output)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x):
        return self.linear(x.flatten(1))


def _image(name: str, cls: type[nn.Module]):
    def factory(input_shape: tuple[int, ...], num_classes: int, **options: int) -> nn.Module:
        if options:
            raise ValueError(f"{name} takes no options, got {sorted(options)}")
        if len(input_shape) != 3 or input_shape[1] < 8 or input_shape[2] < 8:
            raise ValueError(f"{name} needs (C, H, W) images with H, W >= 8, got {input_shape}")
        return cls(tuple(input_shape), num_classes)

    return factory


def _resnet(input_shape: tuple[int, ...], num_classes: int, **options: int) -> nn.Module:
    if set(options) - {"groups"}:
        raise ValueError(f"bcs_resnet20 takes only 'groups', got {sorted(options)}")
    if len(input_shape) != 3:
        raise ValueError(f"bcs_resnet20 needs (C, H, W) images, got {input_shape}")
    return BcsResNet20(tuple(input_shape), num_classes, groups=int(options.get("groups", 8)))


def _linear(input_shape: tuple[int, ...], num_classes: int, **options: int) -> nn.Module:
    if options:
        raise ValueError(f"bcs_linear takes no options, got {sorted(options)}")
    return BcsLinear(tuple(input_shape), num_classes)


def _linreg(input_shape: tuple[int, ...], num_classes: int, **options: int) -> nn.Module:
    if options:
        raise ValueError(f"bcs_linreg takes no options, got {sorted(options)}")
    if num_classes != 1:
        raise ValueError(
            f"bcs_linreg is linear regression (one output) for a regression dataset; this "
            f"dataset has {num_classes} classes"
        )
    return BcsLinear(tuple(input_shape), 1)


# The factories by model name (`raydpfl.papers.dpfl_bcs.register` registers them).
bcs_mnist_cnn = _image("bcs_mnist_cnn", BcsMnistCnn)
bcs_lenet5 = _image("bcs_lenet5", BcsLeNet5)
bcs_femnist_cnn = _image("bcs_femnist_cnn", BcsFemnistCnn)
bcs_resnet20 = _resnet
bcs_linear = _linear
bcs_linreg = _linreg
