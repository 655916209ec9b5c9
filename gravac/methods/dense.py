"""Dense SGD: every worker all-reduces its full gradient every step (the baseline)."""
from __future__ import annotations

from gravac.methods.base import Method, StepContext, StepResult


class Dense(Method):
    """All-reduce the full gradient; CF 1, M floats per worker per step."""
    name = "dense"

    def step(self, grads, ctx: StepContext) -> StepResult:
        avg, comm = self.group.allreduce_mean(grads)
        return StepResult(grad=avg, cf=1.0, floats_sent=float(self.numel), comm=comm)
