"""MiCRO (Yoon & Oh, arXiv 2310.00967): exclusive fixed partitions, threshold scaling, global
density. What it shares with ExDyna (the exclusive selection, the threshold rules, the records)
is `Exclusive` in gravac/methods/exdyna.py, whose docstring describes both."""
from __future__ import annotations

from gravac.methods.base import METHODS
from gravac.methods.exdyna import Exclusive, MicroCfg, equal_split


@METHODS.register("micro", MicroCfg, doc="MiCRO: exclusive fixed partitions, threshold scaling, global density")
class Micro(Exclusive):
    """MiCRO: N equal contiguous partitions, rotated over the workers every step."""
    name = "micro"
    title = "MiCRO"

    def bounds(self):
        sizes = equal_split(self.numel, self.group.world)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [(s, s + z) for s, z in zip(starts, sizes)]
