"""MergeComp's config, its groups of tensors, and the partitions of the ready-ordered tensors into
groups with the searches over them (binary as the public code, exhaustive, greedy: pure
functions); the method itself is gravac/methods/mergecomp.py.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from compressors import Payload, option
from gravac.core.schema import MethodCfg

SEARCHES = ("binary", "exhaustive", "greedy", "none")
MAX_RECORDED = 200          # candidates' modelled times kept in a record


@dataclass
class MergeCompCfg(MethodCfg):
    """y groups (0: one per tensor), how the partition is searched, and the code's probe constants."""
    groups: int = option(2, check=lambda v: v >= 0, valid=">= 0 (0: one group per parameter tensor)")
    search: str = option("binary", choices=SEARCHES)
    warmup: int = option(5, check=lambda v: v >= 0, valid=">= 0")            # rounds of probe_steps (code: 5)
    probe_steps: int = option(20, check=lambda v: v >= 1, valid=">= 1")      # steps per probe (code: 20)
    search_step: int = option(2, check=lambda v: v >= 1, valid=">= 1")       # code: scheduler_step 2
    max_candidates: int = option(100_000, check=lambda v: v >= 1, valid=">= 1")   # exhaustive search cap

    def errors(self, prefix: str) -> list[str]:
        if self.search == "binary" and self.groups != 2:
            return [f"{prefix}.search=binary searches one split into 2 groups (the public code); set "
                    f"{prefix}.groups=2, or {prefix}.search=exhaustive|greedy|none for groups={self.groups}"]
        if self.search in ("exhaustive", "greedy") and self.groups in (0, 1):
            return [f"{prefix}.groups={self.groups} leaves no partition to search; set {prefix}.search=none"]
        return []


def payload_messages(net, world: int, p: Payload) -> list[float]:
    """Modelled seconds of the messages Group.aggregate sends for payload p."""
    if getattr(p, "packed", False):          # a quantizer's bytes, all-gathered (no count)
        return [net.allgather(p.wire_bytes(), world)]
    if getattr(p, "half", False):            # a 16-bit cast, all-reduced in 16 bits
        return [net.allreduce(p.wire_bytes(), world)]
    es = p.values.element_size()
    if p.indices is None:
        return [net.allreduce(p.numel * es, world)]
    if p.shared:
        return [net.allreduce(p.nnz * es, world)]
    return net.sparse_allgather(p.nnz * (es + p.index_bytes()), world)


@dataclass
class Group_:
    """One group: its parameters (ascending), where its elements lie in the flat gradient."""
    params: list[int]
    index: torch.Tensor | None      # flat positions (None: the contiguous slice lo:hi)
    lo: int
    hi: int

    @property
    def numel(self) -> int:
        return self.hi - self.lo if self.index is None else int(self.index.numel())

    def take(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.lo:self.hi] if self.index is None else x[self.index]

    def put(self, out: torch.Tensor, v: torch.Tensor) -> None:
        if self.index is None:
            out[self.lo:self.hi] = v
        else:
            out[self.index] = v


# --- partitions: pure functions -------------------------------------------------------------
def default_cuts(n: int, y: int) -> list[int]:
    """The code's default partition of n tensors into y groups: cuts at i*(n//y), the last group
    taking the remainder; as cut points [0, ..., n]."""
    step = n // y
    return [0] + [i * step for i in range(1, y)] + [n]


def split_cuts(n: int, x: int) -> list[int]:
    """Two groups, the first holding x tensors (x >= n: one group, as the code's partition([n]))."""
    return [0, n] if x >= n else [0, x, n]


def binary_search(n: int, step: int, probed: dict[int, float]) -> tuple[str, int]:
    """The code's binary search of the split x, replayed over the times probed so far: ("probe", x)
    for the next split to time, or ("done", x) with the fastest probed 1 < x < n-1 (n//2 if none)."""
    start, end = 1, n - 1
    while start < end - 1:
        mid = (start + end) // 2
        for x in (mid, mid + step):
            if x not in probed:
                return "probe", x
        if probed[mid] > probed[mid + step]:
            start = mid + step
        else:
            end = mid
    best, best_t = n // 2, math.inf
    for x, t in probed.items():           # probing order; strict <: the first of equal times
        if 1 < x < n - 1 and t < best_t:
            best, best_t = x, t
    return "done", best


def cuts_text(cuts) -> str:
    """A partition as a record key: "0,19,22"."""
    return ",".join(str(int(c)) for c in cuts)


def candidates(n: int, y: int) -> int:
    """Partitions of n tensors into y non-empty contiguous groups."""
    return math.comb(n - 1, y - 1)


def exhaustive(n: int, y: int, cost) -> tuple[list[int], dict[tuple, float]]:
    """The partition into y groups with the lowest cost(cuts) (first of equal ones), and every cost."""
    times = {}
    for inner in itertools.combinations(range(1, n), y - 1):
        cuts = (0, *inner, n)
        times[cuts] = cost(list(cuts))
    best = min(times, key=lambda c: times[c])
    return list(best), times


def greedy(n: int, y: int, cost) -> tuple[list[int], dict[tuple, float]]:
    """From one group, add the cut that lowers cost(cuts) most, y-1 times; every cost evaluated."""
    cuts, times = [0, n], {}
    for _ in range(y - 1):
        trials = {}
        for x in range(1, n):
            if x not in cuts:
                c = tuple(sorted(cuts + [x]))
                trials[c] = times[c] = cost(list(c))
        cuts = list(min(trials, key=lambda c: trials[c]))
    return cuts, times
