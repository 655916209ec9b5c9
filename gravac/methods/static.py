"""Static compression: one compressor at one fixed CF every step, with error feedback."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from compressors import COMPRESSORS, option
from gravac.methods.gains import CodeGain, layer_norm_sum, payload_layer_norm_sum, segment_bounds
from gravac.methods.base import (METHODS, CompressingMethod, StepContext, StepResult, compressor_text, fixed_cf,
                                 raise_diverged)
from gravac.methods.dense import allreduce_dense
from gravac.core.schema import MethodCfg
from gravac.cluster.timeline import Piece


@dataclass
class StaticCfg(MethodCfg):
    """Options of the records only: probe CFs and the code-definition gain's smoothing."""
    probe_cfs: list = option(factory=list, check=lambda v: all(isinstance(x, (int, float)) and x >= 1 for x in v),
                             valid="a list of CFs >= 1")     # also record gains at these CFs (multi-level)
    gain_window: int = option(25, check=lambda v: v >= 1, valid=">= 1")         # code gain: sliding window
    gain_alpha: float = option(0.05, check=lambda v: 0 < v <= 1, valid="in (0, 1]")   # code gain: EWMA alpha
    send: str = option("compressed", choices=("compressed", "dense"))   # dense: a gain probe on dense SGD's path


@METHODS.register("static", StaticCfg, doc="one compressor at compressor.cf every step, with error feedback")
class Static(CompressingMethod):
    """Compress every worker's compensated gradient at compressor.cf and average the payloads
    (a quantizer sends at the CF its code width fixes; compressor.cf is then unused).

    The record also carries the compression gain, the quantity GraVAC adapts on, so static runs at
    several CFs show how it evolves (paper Figs 4-6): `gain` = Σ_w||C(g_o)||² / Σ_w||g_o||² (the
    paper's), and the authors' code's definition (gravac/methods/gains.py) raw (`gain_code_raw`) and
    smoothed (`gain_code`). With `probe_cfs`, the sent payload is also compressed further
    (multi-level) to each larger probe CF and both gains are recorded there (`probe_gain`,
    `probe_gain_code_raw`, `probe_gain_code`). All of it is bookkeeping: neither timed nor sent.

    A 16-bit cast (fp16, bf16) is sent per DDP bucket, overlapping backward (`in_buckets`).

    `send=dense` makes the run a gain probe on dense SGD's trajectory: it compresses (timed) only to
    record the gains, then all-reduces the full gradient and keeps no residual. That is what GraVAC
    measures while it stays dense, and it trains where compressing would not (ResNet101 at lr 0.0125
    climbs to loss 4-5 within 50 steps of static DGC 10x, and stays at 2.3 dense).
    """
    name = "static"
    order = 1
    takes_fixed_cf = True        # a quantizer sends at its own CF (compressor.cf unused)

    def __init__(self, cfg: StaticCfg, compressor, env):
        super().__init__(cfg, compressor, env)
        if cfg.send == "dense" and self.memory_momentum > 0:
            from gravac.core.errors import UserError
            raise UserError("method.send=dense keeps no error-feedback memory, so it cannot hold DGC's momentum: "
                            "set compressor.momentum_correction=false")
        self.bounds = segment_bounds(self.sizes)
        self.code = {cf: CodeGain(cfg.gain_window, cfg.gain_alpha) for cf in [None, *cfg.probe_cfs]}

    def step(self, grads, ctx: StepContext) -> StepResult:
        cf = self.compressor_cls.scheduled_cf(self.comp_cfg, self.comp_cfg.cf, ctx.epoch)
        c = self.compress_all(grads, cf, ctx.step)
        if self.cfg.send == "dense":      # no residual update: the memories stay empty
            res = allreduce_dense(self, grads)   # after the compression, so no overlap (as GraVAC's)
            res.compress_s, res.compress_model_s, res.pieces = c.seconds, c.model_s, None
        else:
            res = self.finish(c)
            if getattr(c.payloads[0], "half", False) and self.env.buckets:
                self.in_buckets(res)
        res.extra.update(self.gains(grads, c, cf, ctx.step))
        return res

    def in_buckets(self, res: StepResult) -> None:
        """A 16-bit cast is elementwise, so it is sent as DDP's fp16/bf16 hook sends it: per DDP
        bucket as backward produces it, each bucket casting its share of the cast's cost (pro rata
        to its elements) and all-reducing 2 bytes a value, so it keeps dense SGD's overlap. The
        values are reduced in one call (the sum is the same), as the dense method's buckets are."""
        sizes = [sum(self.sizes[i] for i in b) for b in self.env.buckets]
        width = res.comm.wire_bytes / self.numel
        messages = [self.group.net.allreduce(n * width, self.group.world) for n in sizes]
        cast = res.compress_s if res.compress_model_s is None else res.compress_model_s
        res.pieces = [Piece(b, cast * n / self.numel, [m]) for b, n, m in zip(self.env.buckets, sizes, messages)]
        res.comm.messages, res.comm.modelled_s = messages, sum(messages)

    def gains(self, grads, c, cf: float, step: int) -> dict:
        """Both gain definitions at the CF sent and at every larger probe CF, over all workers."""
        probes = [p for p in self.cfg.probe_cfs if p > cf]
        rows = []
        for w, (g, comp, pay) in enumerate(zip(grads, c.comps, c.payloads)):
            levels = [pay]
            for j, pcf in enumerate(probes):
                seed = self.seed_for(step, 1 + j, self.group.local_ranks[w])
                try:
                    levels.append(self.compressor.recompress(pay, pcf / cf, seed=seed))
                except ValueError as e:
                    raise_diverged(e, step, self.name)
            row = [float(torch.dot(comp, comp)), layer_norm_sum(g, self.bounds)]
            for p in levels:
                row += [float(torch.dot(p.values, p.values)), payload_layer_norm_sum(p, self.bounds)]
            rows.append(row)
        total = [sum(col) for col in zip(*self.group.bookkeeping(rows))]
        sq_o, den = total[0], total[1]
        out, per_cf = {}, {}
        for j, key in enumerate([None, *probes]):
            sq, num = total[2 + 2 * j], total[3 + 2 * j]
            per_cf[key] = (sq / sq_o if sq_o > 0 else 1.0, num / den if den > 0 else 1.0,
                           self.code[key].update(num, den))
        out["gain"], out["gain_code_raw"], out["gain_code"] = per_cf.pop(None)
        if probes:
            out["probe_gain"] = {f"{k:g}": v[0] for k, v in per_cf.items()}
            out["probe_gain_code_raw"] = {f"{k:g}": v[1] for k, v in per_cf.items()}
            out["probe_gain_code"] = {f"{k:g}": v[2] for k, v in per_cf.items()}
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "code_gain": {str(k): g.state_dict() for k, g in self.code.items()}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for k, g in self.code.items():
            if str(k) in state.get("code_gain", {}):
                g.load_state_dict(state["code_gain"][str(k)])

    @classmethod
    def label(cls, cfg, comp) -> str:
        probe = " gain probe (sends dense)" if cfg.send == "dense" else ""
        return f"{compressor_text(comp)}{probe}"

    @classmethod
    def cf_text(cls, cfg, comp) -> str:
        fixed = fixed_cf(comp)
        return "1x" if cfg.send == "dense" else f"{fixed:.3g}x" if fixed else f"{comp.cf:g}x"

    @classmethod
    def ignores(cls, cfg, comp):
        return ["compressor.cf"] if fixed_cf(comp) else []

    @classmethod
    def sort_values(cls, cfg, comp):
        return [fixed_cf(comp) or comp.cf]

    @classmethod
    def describe(cls, cfg, comp):
        return {**super().describe(cfg, comp), "family": comp.name}   # one colour family per compressor
