"""The model registry: name -> builder `(cfg, num_classes) -> nn.Module`, config class and task.

A model plug-in registers its builder with `@MODELS.register(name, ItsCfg, task=...)`, where task
is "classification" (image datasets) or "lm" (language-model datasets); `num_classes` is the
vocabulary size for an LM. The keywords are the fields of `ModelSpec`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from gravac.core.errors import UserError
from gravac.core.registry import Registry
from gravac.core.schema import ModelCfg

@dataclass(frozen=True)
class ModelSpec:
    """What a model registers beside its config and builder."""
    task: str                       # "classification" or "lm": must match the dataset's
    paper: Any = None               # the paper's setting (workers, batch_size, lr, device); see gravac/loop/scale.py
    cpu_preset: str = ""            # the CPU-scale study of its family, e.g. "experiment=mini_resnet"
    min_image_size: int = 0         # smallest square input (pixels) its poolings accept; 0 = any


MODELS = Registry("model", ModelCfg, spec=ModelSpec, package="gravac.models")


def build_model(cfg: ModelCfg, num_classes: int, task: str, image_size: int | None = None) -> nn.Module:
    """Build cfg.name for `num_classes` outputs; ValueError on an unknown name or a model/task
    mismatch, UserError when the dataset's `image_size` is below what the model's poolings accept
    (otherwise the first forward fails deep inside torch). Initialisation uses torch's global RNG:
    seed it first."""
    MODELS.load()
    if cfg.name not in MODELS:
        raise ValueError(f"unknown model {cfg.name!r}; choose one of: {', '.join(MODELS.names())}")
    entry = MODELS[cfg.name]
    if task != entry.spec.task:
        fits = ", ".join(e.name for e in MODELS.entries() if e.spec.task == task) or "none"
        raise ValueError(f"model {cfg.name!r} is for {entry.spec.task} but the dataset's task is {task!r}; "
                         f"models for {task!r}: {fits}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    least = entry.spec.min_image_size
    if image_size is not None and image_size < least:
        raise UserError(f"model={cfg.name} needs images of at least {least}x{least} pixels and the dataset's are "
                        f"{image_size}x{image_size}: set dataset.image_size={least} (synthetic data) or pick another model")
    return entry.target(cfg, num_classes)


def count_parameters(model: nn.Module) -> int:
    """Number of distinct trainable parameter elements (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
