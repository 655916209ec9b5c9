"""What every adaptivity policy shares: the step interface and per-worker compression plumbing.

A Method gets each local worker's flat gradient for the step, decides a CF (the same on every
worker), compresses with per-worker error feedback, communicates through the Group and returns
the averaged gradient plus the step's record (CF, floats sent, wire bytes, timings).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from compressors import ErrorFeedback, Layerwise, Payload, build_compressor
from gravac.comm import CommStats, Group
from gravac.schema import CompressorCfg, RunConfig


@dataclass
class StepContext:
    """Facts about the current step a method may decide on."""
    step: int                 # 0-based global step
    epoch: float              # epochs completed by the workers (fractional)
    lr: float
    lr_decayed: bool          # the learning rate dropped at this step
    compute_s: float          # cluster compute time of this step (slowest worker)
    samples: int              # samples (or sequences) processed by the whole cluster this step


@dataclass
class StepResult:
    """The averaged gradient and what the step cost."""
    grad: torch.Tensor
    cf: float                                  # CF actually sent (1 = dense)
    floats_sent: float                         # per worker (mean over workers when they differ)
    comm: CommStats = field(default_factory=CommStats)
    compress_s: float = 0.0                    # slowest worker's compression time
    extra: dict[str, Any] = field(default_factory=dict)   # method-specific record fields


class Method:
    """Base class: holds the group, the parameter layout and the run seed."""
    name = "base"

    def __init__(self, cfg: RunConfig, group: Group, sizes: list[int], device: torch.device):
        self.cfg, self.group, self.sizes, self.device = cfg, group, sizes, device
        self.numel = sum(sizes)
        self.seed = cfg.train.seed

    def step(self, grads: list[torch.Tensor], ctx: StepContext) -> StepResult:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def step_seed(self, step: int, level: int = 0, rank: int = 0) -> int:
        """Seed for a compressor's randomness: shared by all workers unless `rank` differs."""
        return (self.seed * 1_000_003 + step * 101 + level * 7 + rank * 7_919) % (2**62)


def make_compressor(cfg: CompressorCfg, sizes: list[int]):
    """The configured compressor, wrapped per layer when granularity=layer."""
    options: dict[str, Any] = {}
    if cfg.name == "dgc":
        options["sample_ratio"] = cfg.sample_ratio
    elif cfg.name == "redsync":
        options["max_iters"] = cfg.max_iters
    elif cfg.name == "randomk":
        options["shared_indices"] = cfg.shared_indices
    comp = build_compressor(cfg.name, **options)
    return Layerwise(comp, sizes) if cfg.granularity == "layer" else comp


class CompressingMethod(Method):
    """A method that compresses with one compressor and error feedback per worker per level."""

    levels = 1

    def __init__(self, cfg, group, sizes, device):
        super().__init__(cfg, group, sizes, device)
        c = cfg.compressor
        self.compressor = make_compressor(c, sizes)
        self.shared_seed = c.name != "randomk" or c.shared_indices
        momentum = cfg.train.momentum if c.momentum_correction else 0.0
        self.memories = [[ErrorFeedback(self.numel, device=device, enabled=c.error_feedback, momentum=momentum)
                          for _ in group.local_ranks] for _ in range(self.levels)]

    def seed_for(self, step: int, level: int, rank: int) -> int:
        """Shared-index compressors use one seed per step; independent Random-k one per rank."""
        return self.step_seed(step, level, 0 if self.shared_seed else rank + 1)

    def compress_all(self, grads, cf: float, step: int, level: int = 0) -> tuple[list[torch.Tensor], list[Payload], float]:
        """Compensate and compress each local worker's gradient; returns the slowest time."""
        comps, payloads, slowest = [], [], 0.0
        for w, (g, rank) in enumerate(zip(grads, self.group.local_ranks)):
            t0 = time.perf_counter()
            comp = self.memories[level][w].compensate(g)
            try:
                p = self.compressor.compress(comp, cf, seed=self.seed_for(step, level, rank))
            except ValueError as e:
                raise_diverged(e, step, self.name)
            slowest = max(slowest, time.perf_counter() - t0)
            comps.append(comp)
            payloads.append(p)
        return comps, payloads, slowest

    def state_dict(self) -> dict:
        return {"memories": [[m.state_dict() for m in lvl] for lvl in self.memories]}

    def load_state_dict(self, state: dict) -> None:
        for lvl, saved in zip(self.memories, state["memories"]):
            for m, s in zip(lvl, saved):
                m.load_state_dict(s)


def raise_diverged(err: Exception, step: int, method: str):
    """Turn a compressor's NaN/Inf complaint into the run's one-line divergence error."""
    from gravac.errors import DivergedError
    if "nan" in str(err).lower() or "inf" in str(err).lower():
        raise DivergedError(f"step {step}: gradient contains NaN/Inf (method={method}); "
                            "lower train.lr or enable train.grad_clip") from None
    raise err


def cluster_gain(group: Group, comps: list[torch.Tensor], payloads: list[Payload]) -> float:
    """Compression gain over the cluster, Σ||C(g_w)||² / Σ||g_w||², for the records only.

    Computed outside the timed compression and exchanged as bookkeeping: it costs a pass over
    the gradient that a static method would not otherwise make, so it must not inflate its times.
    """
    rows = [[float(torch.dot(p.values, p.values)), float(torch.dot(c, c))]
            for c, p in zip(comps, payloads)]
    rows = group.bookkeeping(rows)
    total = sum(r[1] for r in rows)
    return sum(r[0] for r in rows) / total if total > 0 else 1.0
