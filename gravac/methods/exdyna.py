"""MiCRO and ExDyna: exclusive gradient partitions, a threshold instead of a sort, global density.

This module holds what both share (`Exclusive`, the threshold rules) and ExDyna; MiCRO is
gravac/methods/micro.py.

Both (Yoon & Oh, MiCRO arXiv 2310.00967, ExDyna arXiv 2402.13781; public code kljp/exdyna,
cnn-lstm/gradient_reducers.py, MicroReducer and ExDynaReducer) split the flat gradient into N
partitions; at step t worker r selects only inside partition (t + r) mod N, so the workers'
selections are disjoint and their union is the sum of their counts (no gradient build-up). Each
worker keeps |g| >= threshold there (one pass, no sort) and sends one index when nothing passes.
Communication: all-gather the counts, all-gather the padded indices, all-reduce every worker's
values at the union (every worker contributes its own values at all K positions); error feedback
clears the union in every worker's residual. The density is global: K ~ d/cf over all workers,
each worker selecting about K/N. Compare with Top-k at the same global K (per-worker k = K/N).

Threshold (both, the code's constants): first step 1/(2 sqrt(k)) with k = floor(d/cf); after
that, with exam = K_prev/k: exam > 1.1 -> x1.005; 0.909 < exam <= 1.1 -> x1.00125; else x0.995.
MiCRO: N contiguous partitions, the first d mod N one element longer. ExDyna: 1024 blocks of
floor(d/1024) rounded down to a multiple of 32 elements, the remainder joins the last partition;
partitions of contiguous blocks, initially equal (the first 1024 mod N one block longer); before
each step's selection, for i = 0..N-2 in order, with k_acc = int(K_prev/N) and the previous
step's counts mapped to partitions: k_i/k_acc > 1.05 and k_{i+1}/k_acc < 0.95238 moves one
block from i to i+1 (symmetrically the other way), never leaving a partition below
min_blk = 1024/(4N) blocks; each move shifts int(block · K_prev/d) from one estimate to the other.

Differences from the public code, and why:
- Density: k = max(1, floor(d/cf)) (this suite's CF convention) where the code takes
  int(ratio · d); identical up to float rounding for cf = 1/ratio.
- Indices travel as int32 when d < 2^31 (the suite's sparse payloads do the same); the code
  sends int64. The count all-gather is counted in wire bytes (the code's bit count omits it).
- The code's third threshold branch (x0.9987 when exam <= 0) is unreachable (exam > 0.909
  there) and is left out.
- K_prev is the union size on every worker count; the code sets it to 0 on one worker (no
  all-reduce there), which would make the next exam 0.
- A gradient shorter than blocks x 32 (test models): the code's block size would be 0 and every
  partition but the last empty; here blocks shorter than 32 elements are used unaligned, and with
  d < blocks each element is a block. A partition never becomes empty (min_blk >= 1 for N <= 256).
- The cycle counter is the method's own step count (as the code's `iteration`), kept in
  checkpoints with the threshold, K_prev, the counts and the partition sizes.
- Momentum stays with the optimizer after averaging, as for every other method here (the code
  can apply it before the reduce, `optimizer_mom_before_reduce`).
- `method.threshold_start=calibrated` (ours; default `code`, the code's 1/(2 sqrt(k))): the first
  threshold is the mean over workers of the magnitude each would need to select its share of K
  in its first partition (one sort, at step 0 only; one float all-reduced). The code's start and
  +-0.5% steps leave the density 7-21x the target for the first ~100 steps on the CNN minis; the
  calibrated start begins at K but measured worse on mini_vgg (the gradients grow after step 0
  and the threshold follows at 0.5% a step; REPRODUCING.md, "ExDyna and MiCRO").
Records: `density_target` (1/cf), `density` (K/d), `density_error` |K/d - 1/cf|, `union` K,
`max_k`, `imbalance` (max_k · N / K - 1, the code's load inefficiency), `threshold`, `ks`
(per-worker counts in rank order) and, for ExDyna, `blocks_min`/`blocks_max` of the partitions.
floats_sent is K (each worker's contribution to the value all-reduce); wire bytes add the count
and the padded indices.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from compressors import ErrorFeedback, Payload, option, target_k
from compressors.arrays import above, native
from gravac.methods.base import METHODS, Method, RunStats, StepContext, StepResult, raise_diverged
from gravac.core.schema import MethodCfg

UP_FAST, UP_SLOW, DOWN = 1.005, 1.00125, 0.995     # threshold factors of the code
EXAM_HIGH, EXAM_LOW = 1.1, 0.909                     # K_prev/k bands of the code
MOVE_ABOVE, MOVE_BELOW = 1.05, 0.95238               # ExDyna: k_i/k_acc bands that move a block


def first_threshold(k: int) -> float:
    """The code's initial threshold 1/(2 sqrt(k)), k the global target count."""
    return 1.0 / (2.0 * math.sqrt(k))


def scale_threshold(thr: float, k_prev: int, k: int) -> float:
    """Online threshold scaling: raise it when the last step sent too much, lower it when too little."""
    exam = k_prev / k
    if exam > EXAM_HIGH:
        return thr * UP_FAST
    if exam > EXAM_LOW:
        return thr * UP_SLOW
    return thr * DOWN


def equal_split(total: int, parts: int) -> list[int]:
    """`parts` sizes summing to `total`, the first total mod parts one larger (the code's split)."""
    q, r = divmod(total, parts)
    return [q + 1 if i < r else q for i in range(parts)]


def block_layout(numel: int, blocks: int, align: int) -> tuple[int, int, int]:
    """(number of blocks, block size, remainder for the last partition) for a flat gradient."""
    if numel < blocks:
        return numel, 1, 0
    a = numel // blocks
    size = a - a % align if a >= align else a
    return blocks, size, numel - size * blocks


def rebalance(parts: list[int], ks: list[int], prev_cycle: int, k_prev: int, block: int, numel: int,
              min_blk: float) -> list[int]:
    """ExDyna's partition sizes (in blocks) for this step, from the previous step's per-worker
    counts `ks` (rank order) when worker r held partition (prev_cycle + r) mod N."""
    n = len(parts)
    parts = list(parts)
    kp = [0] * n
    for r, k in enumerate(ks):
        kp[(prev_cycle + r) % n] = k
    k_acc = int(k_prev / n)                 # >= 1: every worker sends at least one index
    shift = int(block * k_prev / numel)
    for i in range(n - 1):
        a, b = kp[i] / k_acc, kp[i + 1] / k_acc
        if a > MOVE_ABOVE and b < MOVE_BELOW and parts[i] - 1 >= min_blk:
            parts[i], parts[i + 1], kp[i], kp[i + 1] = parts[i] - 1, parts[i + 1] + 1, kp[i] - shift, kp[i + 1] + shift
        elif a < MOVE_BELOW and b > MOVE_ABOVE and parts[i + 1] - 1 >= min_blk:
            parts[i], parts[i + 1], kp[i], kp[i + 1] = parts[i] + 1, parts[i + 1] - 1, kp[i] + shift, kp[i + 1] - shift
    return parts


def select(x: torch.Tensor, lo: int, hi: int, thr: float, cycle: int) -> torch.Tensor:
    """Positions in [lo, hi) with |x| >= thr (one pass); one position when none passes."""
    scan = above(native(x[lo:hi]), thr, check=True)
    idx = torch.as_tensor(scan.idx, dtype=torch.int64)
    if idx.numel() == 0:
        return torch.tensor([lo + cycle % (hi - lo)], dtype=torch.int64)
    return idx + lo


@dataclass
class MicroCfg(MethodCfg):
    """MiCRO's options beyond compressor.cf (global density) and compressor.error_feedback: where
    the threshold starts (module docstring)."""
    threshold_start: str = option("code", choices=("code", "calibrated"))


@dataclass
class ExDynaCfg(MicroCfg):
    """ExDyna's block layout (the code: 1024 blocks, sizes a multiple of 32, min 1024/(4N) per partition)."""
    blocks: int = option(1024, check=lambda v: v >= 1, valid=">= 1")
    align: int = option(32, check=lambda v: v >= 1, valid=">= 1")


class Exclusive(Method):
    """Shared step of MiCRO and ExDyna; subclasses say where each partition lies this step."""
    compressor_keys = ("cf", "error_feedback")
    order = 6
    title = "exclusive"
    clock = staticmethod(time.perf_counter)

    def __init__(self, cfg, compressor, env):
        super().__init__(cfg, compressor, env)
        from gravac.core.errors import UserError
        if self.numel < self.group.world:
            raise UserError(f"method={self.name} needs at least one gradient element per worker "
                            f"({self.numel} < {self.group.world} workers)")
        self.k = target_k(self.numel, compressor.cf)
        self.memories = [ErrorFeedback(self.numel, device=self.device, enabled=compressor.error_feedback)
                         for _ in self.group.local_ranks]
        self.t, self.threshold, self.k_prev, self.ks = 0, first_threshold(self.k), 0, []

    # --- where the partitions lie ------------------------------------------------------------
    def bounds(self) -> list[tuple[int, int]]:
        """[lo, hi) of every partition this step (called once per step, before selection)."""
        raise NotImplementedError

    def step(self, grads, ctx: StepContext) -> StepResult:
        n, cycle = self.group.world, self.t
        if self.t > 0:
            self.threshold = scale_threshold(self.threshold, self.k_prev, self.k)
        bounds = self.bounds()
        comps, spans = [], []
        for w, g in enumerate(grads):
            t0 = self.clock()
            comps.append(self.memories[w].compensate(g))
            spans.append(self.clock() - t0)
        comm = self.calibrate(comps, bounds, spans) if self.t == 0 and self.cfg.threshold_start == "calibrated" else None
        picks = []
        for w, comp in enumerate(comps):
            lo, hi = bounds[(cycle + self.group.local_ranks[w]) % n]
            t0 = self.clock()
            try:
                picks.append(select(comp, lo, hi, self.threshold, cycle))
            except ValueError as e:
                raise_diverged(e, ctx.step, self.name)
            spans[w] += self.clock() - t0
        gathered, gather = self.group.allgather_indices(picks, self.numel)
        comm = gather if comm is None else comm + gather
        union = torch.cat(gathered).to(comps[0].device)
        sent = [c[union] for c in comps]                  # each worker's values at the union, gathered once
        vals, agg = self.group.allreduce_mean(sent)
        comm = comm + agg
        out = torch.zeros(self.numel, dtype=vals.dtype, device=vals.device)
        out[union] = vals
        for mem, c, v in zip(self.memories, comps, sent):
            mem.update(c, Payload(v, union, self.numel))
        ks = [int(i.numel()) for i in gathered]
        extra = self.record(ks, bounds)
        self.k_prev, self.ks, self.t = len(union), ks, self.t + 1
        res = StepResult(grad=out, cf=self.numel / comm.floats, floats_sent=comm.floats, comm=comm,
                         compress_s=max(spans), extra=extra)
        res.compress_model_s = self.model_seconds(grads[0], bounds, cycle, max(spans))
        return res

    def calibrate(self, comps, bounds, spans):
        """threshold_start=calibrated: the mean over workers of the |value| each would need to
        select its share of K in its first partition (one float all-reduced); returns its CommStats."""
        n, mine = self.group.world, []
        for w, comp in enumerate(comps):
            t0 = self.clock()
            lo, hi = bounds[self.group.local_ranks[w] % n]
            share = min(hi - lo, max(1, round(self.k * (hi - lo) / self.numel)))
            mine.append(comp[lo:hi].abs().topk(share, sorted=False).values.min().reshape(1).double())
            spans[w] += self.clock() - t0
        thr, comm = self.group.allreduce_mean(mine)
        self.threshold = float(thr)
        return comm

    def record(self, ks: list[int], bounds) -> dict:
        """The step's density, imbalance and threshold (module docstring, Records)."""
        union, n = sum(ks), len(ks)
        asked = 1.0 / self.comp_cfg.cf
        return {"density_target": asked, "density": union / self.numel,
                "density_error": abs(union / self.numel - asked), "union": union, "max_k": max(ks),
                "imbalance": max(ks) * n / union - 1.0, "threshold": self.threshold, "ks": ks}

    def model_seconds(self, g0, bounds, cycle: int, measured: float) -> float | None:
        """Selection time on the run's clock: the first step's rank-0 operation, calibrated once,
        scaled by the longest partition over the calibrated one (a threshold pass costs its length)."""
        costs = self.env.costs
        if costs is None:
            return None
        lens = [hi - lo for lo, hi in bounds]
        if not hasattr(self, "_ref_len"):
            self._ref_len = lens[cycle % len(lens)]
        lo, hi = bounds[cycle % len(lens)]
        mem, thr = self.memories[0], self.threshold
        key = f"{self.name}:select(numel={self.numel},world={self.group.world},cf={self.comp_cfg.cf:g})"
        base = costs.cost(key, lambda: select(mem.compensate(g0), lo, hi, thr, cycle), measured)
        return base * max(lens) / self._ref_len

    def state_dict(self) -> dict:
        return {"memories": [m.state_dict() for m in self.memories], "t": self.t, "threshold": self.threshold,
                "k_prev": self.k_prev, "ks": list(self.ks)}

    def load_state_dict(self, state: dict) -> None:
        for m, s in zip(self.memories, state["memories"]):
            m.load_state_dict(s)
        self.t, self.threshold, self.k_prev, self.ks = state["t"], state["threshold"], state["k_prev"], list(state["ks"])

    def explain(self, stats: RunStats) -> str | None:
        """How closely the global density followed the target, and how balanced the workers were."""
        recs = [r for r in stats.records if "density" in r]
        if not recs:
            return None
        dens = sum(r["density"] for r in recs) / len(recs)
        imb = sum(r["imbalance"] for r in recs) / len(recs)
        return (f"{self.title}: global density {dens:.3g} on average for {recs[0]['density_target']:.3g} asked "
                f"(mean |error| {sum(r['density_error'] for r in recs) / len(recs):.2g}), load imbalance "
                f"{imb:.2f} on average, threshold {recs[0]['threshold']:.3g} -> {recs[-1]['threshold']:.3g}")

    # --- what a configuration means ---------------------------------------------------------
    @classmethod
    def label(cls, cfg, comp) -> str:
        start = " (calibrated start)" if getattr(cfg, "threshold_start", "code") == "calibrated" else ""
        return f"{cls.title} {comp.cf:g}x global{start}"

    @classmethod
    def cf_text(cls, cfg, comp) -> str:
        return f"{comp.cf:g}x (global)"

    @classmethod
    def ignores(cls, cfg, comp):
        return ["compressor.granularity"]

    @classmethod
    def sort_values(cls, cfg, comp):
        return [comp.cf]

    @classmethod
    def state_bytes(cls, cfg, comp, numel, momentum):
        return 4 * numel * (2 if comp.error_feedback else 1)     # residual + the compensated gradient


@METHODS.register("exdyna", ExDynaCfg, doc="ExDyna: exclusive block partitions rebalanced online, threshold scaling")
class ExDyna(Exclusive):
    """ExDyna: partitions of contiguous blocks, one block moved between neighbours when their
    previous counts are out of balance."""
    name = "exdyna"
    title = "ExDyna"
    order = 7

    def __init__(self, cfg: ExDynaCfg, compressor, env):
        super().__init__(cfg, compressor, env)
        n = self.group.world
        self.n_blocks, self.block, self.rem = block_layout(self.numel, cfg.blocks, cfg.align)
        from gravac.core.errors import UserError
        if self.n_blocks < n:
            raise UserError(f"method.blocks={cfg.blocks} gives {self.n_blocks} blocks for {n} workers; "
                            "use at least one block per worker")
        self.min_blk = self.n_blocks / (4 * n)
        self.parts = equal_split(self.n_blocks, n)

    def bounds(self):
        if self.t > 0:
            self.parts = rebalance(self.parts, self.ks, self.t - 1, self.k_prev, self.block, self.numel, self.min_blk)
        out, pos = [], 0
        for i, p in enumerate(self.parts):
            hi = (pos + p) * self.block + (self.rem if i == len(self.parts) - 1 else 0)
            out.append((pos * self.block, hi))
            pos += p
        return out

    def record(self, ks, bounds):
        return {**super().record(ks, bounds), "blocks_min": min(self.parts), "blocks_max": max(self.parts)}

    def state_dict(self):
        return {**super().state_dict(), "parts": list(self.parts)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.parts = list(state["parts"])
