"""GraVAC: gradient-variance-aware adaptive compression (Tyagi & Swany, arXiv 2305.12201, Alg. 1).

Every step each worker compresses its error-compensated gradient g_o twice, multi-level:
g_min = C(g_o, cf_min) and g_c = C(g_min, cs) (CF cf_min·cs, without a second pass over g_o).
The compression gains δ = ||C(g)||²/||g_o||² decide what is sent: g_c if δ_c ≥ ε, else g_min if
δ_min ≥ ε, else g_o dense. Every `window` steps the candidate CF grows, cf_min follows it when
the two gains agree within ω, and scaling stops once two CFs give the same throughput × gain.

The decision logic is `GraVACController` (plain floats, no tensors, testable on scripted gain
streams; gravac/methods/gravac_control.py, shared with the DDP hook `GraVACState`); `GraVAC`
wires compressors, error feedback and the group around it.

Choices where the paper leaves room (all parameters in cfg.method; defaults in brackets):

- Cluster gains: δ = Σ_w ||C(g)_w||² / Σ_w ||g_o,w||² over all workers (one gather of a few
  floats per worker per step, counted in the step's communication); 1 if every g_o is zero.
- EWMA: s ← α·x + (1−α)·s, i.e. the NEW sample gets weight α; α = `ewma`, or min(1, N/100) when
  `ewma` < 0 (the paper's talk). A level's first sample seeds its EWMA.
- T_system = N·b / t_iter with t_iter the previous step's time on the run's clock, as the
  training loop states it (StepContext.prev_step_s: the step time the run records); used on its
  own (no loop), the method sums compute + compression + communication, the communication
  modelled (network on, time_source != wall) or measured. Each worker sends that t_iter in the
  gather and all take the max (the slowest worker paces a synchronous step), so the
  T_compression sample of step i−1 is recorded at step i.
- T_compression[cf] [`tcomp`="mean"]: the mean of T_system × δ(sent level, smoothed) over the
  samples since the last window boundary (cf = the nominal CF sent; dense is recorded as CF 1
  but never a candidate of the saturation rule); "last" keeps only the latest sample.
- Window end (after steps w−1, 2w−1, ...), unless settled:
  1. saturation: if the two best compressed T_compression values are within ω (relative to the
     best), settle on the lower CF of the two: the candidate becomes that CF (cf_min drops to it,
     with cs = 1, if it is below cf_min) and cf_min / cs never change again;
  2. else if |δ_min − δ_c| / δ_min ≤ ω, cf_min ← cf_min·cs (the measured candidate becomes the
     floor; its smoothed gain carries over as δ_min);
  3. cs grows by the policy from its current value, also after cf_min rose: exponential
     cs ← cs², geometric cs ← cs·step (doubles for the default step 2); capped so
     cf_min·cs ≤ cf_max. [`reset_step`=False; True: after cf_min rose, cs restarts at `step`.]
     A new candidate CF restarts δ_c's EWMA (seeded by its first sample).
     [`grow_if`="always", as the paper; "accepted": without a cf_min raise, cs grows only when
     the candidate's smoothed gain still meets ε. With "always" the candidate reaches cf_max
     after a few windows whatever the gains, and if δ there stays below ε the run keeps sending
     cf_min: the intermediate CFs get one window each.]
  Scaling down happens only per step, through ε (fall back to cf_min, then dense).
- Gain definition [`gain`="paper"]: "code" decides on the authors' code's gain instead
  (gravac/methods/gains.py: Σ_l||C(g_o)_l|| over Σ_l||g_l|| of the raw gradient, each side smoothed by a
  sliding-window EWMA, `gain_window`, `gain_alpha`), summed over workers so all decide alike; the
  controller then takes the smoothed gains as they are (its own EWMA off) and, as in the code, the
  candidate's smoothing is not restarted when the candidate CF changes. Both definitions are
  recorded every step (`gain_paper_raw`, `gain_code_raw`, `gain_code`: [at cf_min, at the
  candidate]); only the deciding one is part of the timed, counted exchange.
"""
from __future__ import annotations

import math

import torch

from compressors import Payload
from gravac.methods.gains import CodeGain, layer_norm_sum, payload_layer_norm_sum, segment_bounds
from gravac.methods.base import (METHODS, CompressingMethod, Compressed, RunStats, StepContext, StepResult,
                                 raise_diverged)
from gravac.methods.gravac_control import (Decision, GraVACCfg, GraVACController, cf_key, controller_for,  # noqa: F401
                                           ratio, sq_norm)


@METHODS.register("gravac", GraVACCfg, doc="GraVAC: adapts the CF to the compression gain (Tyagi & Swany 2023)")
class GraVAC(CompressingMethod):
    """GraVAC over any compressor with multi-level `recompress`; one error-feedback residual per
    worker, which follows what was actually sent (zero after a dense step)."""
    name = "gravac"
    order = 3

    def __init__(self, cfg: GraVACCfg, compressor, env):
        super().__init__(cfg, compressor, env)
        m = cfg
        self.code = m.gain == "code"
        self.code_min, self.code_c = CodeGain(m.gain_window, m.gain_alpha), CodeGain(m.gain_window, m.gain_alpha)
        self.bounds = segment_bounds(self.sizes)
        self.ctl = controller_for(m, self.group.world)
        self.model_time = env.modelled_time          # used when the loop gives no step time (direct use)
        self.t_prev = [0.0] * len(self.group.local_ranks)   # each local worker's last step time

    @classmethod
    def label(cls, cfg: GraVACCfg, comp) -> str:
        extra = "".join([", code gain" if cfg.gain == "code" else "",
                         ", cs grows if accepted" if cfg.grow_if == "accepted" else ""])
        return f"GraVAC ε={cfg.epsilon:g} ({comp.name}{extra})"

    @classmethod
    def cf_text(cls, cfg: GraVACCfg, comp) -> str:
        return f"{cfg.cf_min:g}x–{cfg.cf_max:g}x"

    @classmethod
    def sort_values(cls, cfg: GraVACCfg, comp):
        return [cfg.epsilon]

    def _compress_worker(self, w: int, g: torch.Tensor, step: int, cf_min: float, cs: float):
        """Compensate and compress one worker's gradient at both levels; squared norms."""
        rank = self.group.local_ranks[w]
        comp, p_min = self.compress_one(w, g, cf_min, step)
        try:
            p_c = (self.timed(self.op_key("recompress", cf=cf_min, cs=cs),
                              lambda: self.compressor.recompress(p_min, cs, seed=self.seed_for(step, 1, rank)))
                   if cs > 1 else p_min)
        except ValueError as e:
            raise_diverged(e, step, self.name)
        paper = lambda: [sq_norm(comp), sq_norm(p_min.values), sq_norm(p_c.values)]  # noqa: E731
        code = lambda: [layer_norm_sum(g, self.bounds), payload_layer_norm_sum(p_min, self.bounds),  # noqa: E731
                        payload_layer_norm_sum(p_c, self.bounds)]
        deciding, other = (code, paper) if self.code else (paper, code)
        norms = self.timed(self.op_key("norms", cf=cf_min, cs=cs, gain=self.cfg.gain), deciding)
        return comp, p_min, p_c, norms, other      # the other definition is computed after, untimed

    def step(self, grads, ctx: StepContext) -> StepResult:
        ctl = self.ctl
        cf_min, cs = ctl.cf_min, ctl.cs
        spans = [self.worker_span(lambda: self._compress_worker(w, g, ctx.step, cf_min, cs))
                 for w, g in enumerate(grads)]
        comps, p_mins, p_cs, norms, others = (list(col) for col in zip(*(s[0] for s in spans)))
        times = [s[1] for s in spans]
        t_prev = self.t_prev if ctx.prev_step_s is None else [ctx.prev_step_s] * len(grads)
        rows = [n + [t] for n, t in zip(norms, t_prev)]   # + each worker's last step time
        table, comm = self.group.gather_floats(rows)
        sums = [sum(r[i] for r in table) for i in range(3)]
        other = [sum(col) for col in zip(*self.group.bookkeeping([o() for o in others]))]   # records only
        paper, code = (other, sums) if self.code else (sums, other)
        raw = {"paper": [ratio(paper[1], paper[0]), ratio(paper[2], paper[0])],
               "code": [ratio(code[1], code[0]), ratio(code[2], code[0])]}
        smoothed_code = [self.code_min.update(code[1], code[0]), self.code_c.update(code[2], code[0])]
        d_min, d_c = smoothed_code if self.code else raw["paper"]
        dec = ctl.step(ctx.step, d_min, d_c, max(r[3] for r in table), ctx.samples)
        if dec.level == "c":
            sent = p_cs
        elif dec.level == "min":
            sent = p_mins
        else:
            sent = [Payload(c, None, self.numel) for c in comps]
        extra = {**self._record(dec), "gain_paper_raw": raw["paper"], "gain_code_raw": raw["code"],
                 "gain_code": smoothed_code}     # [at cf_min, at the candidate], both definitions
        res = self.finish(Compressed(comps, p_mins, max(times), max(s[2] for s in spans)), sent, comm=comm,
                          extra=extra)
        comm_s = res.comm.modelled_s if self.model_time else res.comm.measured_s
        self.t_prev = [ctx.compute_s + dt + comm_s for dt in times]
        return res

    def explain(self, stats: RunStats) -> str | None:
        """What GraVAC sent over the run; when it never compressed, why: the smoothed gain at
        cf_min stayed below epsilon (which settings would let it compress)."""
        recs = [r for r in stats.records if "level" in r]
        if not recs:
            return None
        sent = [r["cf_min"] if r["level"] == "min" else r["cf_c"] for r in recs if r["level"] != "dense"]
        if sent:
            return (f"GraVAC compressed {len(sent)} of {len(recs)} steps, CFs {min(sent):g}x-{max(sent):g}x (ending "
                    f"at {sent[-1]:g}x), {stats.fewer_than_dense(self.numel):.1f}x fewer floats than dense")
        gains = [r["delta_min"] for r in recs]
        return (f"GraVAC sent dense at all {len(recs)} steps: the smoothed {self.cfg.gain} gain at cf_min "
                f"{recs[-1]['cf_min']:g}x was {min(gains):.2f}-{max(gains):.2f} < epsilon {self.cfg.epsilon:g}; "
                + self._advice(min(gains)))

    def _advice(self, low_gain: float) -> str:
        """Settings that would have let a run whose gains stayed below epsilon compress."""
        tips = [f"method.epsilon={math.floor(low_gain * 10) / 10:g}" if low_gain >= 0.1 else "a lower method.epsilon"]
        tips += ["method.gain=code"] if self.cfg.gain == "paper" else []
        tips += [f"a lower method.cf_min (now {self.cfg.cf_min:g})"] if self.cfg.cf_min > 1 else []
        return "try " + " or ".join(tips)

    def _record(self, d: Decision) -> dict:
        """GraVAC's per-step record fields."""
        return {"cf_min": d.cf_min, "cs": d.cs, "cf_c": d.cf_c, "level": d.level,
                "delta_min": d.delta_min, "delta_c": d.delta_c, "delta_min_raw": d.delta_min_raw,
                "delta_c_raw": d.delta_c_raw, "t_system": d.t_system, "settled": self.ctl.settled,
                "t_compression": {cf_key(cf): v for cf, v in sorted(self.ctl.t_compression.items())}}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "controller": self.ctl.state_dict(), "t_prev": list(self.t_prev),
                "code_gain": [self.code_min.state_dict(), self.code_c.state_dict()]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.ctl.load_state_dict(state["controller"])
        self.t_prev = list(state["t_prev"])
        if "code_gain" in state:
            self.code_min.load_state_dict(state["code_gain"][0])
            self.code_c.load_state_dict(state["code_gain"][1])
