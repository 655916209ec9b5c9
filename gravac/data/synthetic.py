"""A deterministic, learnable image-classification task generated from a seed (no files).

Each class has a smooth random prototype (low-resolution Gaussian noise upsampled bilinearly);
a sample is its class prototype with a random contrast and a random circular shift, plus smooth
noise of the same kind and white pixel noise, both scaled by `noise`. Being smooth, prototype and
distractor share a spectrum, so a CNN must learn the class shapes: it beats chance within a few
hundred steps without reaching 100% at once. Stored as uint8 like CIFAR, so the same batching,
augmentation and normalisation (with the generated train set's channel mean/std) apply.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dataclasses import dataclass

from gravac.core.registry import option
from gravac.data.base import ImageDataset
from gravac.data.files import DataError
from gravac.data.registry import DATASETS
from gravac.core.schema import DatasetCfg


def _smooth(n: int, size: int, res: int, gen: torch.Generator) -> torch.Tensor:
    """n smooth random 3-channel fields of size x size, each with zero mean and unit std."""
    low = torch.randn(n, 3, res, res, generator=gen)
    f = F.interpolate(low, size=(size, size), mode="bicubic", align_corners=False)
    f = f - f.mean(dim=(1, 2, 3), keepdim=True)
    return f / f.std(dim=(1, 2, 3), keepdim=True).clamp_min(1e-6)


def _samples(protos: torch.Tensor, n: int, noise: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    k, _, s, _ = protos.shape
    y = torch.arange(n) % k
    y = y[torch.randperm(n, generator=gen)]                       # balanced classes, random order
    max_shift = max(1, s // 8)
    shifts = [(dy, dx) for dy in range(-max_shift, max_shift + 1) for dx in range(-max_shift, max_shift + 1)]
    bank = torch.stack([protos.roll(sh, dims=(2, 3)) for sh in shifts], dim=1)   # (k, shifts, 3, s, s)
    which = torch.randint(0, len(shifts), (n,), generator=gen)                    # circular shift per sample
    p = bank.flatten(0, 1).index_select(0, y * len(shifts) + which)
    contrast = 0.6 + 0.8 * torch.rand(n, 1, 1, 1, generator=gen)
    res = max(2, s // 4)
    x = contrast * p + noise * (_smooth(n, s, res, gen) + 0.5 * torch.randn(p.shape, generator=gen))
    img = (0.5 + 0.15 * x).clamp(0, 1).mul(255).round().to(torch.uint8)
    return img.permute(0, 2, 3, 1).contiguous().numpy(), y.numpy()


@dataclass
class SyntheticCfg(DatasetCfg):
    """A deterministic, learnable image-classification task generated from `seed` (no files)."""
    augment: bool = False
    num_classes: int = option(10, check=lambda v: v >= 2, valid=">= 2")
    image_size: int = option(16, check=lambda v: v >= 8, valid=">= 8")
    train_size: int = option(8192, check=lambda v: v >= 1, valid=">= 1")
    test_size: int = option(2048, check=lambda v: v >= 1, valid=">= 1")
    noise: float = option(1.0, check=lambda v: v >= 0, valid=">= 0")
    seed: int = 0


@DATASETS.register("synthetic", SyntheticCfg, task="classification",
                   doc="learnable images generated from a seed: no files, no download (the default)")
def load_synthetic(cfg: SyntheticCfg) -> ImageDataset:
    """Generate the task described by cfg (num_classes, image_size, train_size, test_size, noise, seed)."""
    k, s = int(cfg.num_classes), int(cfg.image_size)
    if k < 2 or s < 8 or cfg.train_size < 1 or cfg.test_size < 1 or cfg.noise < 0:
        raise DataError(f"synthetic dataset needs num_classes >= 2, image_size >= 8, train_size/test_size >= 1, "
                        f"noise >= 0; got {k}, {s}, {cfg.train_size}/{cfg.test_size}, {cfg.noise}")
    gen = torch.Generator().manual_seed(int(cfg.seed))
    protos = _smooth(k, s, max(2, s // 4), gen)
    train_x, train_y = _samples(protos, int(cfg.train_size), float(cfg.noise), gen)
    test_x, test_y = _samples(protos, int(cfg.test_size), float(cfg.noise), gen)
    f = torch.from_numpy(train_x).reshape(-1, 3).to(torch.float32) / 255.0
    std, mean = torch.std_mean(f, dim=0)
    return ImageDataset("synthetic", train_x, train_y, test_x, test_y, num_classes=k,
                        mean=mean.tolist(), std=std.clamp_min(1e-3).tolist(), augment=cfg.augment,
                        classes=[f"class{i}" for i in range(k)])
