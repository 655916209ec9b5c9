"""Model zoo: the paper's networks (torchvision ResNet101 and VGG16-BN, a 2-layer LSTM LM) and
CPU-sized minis of the same families. `build_model(cfg, num_classes, task)` is the one entry point.

Notes: `vgg16` is torchvision's vgg16_bn unchanged; its classifier was designed for 224 px inputs
(512x7x7 features), and its AdaptiveAvgPool2d(7) replicates the 1x1 map a 32 px CIFAR image
leaves, so CIFAR works (as in the paper's code) at the full 134M-parameter cost. `resnet101` keeps
torchvision's ImageNet stem (7x7 stride-2 conv + max-pool), also as in the paper. `lstm` and
`lstm_mini` are the same class and both honour cfg.embed_size/hidden_size/num_layers/dropout;
the mini preset's YAML sets the small sizes (200/200, dropout 0.2). `resnet_mini` is ResNet-20
(3 BasicBlocks per stage); an optional cfg.blocks (read with getattr, default 3) gives ResNet-(6n+2),
e.g. blocks=1 -> ResNet-8 at ~2.5x the speed.
"""
from __future__ import annotations

from torch import nn

from gravac.models.cnn_mini import ResNetMini, VGGMini
from gravac.models.lstm import LSTMLanguageModel

MODEL_NAMES: tuple[str, ...] = ("resnet101", "vgg16", "lstm", "resnet_mini", "vgg_mini", "lstm_mini")
_TASK = {"resnet101": "classification", "vgg16": "classification", "resnet_mini": "classification",
         "vgg_mini": "classification", "lstm": "lm", "lstm_mini": "lm"}

__all__ = ["MODEL_NAMES", "build_model", "count_parameters", "ResNetMini", "VGGMini", "LSTMLanguageModel"]


def build_model(cfg, num_classes: int, task: str) -> nn.Module:
    """Build cfg.name for `num_classes` outputs (vocab size for an LM); ValueError on an unknown
    name or a model/task mismatch. Initialisation uses torch's global RNG: seed it first."""
    name = cfg.name
    if name not in _TASK:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODEL_NAMES)}")
    if task != _TASK[name]:
        fits = ", ".join(n for n in MODEL_NAMES if _TASK[n] == task) or "none"
        raise ValueError(f"model {name!r} is for {_TASK[name]} but the dataset's task is {task!r}; "
                         f"models for {task!r}: {fits}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    width = cfg.width
    if name == "resnet101":
        from torchvision.models import resnet101
        return resnet101(weights=None, num_classes=num_classes)
    if name == "vgg16":
        from torchvision.models import vgg16_bn
        return vgg16_bn(weights=None, num_classes=num_classes)
    if name == "resnet_mini":
        return ResNetMini(num_classes, width=width, blocks=cfg.blocks)
    if name == "vgg_mini":
        return VGGMini(num_classes, width=width)
    return LSTMLanguageModel(num_classes, embed_size=cfg.embed_size, hidden_size=cfg.hidden_size,
                             num_layers=cfg.num_layers, dropout=cfg.dropout, tie_weights=cfg.tie_weights)


def count_parameters(model: nn.Module) -> int:
    """Number of distinct trainable parameter elements (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
