"""The networks the studies train, by name: torchvision's ImageNet classifiers (seed 004's
figure 9), seed 004's six-layer medium CNN at kernel sizes 1 to 7 and its three-layer small CNN
(its appendix C), and a CIFAR ResNet-18. Every network is built from `torch.manual_seed(seed)`,
so two builds with one seed start from the same bits."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# The torchvision classifiers the cost study knows by name (figure 9's networks and a few more).
TORCHVISION = (
    "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "densenet121", "densenet201",
    "vgg16", "vgg19", "resnet18", "resnet50", "resnet152", "convnext_tiny", "vit_b_16",
)
MEDIUM_KERNELS = range(1, 8)


@dataclass(frozen=True)
class Network:
    """A network by name, with the input it takes: `side`×`side` RGB images of `classes` classes."""

    name: str
    side: int
    classes: int

    def build(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        if self.name == "small_cnn":
            return small_cnn(self.classes)
        if self.name == "resnet18_cifar":
            return resnet18_cifar(self.classes)
        if self.name.startswith("medium_cnn_k"):
            return medium_cnn(int(self.name[len("medium_cnn_k"):]), self.classes)
        import torchvision  # only the ImageNet networks need it

        return getattr(torchvision.models, self.name)(num_classes=self.classes)


def network(name: str, side: int | None = None) -> Network:
    """The network called `name`, at its usual input side unless `side` is given; an unknown name
    is a ValueError listing the known ones."""
    if name in ("small_cnn", "resnet18_cifar"):
        return Network(name, side or 32, 10)
    if name.startswith("medium_cnn_k") and name[len("medium_cnn_k"):] in {str(k) for k in MEDIUM_KERNELS}:
        return Network(name, side or 224, 1000)
    if name in TORCHVISION:
        return Network(name, side or 224, 1000)
    known = ", ".join(("small_cnn", "resnet18_cifar", "medium_cnn_k1..medium_cnn_k7") + TORCHVISION)
    raise ValueError(f"no network called {name!r}; known: {known}")


def figure9() -> list[str]:
    """Seed 004's figure 9, both panels: its networks, then the medium CNN at kernel sizes 1 to 7."""
    return ["mobilenet_v2", "efficientnet_b0", "densenet121", "densenet201", "vgg16", "vgg19", "resnet50",
            "resnet152"] + [f"medium_cnn_k{k}" for k in MEDIUM_KERNELS]


def _block(cin: int, cout: int, kernel: int, batch_norm: bool) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, padding=kernel // 2)]
    if batch_norm:
        layers.append(nn.BatchNorm2d(cout))
    return layers + [nn.ReLU(inplace=True), nn.MaxPool2d(2)]


def medium_cnn(kernel: int, classes: int = 1000) -> nn.Module:
    """Six [conv kernel×kernel (stride 1, same padding), batch norm, ReLU, max-pool 2×2] blocks of
    16 to 512 channels (224 → 3 pixels a side), global average pool, dense 1000: appendix C."""
    widths = [3, 16, 32, 64, 128, 256, 512]
    layers = [m for cin, cout in zip(widths, widths[1:]) for m in _block(cin, cout, kernel, True)]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


def small_cnn(classes: int = 10) -> nn.Module:
    """Three [conv 3×3, ReLU, max-pool 2×2] blocks of 16, 32, 32 channels (32 → 4 pixels a side),
    dense 32, output: appendix C."""
    widths = [3, 16, 32, 32]
    layers = [m for cin, cout in zip(widths, widths[1:]) for m in _block(cin, cout, 3, False)]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.ReLU(inplace=True),
                         nn.Linear(32, classes))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet18_cifar(classes: int = 10) -> nn.Module:
    """ResNet-18 for 32×32 inputs: a 3×3 stem of 64 channels, four stages of two basic blocks
    (64, 128, 256, 512 channels), global average pool, output."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))
