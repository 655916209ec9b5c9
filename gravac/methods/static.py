"""Static compression: one compressor at one fixed CF every step, with error feedback."""
from __future__ import annotations

from compressors import COMPRESSORS
from gravac.methods.base import METHODS, CompressingMethod, StepContext, StepResult


@METHODS.register("static", doc="one compressor at compressor.cf every step, with error feedback")
class Static(CompressingMethod):
    """Compress every worker's compensated gradient at compressor.cf and average the payloads.

    The record also carries the compression gain ||C(g)||²/||g||² (summed over workers), the
    quantity GraVAC adapts on, so static runs at several CFs show how it evolves (paper Figs 4-6).
    """
    name = "static"
    order = 1
    record_gain = True

    def step(self, grads, ctx: StepContext) -> StepResult:
        cf = self.compressor_cls.scheduled_cf(self.comp_cfg, self.comp_cfg.cf, ctx.epoch)
        c = self.compress_all(grads, cf, ctx.step)
        return self.finish(c)

    @classmethod
    def label(cls, cfg, comp) -> str:
        return f"{COMPRESSORS[comp.name].label} {comp.cf:g}x"

    @classmethod
    def cf_text(cls, cfg, comp) -> str:
        return f"{comp.cf:g}x"

    @classmethod
    def ignores(cls, cfg, comp):
        return []

    @classmethod
    def sort_values(cls, cfg, comp):
        return [comp.cf]

    @classmethod
    def describe(cls, cfg, comp):
        return {**super().describe(cfg, comp), "family": comp.name}   # one colour family per compressor
