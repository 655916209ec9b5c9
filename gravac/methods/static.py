"""Static compression: one compressor at one fixed CF every step, with error feedback."""
from __future__ import annotations

from compressors import dgc_warmup_cf
from gravac.methods.base import CompressingMethod, StepContext, StepResult, cluster_gain


class Static(CompressingMethod):
    """Compress every worker's compensated gradient at compressor.cf and average the payloads.

    The record also carries the compression gain ||C(g)||²/||g||² (summed over workers), the
    quantity GraVAC adapts on, so static runs at several CFs show how it evolves (paper Figs 4-6).
    """
    name = "static"

    def step(self, grads, ctx: StepContext) -> StepResult:
        c = self.cfg.compressor
        cf = dgc_warmup_cf(c.cf, ctx.epoch, c.warmup_epochs) if c.warmup_epochs > 0 else c.cf
        comps, payloads, compress_s = self.compress_all(grads, cf, ctx.step)
        avg, comm = self.group.aggregate(payloads)
        gain = cluster_gain(self.group, comps, payloads)
        for mem, comp, p in zip(self.memories[0], comps, payloads):
            mem.update(comp, p)
        nnz = sum(p.nnz for p in payloads) / len(payloads)
        return StepResult(grad=avg, cf=self.numel / nnz, floats_sent=nnz, comm=comm, compress_s=compress_s,
                          extra={"gain": gain})
