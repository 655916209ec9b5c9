"""COVAP's coarse-grained filter as a DDP comm hook (the same filter as `method=covap`).

    state = CovapState(None, drop_rate=4)           # R: one shard in 4 is sent per step
    ddp_model.register_comm_hook(state, covap_hook)

DDP's own buckets are the layout (choose the count with `bucket_cap_mb`; COVAP wants about ten or
more); shard counts, the rotating filter and the error-feedback schedule are those of
gravac/methods/covap.py, with `state.iteration` as the iteration. A hook sees one bucket at a
time, so the layout (every bucket's size, by index) is learnt from a whole step: a bucket sends
dense (with its residual) until the previous step saw it with its current size, i.e. on step 0
and on the step DDP rebuilds its buckets. A kept shard is all-reduced alone (every rank keeps
the same one: no indices); a bucket with nothing kept returns zeros without communicating.
`drop_rate` must be an integer (profile your communication/computation ratio and take its
ceiling): "auto" needs the run's clock of bench/run.py. `state.last` adds `drop_rate`,
`ef_factor`, `kept_shards` and `filtered` (false while the layout was being learnt) to the
fields of gravac.hooks; `cf` counts a step that sent nothing as one float. As every hook state,
its options are checked like config and compared across ranks at the first bucket (gravac.hooks).
"""
from __future__ import annotations

import torch

from compressors import Payload
from gravac.core.check import checked
from gravac.hooks.state import CompressionState, make_hook
from gravac.methods.covap import (
    CovapCfg,
    compensate,
    ef_defaults,
    ef_factor,
    shard_counts,
    take,
)

__all__ = ["CovapState", "covap_hook"]


class CovapState(CompressionState):
    """Per bucket: residual, compensation f·r + g, and the shard the filter keeps this step.

    Keywords: `drop_rate` (R, an integer >= 1), `ef` ("schedule", "constant": f = 1, "off"),
    `ef_init` and `decay_step` (default: the code's, by R).
    """

    def __init__(self, process_group=None, *, drop_rate: int, ef: str = "schedule", ef_init: float | None = None,
                 decay_step: int | None = None):
        if drop_rate in ("auto", "overlap"):
            raise ValueError(f"covap hook: drop_rate={drop_rate!r} needs bench/run.py's clock; give an integer R "
                             "(the ceiling of your profiled communication/computation ratio)")
        cfg = checked(CovapCfg, dict(name="covap", drop_rate=drop_rate, buckets=0, ef=ef, ef_init=ef_init,
                                     decay_step=decay_step), "covap")
        super().__init__(process_group, None)
        self.rate, self.ef = cfg.drop_rate, cfg.ef
        d_init, d_step = ef_defaults(cfg.drop_rate)
        self.ef_init = d_init if cfg.ef_init is None else cfg.ef_init
        self.decay_step = d_step if cfg.decay_step is None else cfg.decay_step
        self.residuals: dict[int, torch.Tensor] = {}
        self.layout: dict[int, tuple[int, int, int]] = {}    # index -> (numel, shards, first global shard)

    def options(self) -> dict:
        return {**super().options(), "drop_rate": self.rate, "ef": self.ef, "ef_init": self.ef_init,
                "decay_step": self.decay_step}

    def _reset_step(self) -> None:
        super()._reset_step()
        self._seen: dict[int, int] = {}
        self._kept, self._filtered = 0, True

    def factor(self) -> float:
        return 1.0 if self.ef == "constant" else ef_factor(self.iteration, self.ef_init, self.decay_step)

    def slot(self, bucket) -> torch.Tensor:
        """The bucket's residual (zero when new or when DDP changed the bucket's size)."""
        buf, idx = bucket.buffer(), bucket.index()
        r = self.residuals.get(idx)
        if r is None or r.shape != buf.shape or r.dtype != buf.dtype or r.device != buf.device:
            r = self.residuals[idx] = torch.zeros_like(buf)
        return r

    def choose(self, slot: torch.Tensor, grad: torch.Tensor, bucket) -> Payload | None:
        idx, n = bucket.index(), grad.numel()
        self._seen[idx] = n
        acc = compensate(slot, grad, self.factor(), self.ef)
        known = self.layout.get(idx)
        if known is None or known[0] != n:                       # layout not learnt yet: dense
            self._filtered = False
            p = Payload(acc.clone(), None, n)
            acc.zero_()
            return p
        _, c, start = known
        j = (-(start + self.iteration)) % self.rate
        if j >= c:
            return None
        self._kept += 1
        return Payload(take(acc, j, c), torch.arange(j, n, c, device=grad.device), n, shared=True)

    def send(self, p: Payload | None, out: torch.Tensor) -> torch.futures.Future:
        """A dropped bucket: zeros, no collective."""
        if p is not None:
            return super().send(p, out)
        self._numel += out.numel()
        fut = torch.futures.Future()
        fut.set_result(out.zero_())
        return fut

    def end_step(self) -> None:
        """Record the step; learn the layout from the sizes this step saw when they changed."""
        last = {"step": self.iteration, "floats_sent": self._floats, "wire_bytes": self._wire, "numel": self._numel,
                "cf": self._numel / max(self._floats, 1.0), "drop_rate": self.rate, "ef_factor": self.factor(),
                "kept_shards": self._kept, "filtered": self._filtered}
        if {i: v[0] for i, v in self.layout.items()} != self._seen:
            order = sorted(self._seen)
            counts = shard_counts([self._seen[i] for i in order], self.rate)
            starts = [sum(counts[:k]) for k in range(len(counts))]
            self.layout = {i: (self._seen[i], c, s) for i, c, s in zip(order, counts, starts)}
        self.last = last
        self.floats_total += self._floats
        self.iteration += 1
        self._reset_step()


covap_hook = make_hook(CovapState)
