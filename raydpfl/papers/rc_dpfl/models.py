"""Models of the rc_dpfl paper (registered in the zoo; see `raydpfl.papers.rc_dpfl.options`).

- ``rc_cnn``: Table 1's CNN for MNIST/FMNIST (§6.18): Conv(C→16, 5×5, pad 2) + ReLU →
  MaxPool 2 → Conv(16→32, 5×5, pad 2) + ReLU → MaxPool 2 → Dense(32·(H/4)·(W/4) → 10),
  no activation on the logits (Table 1's ReLU there is dropped as in the authors' code).
  28,938 parameters for 1×28×28 inputs and 10 classes.
- ``rc_resnet18``: the torchvision/ImageNet-style ResNet-18 (7×7 stride-2 stem, max-pool,
  four stages of two basic blocks) with every BatchNorm replaced by GroupNorm(2 groups),
  as the authors' code does (BatchNorm mixes examples, which per-sample DP-SGD forbids).
  GroupNorm has the same affine parameters, so the count stays 11,181,642 for 10 classes.
"""

from __future__ import annotations

from torch import nn

from raydpfl.models.layers import MaxPool2d


class RcCNN(nn.Module):
    """The paper's Table 1 CNN (28,938 parameters on 1×28×28 inputs, 10 classes)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, kernel_size=5, stride=1, padding=2),
            nn.ReLU(),
            MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=5, stride=1, padding=2),
            nn.ReLU(),
            MaxPool2d(2),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(32 * (height // 4) * (width // 4), num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, channels)


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = _norm(cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = _norm(cout, groups)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(cout, groups)
            )

    def forward(self, x):
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class RcResNet18(nn.Module):
    """ResNet-18 (ImageNet layout) with GroupNorm; 11,181,642 parameters for 3 channels
    and 10 classes."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, groups: int = 2) -> None:
        super().__init__()
        channels = input_shape[0]
        self.stem = nn.Sequential(
            nn.Conv2d(channels, 64, 7, 2, 3, bias=False),
            _norm(64, groups),
            nn.ReLU(),
            MaxPool2d(3, 2, 1),
        )
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [_BasicBlock(cin, cout, stride, groups), _BasicBlock(cout, cout, 1, groups)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        return self.fc(self.pool(self.layers(self.stem(x))).flatten(1))


def _cnn(input_shape: tuple[int, ...], num_classes: int, **options: int) -> nn.Module:
    if options:
        raise ValueError(f"rc_cnn takes no options, got {sorted(options)}")
    if len(input_shape) != 3 or input_shape[1] < 4 or input_shape[2] < 4:
        raise ValueError(f"rc_cnn needs (C, H, W) images with H, W >= 4, got {input_shape}")
    return RcCNN(tuple(input_shape), num_classes)


def _resnet(input_shape: tuple[int, ...], num_classes: int, **options: int) -> nn.Module:
    if set(options) - {"groups"}:
        raise ValueError(f"rc_resnet18 takes only 'groups', got {sorted(options)}")
    if len(input_shape) != 3:
        raise ValueError(f"rc_resnet18 needs (C, H, W) images, got {input_shape}")
    return RcResNet18(tuple(input_shape), num_classes, groups=int(options.get("groups", 2)))


# The factories by model name (`raydpfl.papers.rc_dpfl.register` registers them).
rc_cnn = _cnn
rc_resnet18 = _resnet
