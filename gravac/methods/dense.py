"""Dense SGD: every worker all-reduces its full gradient every step (the baseline)."""
from __future__ import annotations

from gravac.methods.base import METHODS, Method, StepContext, StepResult


@METHODS.register("dense", doc="all-reduce of the full gradient (the baseline)")
class Dense(Method):
    """All-reduce the full gradient; CF 1, M floats per worker per step."""
    name = "dense"
    order = 0

    def step(self, grads, ctx: StepContext) -> StepResult:
        avg, comm = self.group.allreduce_mean(grads)
        return StepResult(grad=avg, cf=1.0, floats_sent=comm.floats, comm=comm)

    @classmethod
    def label(cls, cfg, comp) -> str:
        return "Dense"

    @classmethod
    def cf_text(cls, cfg, comp) -> str:
        return "1x"
