"""Model zoo: the paper's networks (torchvision ResNet101 and VGG16-BN, a 2-layer LSTM LM) and
CPU-sized minis of the same families, registered by name in `MODELS` (see registry.py).
`build_model(cfg, num_classes, task)` is the one entry point.
"""
from __future__ import annotations

from gravac.models.cnn_mini import ResNetMini, VGGMini
from gravac.models.lstm import LSTMLanguageModel
from gravac.models.registry import MODELS, build_model, count_parameters

__all__ = ["MODELS", "build_model", "count_parameters", "ResNetMini", "VGGMini", "LSTMLanguageModel"]
