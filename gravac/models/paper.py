"""The paper's torchvision CNNs, unchanged.

`vgg16` is torchvision's vgg16_bn; its classifier was designed for 224 px inputs (512x7x7
features), and its AdaptiveAvgPool2d(7) replicates the 1x1 map a 32 px CIFAR image leaves, so
CIFAR works (as in the paper's code) at the full 134M-parameter cost. `resnet101` keeps
torchvision's ImageNet stem (7x7 stride-2 conv + max-pool), also as in the paper.
"""
from __future__ import annotations

from gravac.models.registry import MODELS


# The paper's setting of each preset (32 GPUs; per-worker batch and learning rate as in
# conf/model/<name>.yaml) and the CPU-scale study of its family: gravac/scale.py warns from these.
PAPER_CNN = dict(workers=32, batch_size=32, lr=0.1, device="cuda")


@MODELS.register("resnet101", task="classification", paper=PAPER_CNN, cpu_preset="experiment=mini_resnet")
def resnet101(cfg, num_classes: int):
    """the paper's torchvision ResNet101 (42.5M parameters with 10 classes)"""
    from torchvision.models import resnet101 as build
    return build(weights=None, num_classes=num_classes)


@MODELS.register("vgg16", task="classification", paper=PAPER_CNN, cpu_preset="experiment=mini_vgg")
def vgg16(cfg, num_classes: int):
    """the paper's torchvision VGG16 with batch norm (134M parameters)"""
    from torchvision.models import vgg16_bn
    return vgg16_bn(weights=None, num_classes=num_classes)
