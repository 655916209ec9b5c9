"""L-GreCo over Accordion (the paper's "complementary to adaptive algorithms" setting; public code
LGrCo/L-GreCo, hooks/lgreco_accordion_hook.py): Accordion decides per layer between `cf_low`
(critical regime) and `cf_high`, and the total error of that per-layer assignment, instead of a
uniform default's, is the budget L-GreCo's DP redistributes over the candidates.

Accordion is this suite's (gravac/methods/accordion.py, `Regimes`: rank 0's accumulated gradient
norms, checks every `switch_freq` epochs against `eta`, low compression after learning-rate decays,
broadcast). L-GreCo is gravac/methods/lgreco.py (solve every `period` steps on rank 0's window).

Differences from the public code, and why:
- The code runs Accordion's check inside the DP's adjustment (every adjust_freq steps, on the norm
  of the last acc_iter steps' accumulated gradient, no learning-rate rule); here Accordion keeps its
  own epoch checks and learning-rate rule (its published algorithm, as method=accordion), and when
  its regimes change the layers take Accordion's own levels until L-GreCo's next solve
  redistributes them (the budget is always the regimes in force at the solve).
- CFs instead of PowerSGD ranks (code: accordion_min 20 / accordion_max 48 ranks); `cf_low` 10 and
  `cf_high` 100 are ours, both must be among the candidates.
"""
from __future__ import annotations

from dataclasses import dataclass

from gravac.core.registry import option
from gravac.methods.accordion import RegimeCfg, Regimes
from gravac.methods.base import METHODS, RunStats, StepContext, StepResult
from gravac.methods.lgreco import LGreco, LGrecoCfg


@dataclass
class LGrecoAccordionCfg(RegimeCfg, LGrecoCfg):
    """Accordion's regime options and L-GreCo's; method.default_cf is unused (Accordion sets the budget)."""
    cf_low: float = option(10.0, check=lambda v: v >= 1, valid=">= 1", doc="Accordion's CF in critical regimes")
    cf_high: float = option(100.0, check=lambda v: v >= 1, valid=">= 1", doc="Accordion's CF otherwise")

    def errors(self, prefix: str) -> list[str]:
        out = [e for e in super().errors(prefix) if ".default_cf=" not in e]
        cands = [float(c) for c in self.candidates] if isinstance(self.candidates, (list, tuple)) else []
        for key in ("cf_low", "cf_high"):
            if float(getattr(self, key)) not in cands:
                out.append(f"{prefix}.{key}={getattr(self, key):g} must be one of {prefix}.candidates="
                           f"{list(self.candidates)}, so that Accordion's levels are always a feasible choice")
        if self.cf_high < self.cf_low:
            out.append(f"{prefix}.cf_high={self.cf_high:g} must be >= {prefix}.cf_low={self.cf_low:g}")
        return out


@METHODS.register("lgreco_accordion", LGrecoAccordionCfg,
                  doc="L-GreCo redistributing Accordion's per-layer low/high CFs under their total error")
class LGrecoAccordion(LGreco):
    """L-GreCo whose budget is the error of Accordion's per-layer levels; see module doc."""
    name = "lgreco_accordion"
    order = 4

    def __init__(self, cfg: LGrecoAccordionCfg, compressor, env):
        super().__init__(cfg, compressor, env)
        self.regimes = Regimes(cfg, self.group, list(self.sizes))
        self.in_force = list(self.regimes.low)

    @staticmethod
    def start_cf(cfg) -> float:
        """Every layer starts in low compression, as Accordion's."""
        return float(cfg.cf_low)

    def accordion_cfs(self) -> list[float]:
        return [float(self.cfg.cf_low if low else self.cfg.cf_high) for low in self.regimes.low]

    def baseline(self) -> list[int]:
        return [self.cands.index(cf) for cf in self.accordion_cfs()]

    def before(self, grads, ctx: StepContext) -> dict:
        """Accordion's regimes for this step; on a change its own levels until the next solve."""
        extra = self.regimes.decide(grads, ctx)
        if self.regimes.low != self.in_force:
            self.in_force = list(self.regimes.low)
            if self.accordion_cfs() != self.layer_cfs:
                self.layer_cfs, self.announced = self.accordion_cfs(), False
        return extra

    def after(self, res: StepResult) -> None:
        self.regimes.after(res.grad)

    def explain(self, stats: RunStats) -> str | None:
        acc = self.regimes.explain(stats, f"{self.cfg.cf_low:g}x", f"{self.cfg.cf_high:g}x", self.numel)
        return f"{super().explain(stats)}. Budget from {acc}" if acc else super().explain(stats)

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self.regimes.state_dict(), "in_force": list(self.in_force)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.regimes.load_state_dict(state, self.device)
        self.in_force = list(state["in_force"])

    @classmethod
    def label(cls, cfg, comp) -> str:
        return f"L-GreCo + Accordion ({comp.name} {cfg.cf_low:g}x/{cfg.cf_high:g}x)"

    @classmethod
    def cf_text(cls, cfg, comp) -> str:
        return f"{min(cfg.candidates):g}x–{max(cfg.candidates):g}x per layer"

    @classmethod
    def sort_values(cls, cfg, comp):
        return [cfg.cf_low, cfg.cf_high]

    @classmethod
    def ignores(cls, cfg, comp):
        return ["compressor.cf", "method.default_cf", "method.bits"]
