"""Accordion (Agarwal et al., MLSys 2021): low compression in critical regimes, high otherwise.

Per layer (per parameter tensor; one regime for the whole model with compressor.granularity=flat)
the norm of an epoch's accumulated gradient is compared with the one of the previous check:
|prev − new| / prev ≥ η marks a critical regime -> cf_low, else cf_high. As in the public code
(uw-mad-dash/Accordion, main_bash_topk.py), checks run at the end of epochs 0, s, 2s, ...
(s = switch_freq): the first one has no previous norm and keeps every layer in low compression
(training starts in low compression), later ones compare epoch k·s with epoch (k−1)·s. After
every learning-rate decay all layers use low compression until the next check. A layer whose
previous norm is 0 counts as critical when its new norm is not (the public code gives it ratio 9).

Choices made here: the accumulated gradient is, with `accumulate`="local" (default), rank 0's own
uncompressed gradient, as in the public code; with "averaged" it is the averaged
post-communication gradient. The latter's epoch norm moves with the compression in force (with
error feedback an epoch at 1000x sends accumulated residuals, not the epoch's gradient), so every
regime switch looks like a critical regime at the next check: on a stationary synthetic gradient
it cycles low, low, high, ... while "local" stays high (tests/test_accordion.py). The sum runs
only over the steps of check epochs and is kept by rank 0 alone, which decides and broadcasts
(a small object once per check, not counted in the step's communication). Epoch boundaries come
from ctx.epoch (step / steps_per_epoch): the check for epoch e runs at the first step of epoch
e+1, before that step compresses. The residual of error feedback is kept across regime switches
(the public code's default, zero_memory off).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from gravac.core.registry import option
from gravac.methods.base import METHODS, CompressingMethod, RunStats, StepContext, StepResult
from gravac.core.schema import MethodCfg


@dataclass
class RegimeCfg(MethodCfg):
    """Accordion's regime detection, shared by every method that switches on it."""
    switch_freq: int = option(10, check=lambda v: v >= 1, valid=">= 1")     # epochs between checks (5 for LSTMs)
    eta: float = option(0.5, check=lambda v: v > 0, valid="> 0")            # relative norm change = critical
    accumulate: str = option("local", choices=("local", "averaged"))       # see the module docstring


@dataclass
class AccordionCfg(RegimeCfg):
    """Defaults as the GraVAC paper runs Accordion: Random-k 1.5x / 1000x, checks every 10 epochs."""
    cf_low: float = option(1.5, check=lambda v: v >= 1, valid=">= 1")       # CF in critical regimes
    cf_high: float = option(1000.0, check=lambda v: v >= 1, valid=">= 1")   # CF otherwise

    def errors(self, prefix: str) -> list[str]:
        if self.cf_high < self.cf_low:
            return [f"{prefix}.cf_high={self.cf_high} must be >= {prefix}.cf_low={self.cf_low}"]
        return []


def regimes(prev: list[float] | None, new: list[float], eta: float) -> tuple[list[bool], list[float | None]]:
    """Per layer: low compression (critical regime)? and the ratio |prev − new| / prev.

    No previous norms (first check): every layer low, ratios None. prev == 0: ratio 0 if the new
    norm is 0 too, else infinite (critical), reported as None.
    """
    if prev is None:
        return [True] * len(new), [None] * len(new)
    low, ratios = [], []
    for p, n in zip(prev, new):
        r = abs(p - n) / p if p > 0 else (0.0 if n == 0 else math.inf)
        low.append(r >= eta)
        ratios.append(r if math.isfinite(r) else None)
    return low, ratios


class Regimes:
    """Accordion's decision, per segment (a parameter tensor, or the whole model): low compression
    (critical regime) or high, from rank 0's accumulated gradient norms at the checks, broadcast to
    every worker; all learning-rate decays put every segment in low compression until the next
    check. A method owns one and maps `low` to what it sends (CFs, PowerSGD ranks)."""

    def __init__(self, cfg: RegimeCfg, group, seg: list[int]):
        self.group, self.eta, self.freq = group, cfg.eta, cfg.switch_freq
        self.bounds = list(zip(itertools.accumulate(seg, initial=0), seg))   # (offset, size)
        self.low = [True] * len(seg)           # low compression until the first check
        self.prev_norms: list[float] | None = None
        self.epoch = 0                         # the epoch whose steps are being accumulated
        self.accum: torch.Tensor | None = None  # rank 0 only, during check epochs
        self.local = cfg.accumulate == "local"

    def _norms(self) -> list[float]:
        """Per-segment norms of the accumulated gradient (zeros if nothing was accumulated)."""
        if self.accum is None:
            return [0.0] * len(self.bounds)
        return [float(self.accum[o:o + n].norm(dtype=torch.float64)) for o, n in self.bounds]

    def _check(self, epoch: int) -> dict:
        """Rank 0 compares the epoch's norms with the previous check's and broadcasts the regimes."""
        decision = None
        if self.group.is_main:
            norms = self._norms()
            low, ratios = regimes(self.prev_norms, norms, self.eta)
            self.prev_norms = norms
            decision = {"epoch": epoch, "low_layers": [i for i, v in enumerate(low) if v],
                        "ratios": ratios, "reason": "check"}
        decision = self.group.broadcast_object(decision)
        low = set(decision["low_layers"])
        self.low = [i in low for i in range(len(self.bounds))]
        return decision

    def _boundary(self, ctx: StepContext) -> dict | None:
        """Run the check when the epoch being accumulated has ended; start the next epoch."""
        now = math.floor(ctx.epoch + 1e-9)
        if now <= self.epoch:
            return None
        ended, self.epoch = self.epoch, now
        decision = self._check(ended) if ended % self.freq == 0 else None
        self.accum = None
        return decision

    def accumulate(self, g: torch.Tensor) -> None:
        """Rank 0 sums a gradient over the steps of a check epoch."""
        if not self.group.is_main or self.epoch % self.freq != 0:
            return
        if self.accum is None:
            self.accum = g.detach().clone()
        else:
            self.accum.add_(g)

    def decide(self, grads, ctx: StepContext) -> dict:
        """This step's regimes (in `self.low`) and the record fields saying so; with
        accumulate="local", rank 0's own gradient joins the sum (the caller adds the averaged
        gradient otherwise, after communication)."""
        decision = self._boundary(ctx)
        if ctx.lr_decayed:
            self.low = [True] * len(self.bounds)
            decision = {"epoch": math.floor(ctx.epoch + 1e-9), "ratios": None,
                        **(decision or {}), "low_layers": list(range(len(self.bounds))),
                        "reason": "check+lr_decay" if decision else "lr_decay"}
        if self.local:
            self.accumulate(grads[0])           # the main process hosts rank 0 first
        extra = {"cf_low_layers": sum(self.low)}
        if decision is not None:
            extra["accordion_decision"] = decision
        return extra

    def after(self, averaged: torch.Tensor) -> None:
        """With accumulate="averaged", the step's averaged gradient joins the sum."""
        if not self.local:
            self.accumulate(averaged)

    # --- the end of a run ---------------------------------------------------------------------
    def explain(self, stats: RunStats, low_text: str, high_text: str, numel: int) -> str | None:
        """Which regimes ran; when it never left low compression, why (no regime comparison
        within the run, or every comparison found a critical regime)."""
        recs = [r for r in stats.records if "cf_low_layers" in r]
        if not recs:
            return None
        high = [r for r in recs if r["cf_low_layers"] < len(self.bounds)]
        if high:
            return (f"Accordion ran {high_text} on some layers at {len(high)} of {len(recs)} steps (from step "
                    f"{high[0]['step']}, epoch {high[0]['epoch']:.1f}) and {low_text} on all layers otherwise, "
                    f"{stats.fewer_than_dense(numel):.1f}x fewer floats than dense")
        return f"Accordion ran {low_text} on all layers for all {len(recs)} steps: " + self._why_low(recs, stats)

    def _why_low(self, recs: list[dict], stats: RunStats) -> str:
        """Why no layer ever went to high compression, and what would change it."""
        checks = [r["accordion_decision"] for r in recs if "check" in r.get("accordion_decision", {}).get("reason", "")
                  and r["accordion_decision"]["epoch"] >= self.freq]
        if not checks:   # checks run after epochs 1, 1+s, 1+2s, ... (counting from 1); the first has no norms to compare
            at = (self.freq + 1) * stats.steps_per_epoch
            return (f"it never compared regimes: the check after epoch 1 only records gradient norms (none came before "
                    f"to compare with), the first comparison comes method.switch_freq={self.freq} epoch(s) later, at "
                    f"epoch {self.freq + 1}.0 (step {at}), and the run ended at epoch {stats.epochs:.1f}; "
                    + self._shorter(stats))
        ratios = [x for d in checks for x in d.get("ratios") or [] if x is not None]
        shown = f" (smallest change {min(ratios):.2f})" if ratios else ""
        tip = f"method.eta={math.floor(min(ratios) * 10) / 10 + 0.1:g}" if ratios else "a larger method.eta"
        return (f"each of its {len(checks)} regime comparisons found every layer's gradient norm changed by >= eta "
                f"{self.eta:g}{shown}, a critical regime; try {tip} or a longer run")

    def _shorter(self, stats: RunStats) -> str:
        """How to get a regime comparison into a run of this length."""
        if self.freq <= 1:                               # already a comparison every epoch
            return "try a run of at least 3 epochs (train.epochs=3)"
        if stats.steps > 2 * stats.steps_per_epoch:      # the check after epoch 1 runs at step 2·spe
            return "try method.switch_freq=1 (a comparison every epoch) or a longer run"
        return "try method.switch_freq=1 with a run of at least 3 epochs (train.epochs=3)"

    # --- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"low": list(self.low), "prev_norms": self.prev_norms, "epoch": self.epoch,
                "accum": None if self.accum is None else self.accum.clone()}

    def load_state_dict(self, state: dict, device) -> None:
        self.low, self.prev_norms, self.epoch = list(state["low"]), state["prev_norms"], state["epoch"]
        self.accum = None if state["accum"] is None else state["accum"].to(device).clone()


@METHODS.register("accordion", AccordionCfg, doc="Accordion: low/high CF per layer by critical regimes (Agarwal et al. 2021)")
class Accordion(CompressingMethod):
    """Per-layer switching between cf_low and cf_high at gradient-norm checks; see module doc."""
    name = "accordion"
    order = 2

    def __init__(self, cfg: AccordionCfg, compressor, env):
        super().__init__(cfg, compressor, env)
        self.cf_low, self.cf_high = cfg.cf_low, cfg.cf_high
        seg = list(self.sizes) if compressor.granularity == "layer" else [self.numel]
        self.regimes = Regimes(cfg, self.group, seg)

    @classmethod
    def label(cls, cfg: AccordionCfg, comp) -> str:
        return f"Accordion ({comp.name} {cfg.cf_low:g}x/{cfg.cf_high:g}x)"

    @classmethod
    def cf_text(cls, cfg: AccordionCfg, comp) -> str:
        return f"{cfg.cf_low:g}x/{cfg.cf_high:g}x"

    def _cfs(self):
        """The CF per layer (a plain number when every layer is in the same regime)."""
        cfs = [self.cf_low if low else self.cf_high for low in self.regimes.low]
        return cfs[0] if len(set(cfs)) == 1 else cfs

    def step(self, grads, ctx: StepContext) -> StepResult:
        extra = self.regimes.decide(grads, ctx)
        c = self.compress_all(grads, self._cfs(), ctx.step)
        res = self.finish(c, extra=extra)
        self.regimes.after(res.grad)
        return res

    def explain(self, stats: RunStats) -> str | None:
        return self.regimes.explain(stats, f"{self.cf_low:g}x", f"{self.cf_high:g}x", self.numel)

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self.regimes.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.regimes.load_state_dict(state, self.device)
