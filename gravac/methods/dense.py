"""Dense SGD: every worker all-reduces its full gradient every step (the baseline)."""
from __future__ import annotations

from gravac.methods.base import METHODS, Method, StepContext, StepResult
from gravac.cluster.timeline import Piece


@METHODS.register("dense", doc="all-reduce of the full gradient (the baseline)")
class Dense(Method):
    """All-reduce the full gradient; CF 1, M floats per worker per step.

    With DDP-style buckets (from the run's clock), time is modelled as one all-reduce per bucket,
    each sent as soon as its gradients are ready, as DDP does; the values are reduced in one call.
    """
    name = "dense"
    order = 0

    def step(self, grads, ctx: StepContext) -> StepResult:
        return allreduce_dense(self, grads)

    @classmethod
    def label(cls, cfg, comp) -> str:
        return "Dense"

    @classmethod
    def cf_text(cls, cfg, comp) -> str:
        return "1x"


def allreduce_dense(method: Method, grads) -> StepResult:
    """The dense step of `method`: every worker's full gradient averaged, in DDP's buckets when the
    run's clock has them (one timeline piece per bucket), CF 1."""
    buckets = method.env.buckets
    sizes = [sum(method.sizes[i] for i in b) for b in buckets] if buckets else None
    avg, comm = method.group.allreduce_mean(grads, bucket_elements=sizes)
    pieces = [Piece(b, 0.0, [m]) for b, m in zip(buckets, comm.messages)] if buckets else None
    return StepResult(grad=avg, cf=1.0, floats_sent=comm.floats, comm=comm, pieces=pieces)
