"""The model registry: name -> builder `(cfg, num_classes) -> nn.Module`, config class and task.

A model plug-in registers its builder with `@MODELS.register(name, ItsCfg, task=...)`, where task
is "classification" (image datasets) or "lm" (language-model datasets); `num_classes` is the
vocabulary size for an LM.
"""
from __future__ import annotations

from torch import nn

from compressors.registry import Registry
from gravac.schema import ModelCfg

MODELS = Registry("model", ModelCfg)


def build_model(cfg: ModelCfg, num_classes: int, task: str) -> nn.Module:
    """Build cfg.name for `num_classes` outputs; ValueError on an unknown name or a model/task
    mismatch. Initialisation uses torch's global RNG: seed it first."""
    from gravac.registry import registries
    registries()
    if cfg.name not in MODELS:
        raise ValueError(f"unknown model {cfg.name!r}; choose one of: {', '.join(MODELS.names())}")
    entry = MODELS[cfg.name]
    if task != entry.extra["task"]:
        fits = ", ".join(e.name for e in MODELS.entries() if e.extra["task"] == task) or "none"
        raise ValueError(f"model {cfg.name!r} is for {entry.extra['task']} but the dataset's task is {task!r}; "
                         f"models for {task!r}: {fits}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    return entry.target(cfg, num_classes)


def count_parameters(model: nn.Module) -> int:
    """Number of distinct trainable parameter elements (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
