"""Accordion with PowerSGD, its original setting (Agarwal et al., MLSys 2021): rank `rank_critical`
(2) for a layer in a critical regime, rank `rank` (1) otherwise.

The regime decision is Accordion's own (gravac/methods/accordion.py, `Regimes`: per parameter
tensor, checks every `switch_freq` epochs, η, low compression after learning-rate decays); only
what "low compression" means differs: a higher PowerSGD rank instead of a lower CF. Constants as
uw-mad-dash/Accordion (auto_scale.py: auto_scale_high = 2, auto_scale_low = 1; a layer starts at
the high rank). PowerSGD itself is gravac/methods/powersgd.py, with its differences from the
public code listed there; a layer switching rank gets a fresh Q and keeps its residual, as the
public code builds a new reducer on a switch. 1-D tensors are sent dense in both regimes.
"""
from __future__ import annotations

from dataclasses import dataclass

from gravac.core.registry import option
from gravac.methods.accordion import RegimeCfg, Regimes
from gravac.methods.base import METHODS, RunStats, StepContext, StepResult
from gravac.methods.powersgd import PowerSGD, PowerSGDCfg


@dataclass
class AccordionPowerSGDCfg(RegimeCfg, PowerSGDCfg):
    """PowerSGD's options (`rank`: the rank outside critical regimes) and Accordion's."""
    rank_critical: int = option(2, check=lambda v: v >= 1, valid=">= 1")   # rank in critical regimes

    def errors(self, prefix: str) -> list[str]:
        if self.rank_critical < self.rank:
            return [f"{prefix}.rank_critical={self.rank_critical} must be >= {prefix}.rank={self.rank}"]
        return []


@METHODS.register("accordion_powersgd", AccordionPowerSGDCfg, label="Accordion (PowerSGD)",
                  doc="Accordion switching PowerSGD ranks per layer (rank 2 critical / 1 otherwise)")
class AccordionPowerSGD(PowerSGD):
    """PowerSGD whose rank per tensor follows Accordion's regimes; see module doc."""
    name = "accordion_powersgd"
    order = 2

    def __init__(self, cfg: AccordionPowerSGDCfg, compressor, env):
        super().__init__(cfg, compressor, env)
        self.regimes = Regimes(cfg, self.group, list(self.sizes))

    def ranks(self, ctx: StepContext) -> list[int]:
        return [self.cfg.rank_critical if low else self.cfg.rank for low in self.regimes.low]

    def step(self, grads, ctx: StepContext) -> StepResult:
        extra = self.regimes.decide(grads, ctx)
        if ctx.step < self.cfg.start_step:
            res = super().step(grads, ctx)
            res.extra.update(extra)
        else:
            res = self.reduce(grads, self.ranks(ctx), ctx.step, extra=extra)
        self.regimes.after(res.grad)
        return res

    def explain(self, stats: RunStats) -> str | None:
        return self.regimes.explain(stats, f"rank {self.cfg.rank_critical}", f"rank {self.cfg.rank}", self.numel)

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self.regimes.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.regimes.load_state_dict(state, self.device)

    @classmethod
    def label(cls, cfg, comp) -> str:
        return f"Accordion (PowerSGD rank {cfg.rank_critical}/{cfg.rank})"

    @classmethod
    def cf_text(cls, cfg, comp) -> str:
        return f"rank {cfg.rank_critical}/{cfg.rank}"

    @classmethod
    def sort_values(cls, cfg, comp):
        return [cfg.rank_critical, cfg.rank]
