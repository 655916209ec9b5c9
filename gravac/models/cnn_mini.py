"""Small CIFAR-style CNNs of the two paper families, for CPU runs with many simulated workers.

`ResNetMini` is the CIFAR ResNet of He et al. (3x3 stem, three stages of BasicBlocks at widths
w, 2w, 4w, global average pooling); `VGGMini` stacks conv-BN-ReLU layers with max-pooling like
VGG16-BN at a fraction of the channels. Both end in adaptive pooling, so any square input >= 8 px
and any number of classes works.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gravac.core.registry import option
from gravac.models.registry import MODELS
from gravac.core.schema import ModelCfg


@dataclass
class VGGMiniCfg(ModelCfg):
    """width: channels of the first stage (doubling per stage)."""
    width: int = option(16, check=lambda v: v >= 1, valid=">= 1")


@dataclass
class ResNetMiniCfg(VGGMiniCfg):
    """blocks: BasicBlocks per stage (3 = ResNet-20, 1 = ResNet-8, about 2.5x faster)."""
    blocks: int = option(3, check=lambda v: v >= 1, valid=">= 1")


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 conv-BN projection) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNetMini(nn.Module):
    """CIFAR ResNet-(6n+2): `blocks` BasicBlocks per stage, stages of width w, 2w, 4w (n=3: ResNet-20)."""

    def __init__(self, num_classes: int = 10, width: int = 16, blocks: int = 3, in_channels: int = 3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True))
        layers, cin = [], width
        for i, cout in enumerate((width, 2 * width, 4 * width)):
            for j in range(blocks):
                layers.append(BasicBlock(cin, cout, stride=2 if (i > 0 and j == 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


class VGGMini(nn.Module):
    """VGG-style: conv-BN-ReLU stacks [w] M [2w] M [4w, 4w] M [8w, 8w], global average pooling and
    a two-layer classifier. Three max-pools: an 8 px input reaches 1x1, 32 px reaches 4x4."""

    def __init__(self, num_classes: int = 10, width: int = 16, in_channels: int = 3):
        super().__init__()
        plan = [width, "M", 2 * width, "M", 4 * width, 4 * width, "M", 8 * width, 8 * width]
        layers, cin = [], in_channels
        for v in plan:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1, bias=False), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
                cin = v
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(cin, cin), nn.ReLU(inplace=True), nn.Linear(cin, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


@MODELS.register("resnet_mini", ResNetMiniCfg, task="classification")
def resnet_mini(cfg: ResNetMiniCfg, num_classes: int) -> ResNetMini:
    """a CPU-sized CIFAR ResNet-(6·blocks+2): ResNet-20, 272K parameters, at the defaults"""
    return ResNetMini(num_classes, width=cfg.width, blocks=cfg.blocks)


@MODELS.register("vgg_mini", VGGMiniCfg, task="classification")
def vgg_mini(cfg: VGGMiniCfg, num_classes: int) -> VGGMini:
    """a CPU-sized VGG-style CNN (300K parameters at the defaults)"""
    return VGGMini(num_classes, width=cfg.width)
