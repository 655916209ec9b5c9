"""GraVAC: gradient-variance-aware adaptive compression (Tyagi & Swany, arXiv 2305.12201, Alg. 1).

Every step each worker compresses its error-compensated gradient g_o twice, multi-level:
g_min = C(g_o, cf_min) and g_c = C(g_min, cs) (CF cf_min·cs, without a second pass over g_o).
The compression gains δ = ||C(g)||²/||g_o||² decide what is sent: g_c if δ_c ≥ ε, else g_min if
δ_min ≥ ε, else g_o dense. Every `window` steps the candidate CF grows, cf_min follows it when
the two gains agree within ω, and scaling stops once two CFs give the same throughput × gain.

The decision logic is `GraVACController` (plain floats, no tensors, testable on scripted gain
streams); `GraVAC` wires compressors, error feedback and the group around it.

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
from dataclasses import asdict, dataclass, field

import torch

from compressors import Payload
from gravac.core.registry import option
from gravac.methods.gains import CodeGain, layer_norm_sum, payload_layer_norm_sum, segment_bounds
from gravac.methods.base import (METHODS, CompressingMethod, Compressed, RunStats, StepContext, StepResult,
                                 raise_diverged)
from gravac.core.schema import MethodCfg


@dataclass
class GraVACCfg(MethodCfg):
    """Paper defaults: CF space [10x, 1000x], window 500, omega 1%, epsilon 0.7, exponential policy."""
    cf_min: float = option(10.0, check=lambda v: v >= 1, valid=">= 1", doc="lowest CF of the search (raised as gains allow)")
    cf_max: float = option(1000.0, check=lambda v: v >= 1, valid=">= 1", doc="highest CF the search may reach")
    window: int = option(500, check=lambda v: v >= 1, valid=">= 1", doc="steps between CF decisions")
    step: float = option(2.0, check=lambda v: v > 1, valid="> 1", doc="initial cs: the candidate CF is cf_min x cs")
    epsilon: float = option(0.7, check=lambda v: 0 < v <= 1, valid="in (0, 1]", doc="compression gain a CF must keep to be accepted")
    omega: float = option(0.01, check=lambda v: 0 <= v < 1, valid="in [0, 1)", doc="relative throughput gain that counts as a gain")
    policy: str = option("exponential", choices=("exponential", "geometric"), doc="how cs grows: squares | doubles")
    ewma: float = option(-1.0, check=lambda v: v < 0 or 0 < v <= 1, valid="in (0, 1], or < 0 for N/100")
    reset_step: bool = False             # restart cs at `step` after cf_min is raised
    tcomp: str = option("mean", choices=("mean", "last"))       # T_compression: mean since the window began | last
    grow_if: str = option("always", choices=("always", "accepted"))   # grow cs every window | while accepted
    gain: str = option("paper", choices=("paper", "code"), doc="which gain decides (gravac/methods/gains.py)")
    gain_window: int = option(25, check=lambda v: v >= 1, valid=">= 1")          # gain=code: sliding window
    gain_alpha: float = option(0.05, check=lambda v: 0 < v <= 1, valid="in (0, 1]")   # gain=code: EWMA alpha

    def errors(self, prefix: str) -> list[str]:
        if self.cf_max < self.cf_min:
            return [f"{prefix}.cf_max={self.cf_max} must be >= {prefix}.cf_min={self.cf_min}"]
        return []

def cf_key(cf: float) -> str:
    """Stable text form of a CF for records (10, 20, 62.5, ...)."""
    return f"{cf:.6g}"


@dataclass
class Decision:
    """What the controller decided at one step (parameters are those this step used)."""
    level: str                  # "c" | "min" | "dense"
    cf_sent: float              # nominal CF of the level sent (1 for dense)
    cf_min: float
    cs: float
    cf_c: float
    delta_min: float            # smoothed gains
    delta_c: float
    delta_min_raw: float
    delta_c_raw: float
    t_system: float | None      # samples/s of the previous step (None at the first step)
    window_end: bool            # the window update ran after this step's decision


@dataclass
class ControllerState:
    """Everything the controller carries between steps (for checkpoints)."""
    cf_min: float
    cs: float
    ewma_min: float | None = None
    ewma_c: float | None = None
    settled: bool = False
    settled_cf: float | None = None
    t_compression: dict = field(default_factory=dict)    # cf -> value
    tc_window: dict = field(default_factory=dict)        # cf -> [sum, count] since the window began
    pending: tuple | None = None                         # (cf, delta, samples) of the last step


class GraVACController:
    """GraVAC's decisions from cluster gains and step times alone (see the module docstring)."""

    def __init__(self, cf_min: float, cf_max: float, window: int, step: float, epsilon: float,
                 omega: float, policy: str = "exponential", ewma: float = 0.04,
                 reset_step: bool = False, tcomp: str = "mean", grow_if: str = "always"):
        if policy not in ("exponential", "geometric"):
            raise ValueError(f"policy must be exponential or geometric, got {policy!r}")
        if tcomp not in ("mean", "last"):
            raise ValueError(f"tcomp must be mean or last, got {tcomp!r}")
        if grow_if not in ("always", "accepted"):
            raise ValueError(f"grow_if must be always or accepted, got {grow_if!r}")
        if not (cf_max >= cf_min >= 1 and step > 1 and window >= 1 and 0 < ewma <= 1):
            raise ValueError("GraVAC needs cf_max >= cf_min >= 1, step > 1, window >= 1, 0 < ewma <= 1")
        self.cf_max, self.window, self.step0 = float(cf_max), int(window), float(step)
        self.epsilon, self.omega, self.policy = float(epsilon), float(omega), policy
        self.alpha, self.reset_step, self.tcomp, self.grow_if = float(ewma), bool(reset_step), tcomp, grow_if
        self.s = ControllerState(cf_min=float(cf_min), cs=self._cap(float(cf_min), float(step)))

    # --- read-only views --------------------------------------------------------------------
    @property
    def cf_min(self) -> float:
        return self.s.cf_min

    @property
    def cs(self) -> float:
        return self.s.cs

    @property
    def cf_c(self) -> float:
        return self.s.cf_min * self.s.cs

    @property
    def settled(self) -> bool:
        return self.s.settled

    @property
    def t_compression(self) -> dict:
        return dict(self.s.t_compression)

    # --- the step ---------------------------------------------------------------------------
    def step(self, i: int, delta_min_raw: float, delta_c_raw: float,
             t_iter_prev: float = 0.0, samples: float = 0.0) -> Decision:
        """Decide step i from its raw cluster gains; `t_iter_prev` is the previous step's time.

        Records the previous step's T_compression, smooths the gains, picks the level, and after
        the last step of a window runs the window update (which applies from step i+1 on).
        """
        s = self.s
        t_system = self._record_previous(t_iter_prev)
        if s.cs <= 1:                       # no separate candidate level (cf_min = cf_max)
            delta_c_raw = delta_min_raw
        s.ewma_min = self._smooth(s.ewma_min, delta_min_raw)
        s.ewma_c = self._smooth(s.ewma_c, delta_c_raw) if s.cs > 1 else s.ewma_min
        cf_min, cs, cf_c = s.cf_min, s.cs, self.cf_c
        if s.cs > 1 and s.ewma_c >= self.epsilon:
            level, cf, delta = "c", cf_c, s.ewma_c
        elif s.ewma_min >= self.epsilon:
            level, cf, delta = "min", cf_min, s.ewma_min
        else:
            level, cf, delta = "dense", 1.0, 1.0
        s.pending = (cf, delta, samples)
        window_end = (i + 1) % self.window == 0
        d = Decision(level, cf, cf_min, cs, cf_c, s.ewma_min, s.ewma_c, delta_min_raw, delta_c_raw,
                     t_system, window_end)
        if window_end:
            self.end_window()
        return d

    def _smooth(self, old: float | None, x: float) -> float:
        """EWMA with weight alpha on the new sample; the first sample seeds it."""
        return x if old is None else self.alpha * x + (1 - self.alpha) * old

    def _record_previous(self, t_iter_prev: float) -> float | None:
        """T_compression[cf of the previous step] from its (cluster-wide) step time."""
        s = self.s
        if s.pending is None or not t_iter_prev > 0:
            return None
        cf, delta, samples = s.pending
        s.pending = None
        t_system = samples / t_iter_prev
        value = t_system * delta
        if self.tcomp == "last":
            s.t_compression[cf] = value
        else:
            acc = s.tc_window.setdefault(cf, [0.0, 0])
            acc[0] += value
            acc[1] += 1
            s.t_compression[cf] = acc[0] / acc[1]
        return t_system

    # --- window update ------------------------------------------------------------------------
    def end_window(self) -> None:
        """Saturation check, cf_min raise, cs growth (in that order); see the module docstring."""
        s = self.s
        s.tc_window = {}
        if s.settled:
            return
        best = self.saturated()
        if best is not None:
            self._settle(best)
            return
        cf_c_old, raised = self.cf_c, False
        if s.cs > 1 and s.ewma_min and s.ewma_c is not None \
                and abs(s.ewma_min - s.ewma_c) / s.ewma_min <= self.omega:
            s.cf_min, s.ewma_min, raised = cf_c_old, s.ewma_c, True
        if raised and self.reset_step:
            s.cs = self._cap(s.cf_min, self.step0)
        elif raised or self.grow_if == "always" or (s.ewma_c or 0.0) >= self.epsilon:
            s.cs = self._cap(s.cf_min, self.grow(s.cs))
        if raised or not math.isclose(self.cf_c, cf_c_old):
            s.ewma_c = None                    # a new candidate CF: its EWMA starts afresh

    def grow(self, cs: float) -> float:
        """The policy's next step size: exponential squares, geometric multiplies by `step`."""
        return cs * cs if self.policy == "exponential" else cs * self.step0

    def _cap(self, cf_min: float, cs: float) -> float:
        """cs limited so that cf_min·cs ≤ cf_max (and never below 1)."""
        return max(1.0, min(cs, self.cf_max / cf_min))

    def saturated(self) -> float | None:
        """The lower CF of the two best compressed T_compression values if within ω, else None."""
        cands = sorted(((v, cf) for cf, v in self.s.t_compression.items() if cf > 1), reverse=True)
        if len(cands) < 2:
            return None
        (v1, cf1), (v2, cf2) = cands[:2]
        if v1 <= 0 or (v1 - v2) > self.omega * v1:
            return None
        return min(cf1, cf2)

    def _settle(self, cf: float) -> None:
        """Freeze scaling with `cf` as the candidate CF (cf_min drops to it when lower)."""
        s = self.s
        old_min, old_c = s.cf_min, self.cf_c
        if cf < s.cf_min * (1 + 1e-9):
            s.cf_min, s.cs = cf, 1.0
        else:
            s.cs = self._cap(s.cf_min, cf / s.cf_min)
        if not math.isclose(s.cf_min, old_min):
            s.ewma_min = s.ewma_c if math.isclose(s.cf_min, old_c) else None
        if not math.isclose(self.cf_c, old_c):
            s.ewma_c = None
        s.settled, s.settled_cf = True, cf

    # --- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return asdict(self.s)

    def load_state_dict(self, state: dict) -> None:
        st = dict(state)
        st["pending"] = tuple(st["pending"]) if st.get("pending") is not None else None
        st["t_compression"] = {float(k): v for k, v in st["t_compression"].items()}
        st["tc_window"] = {float(k): list(v) for k, v in st["tc_window"].items()}
        self.s = ControllerState(**st)


def controller_for(cfg: GraVACCfg, world: int) -> GraVACController:
    """The controller a GraVAC config describes for `world` workers (the method and the DDP hook
    share it): EWMA weight `ewma`, or N/100 when negative, or 1 with gain=code (whose sliding
    window already smooths)."""
    alpha = 1.0 if cfg.gain == "code" else cfg.ewma if cfg.ewma > 0 else min(1.0, world / 100)
    return GraVACController(cfg.cf_min, cfg.cf_max, cfg.window, cfg.step, cfg.epsilon, cfg.omega, cfg.policy,
                            alpha, reset_step=cfg.reset_step, tcomp=cfg.tcomp, grow_if=cfg.grow_if)


def ratio(num: float, den: float) -> float:
    """A gain from cluster sums; 1 when there is nothing to compress (den 0)."""
    return num / den if den > 0 else 1.0


def sq_norm(x: torch.Tensor) -> float:
    """||x||² as a Python float."""
    x = x.reshape(-1)
    return float(torch.dot(x, x))


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
