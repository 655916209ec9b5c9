"""L-GreCo (Alimohammadi, Markov, Frantar, Alistarh, MLSys 2024, arXiv 2210.17357): per-layer CFs
(a sparsifier's) or code widths (a quantizer's) chosen by a dynamic program that minimises the
floats sent subject to a total compression error no larger than that of a uniform default.

Every `period` steps (the public code's `adjust_freq`) rank 0 takes the mean of its own
error-compensated gradients over the last `window` steps of the period (the code's `acc_iter`,
10), compresses it once per candidate CF (`candidates`, the same compressor as the training steps;
each layer at that CF), and tabulates, per layer l and candidate c, the compression error
e[l, c] = ||a_l − C_c(a_l)||₂ (the L2 norm, not squared, as the code's `torch.dist`; `error=squared`
uses ||·||²) and the values the layer sends, s[l, c]. The budget is `budget_scale` (the code's
`alpha`, 1) times the error of the uniform default, Σ_l e[l, default_cf]. The DP discretises errors
into `buckets` (the code's DPBUCKETS, 10000) of width budget / buckets, rounding each e[l, c] up, and
finds the assignment of least Σ s with Σ ceil(e / width) ≤ buckets in O(layers × candidates ×
buckets): the rounding up means the chosen levels never exceed the budget on the errors the DP saw.
Rank 0 broadcasts the levels; all workers compress every layer at its own CF from that step on.
The first solve is at step `period` (a full period at the uniform default first), as in the code.
The solve (trial compressions and DP) is rank 0's compression time of that step, on the run's
clock, since every worker waits for its broadcast. Each layer keeps its own error-feedback residual (a segment of one flat memory), kept across level
changes, as the code keeps its per-bucket error across rank changes.

Quantizers (compressor=quant or qsgd): the levels are code widths in bits, from `bits` (empty, the
default: every width the quantizer offers, 8, 4 and 2; QSGD's width b at its most levels, s =
2^(b-1) − 1: 127, 7, 1), and `candidates`/`default_cf` are unused. The budget is the error of the
compressor's own width (compressor.bits; QSGD: the width of compressor.levels, which must then be
127, 7 or 1), which must be among `bits`. A trial encodes the window's average at one width
everywhere (rounding from the fixed per-step seed, as for randomised sparsifiers); s[l, b] is layer
l's wire value-equivalents at width b, wire bits / 32 (docs/DEFINITIONS.md): its codes packed from
a fresh byte plus 4 bytes per scale (Quantizer.segment_bytes), exactly what the layer sends as a
piece of a mixed-width payload. A step encodes every layer at its own width with its own scales
(bucketed per layer, as always; Quantizer.quantize_widths) and seed; the payload is all-gathered and
decoded as any packed payload (its size follows from the layout and the broadcast widths, the same
on every worker). Every layer at one width is that width's ordinary payload byte for byte (codes
packed across layer boundaries, up to a byte per layer less than the table's sum), so
`bits=[the default]` is exactly method=static with that quantizer. With nearest rounding (quant's
default) a layer's codes at a width are the same in the trial and in the mixed payload, so the
chosen levels' error on the averaged gradient is the table's. TernGrad and EF-SignSGD have a single
width (ternary, sign), as have the 16-bit casts: nothing to choose, refused in one line.

Differences from the paper's public code (LGrCo/L-GreCo, hooks/lgreco_hook.py), and why:
- The code adapts PowerSGD ranks only (candidates: ranks 0.5r..2r, sizes (n+m)·rank); here the
  candidates are CFs of this suite's sparsifiers (Top-k, DGC, RedSync, Random-k), the sizes the
  values each layer actually sent in the trial compression (floats sent, the suite's measure), or
  a quantizer's code widths, the sizes each layer's wire value-equivalents. PowerSGD ranks, the
  code's setting, are method=lgreco_powersgd (gravac/methods/lgreco_powersgd.py).
- The paper applies L-GreCo to quantization too, but the public code has no quantization hook:
  its hooks (lgreco_hook.py in its ResNet18, ResNet50, Transformer-XL and fairseq Transformer-LM
  trees, lgreco_accordion_hook.py in the first three) adapt PowerSGD ranks only; the quantization
  code it carries is its upstreams' weight/inference quantization (NVIDIA's pytorch_quantization
  in ResNet50, fairseq's quant-noise and PQ), not gradients. Its bit candidates and bucket sizes are therefore not in the code: the widths here
  are the suite's quantizers' (8, 4, 2 bits), the buckets the compressor's (quant 1024, QSGD 512),
  the codes fixed-width and packed (no entropy coding, so every worker's payload has one size).
- Errors are measured by compressing the averaged gradient with the compressor itself (Top-k's
  error follows exactly; randomised compressors are drawn from a fixed per-step seed), not by SVD or
  power iterations (which only apply to low-rank compression).
- The code clamps every discretised error to at least one bucket and requires the total to be at
  most buckets − 1 (artefacts of its array slicing); here an exact zero error costs zero buckets
  and the total may reach `buckets`. When rounding makes the problem infeasible or its optimum
  sends more than the uniform default, the uniform default is kept (the code keeps the previous
  levels when infeasible): L-GreCo never sends more than the default it was asked to beat.
- The code scales the accumulated gradient by delta/acc_iter (1e-2/10); here it is the plain mean
  (a common scale changes no decision).
- The code runs PowerSGD's own dense warm-up (start_powerSGD_iter=1000); a dense warm-up is not
  part of L-GreCo and is not done here, so `candidates=[default_cf]` is exactly method=static.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from compressors import COMPRESSORS
from gravac.core.errors import UserError
from gravac.core.registry import option
from gravac.core.schema import MethodCfg
from gravac.methods.base import (METHODS, CompressingMethod, RunStats, StepContext, StepResult, fixed_cf,
                                 raise_diverged)


def _cfs_ok(v) -> bool:
    return isinstance(v, (list, tuple)) and len(v) >= 1 and all(isinstance(x, (int, float)) and x >= 1 for x in v)


#: Code widths a quantizer's layer may take (min-max quant's bits; QSGD's at s = 127, 7, 1).
WIDTHS = (8, 4, 2)


def _bits_ok(v) -> bool:
    return isinstance(v, (list, tuple)) and all(isinstance(x, int) and x in WIDTHS for x in v) and len(set(v)) == len(v)


@dataclass
class SolveCfg(MethodCfg):
    """When an L-GreCo method solves and how finely (shared by lgreco, lgreco_accordion and
    lgreco_powersgd); defaults from the public code."""
    period: int = option(100, check=lambda v: v >= 1, valid=">= 1", doc="steps between solves (code: adjust_freq)")
    window: int = option(10, check=lambda v: v >= 1, valid=">= 1",
                         doc="last steps of a period whose compensated gradients are averaged (code: acc_iter)")
    buckets: int = option(10000, check=lambda v: v >= 1, valid=">= 1",
                          doc="error budget resolution of the DP (code: DPBUCKETS)")
    budget_scale: float = option(1.0, check=lambda v: v > 0, valid="> 0",
                                 doc="budget = this x the uniform default's total error (code: alpha)")

    def errors(self, prefix: str) -> list[str]:
        if self.window > self.period:
            return [f"{prefix}.window={self.window} must be <= {prefix}.period={self.period}: "
                    "the gradients averaged for a solve come from the period before it"]
        return []


@dataclass
class LGrecoCfg(SolveCfg):
    """L-GreCo's levels: CFs of a sparsifier (or a quantizer's code widths); see the module doc."""
    candidates: list = option(factory=lambda: [10, 20, 50, 100, 200, 1000], check=_cfs_ok,
                              valid="a non-empty list of CFs >= 1", doc="CFs a layer may use")
    default_cf: float = option(100.0, check=lambda v: v >= 1, valid=">= 1",
                               doc="uniform CF whose total error is the budget (one of the candidates)")
    error: str = option("norm", choices=("norm", "squared"),
                        doc="per-layer error ||g - C(g)|| (code) | ||g - C(g)||^2")
    bits: list = option(factory=list, check=_bits_ok,
                        valid="a list of distinct code widths from 8, 4, 2 (empty: every width the quantizer offers)",
                        doc="with a quantizer (compressor=quant|qsgd): the code widths a layer may use; the budget is "
                            "the error of the compressor's own width (compressor.bits; QSGD: its levels' width)")

    def errors(self, prefix: str) -> list[str]:
        out = []
        if _cfs_ok(self.candidates) and float(self.default_cf) not in [float(c) for c in self.candidates]:
            out.append(f"{prefix}.default_cf={self.default_cf:g} must be one of {prefix}.candidates="
                       f"{list(self.candidates)}, so that the uniform default is always a feasible choice")
        return out + super().errors(prefix)


# --- the dynamic program (pure numbers) -----------------------------------------------------------

def discretise(errors: np.ndarray, budget: float, buckets: int) -> np.ndarray:
    """Errors in buckets of width budget / buckets, rounded up (never below the real error);
    anything above the budget becomes buckets + 1 (infeasible on its own)."""
    width = budget / buckets
    d = np.ceil(np.asarray(errors, dtype=np.float64) / width)
    return np.minimum(d, buckets + 1).astype(np.int64)


def solve(errors: np.ndarray, sizes: np.ndarray, budget: float, buckets: int) -> list[int] | None:
    """The candidate index per layer minimising Σ sizes subject to Σ ceil(error / width) ≤ buckets
    (width = budget / buckets), or None when nothing fits. errors, sizes: [layers, candidates].

    best[b] is the least size of the layers so far with discretised error exactly b; each layer
    adds one shifted copy per candidate, so the work is layers × candidates × buckets. Among
    assignments of least size the one of least discretised error is returned."""
    if not (budget > 0 and math.isfinite(budget)):
        return None
    d = discretise(errors, budget, buckets)
    sizes = np.asarray(sizes, dtype=np.float64)
    layers, cands = d.shape
    best = np.full(buckets + 1, np.inf)
    best[0] = 0.0
    choice = np.full((layers, buckets + 1), -1, dtype=np.int32)
    for l in range(layers):
        new = np.full(buckets + 1, np.inf)
        for c in range(cands):
            dc = int(d[l, c])
            if dc > buckets:
                continue
            cand = best[:buckets + 1 - dc] + sizes[l, c]
            better = cand < new[dc:]
            new[dc:][better] = cand[better]
            choice[l, dc:][better] = c
        best = new
    if not np.isfinite(best).any():
        return None
    b = int(np.argmin(best))
    out = [0] * layers
    for l in range(layers - 1, -1, -1):
        c = int(choice[l, b])
        out[l] = c
        b -= int(d[l, c])
    return out


@dataclass
class Decision:
    """A solve's outcome: the candidate index per layer and what it predicts."""
    choice: list[int]
    budget: float
    error: float            # Σ error of the choice (on the table)
    floats: float           # Σ size of the choice
    default_floats: float   # Σ size of the uniform default
    fallback: str | None    # why the uniform default was kept, or None


def decide(errors: np.ndarray, sizes: np.ndarray, default: int | list[int], scale: float, buckets: int) -> Decision:
    """L-GreCo's choice for an error and size table: the DP under budget = scale × the default's
    total error, or the default when the DP finds nothing that fits or nothing smaller. `default`:
    the candidate index of every layer (uniform), or one per layer (Accordion's levels)."""
    errors, sizes = np.asarray(errors, dtype=np.float64), np.asarray(sizes, dtype=np.float64)
    layers = errors.shape[0]
    rows = np.arange(layers)
    base = [default] * layers if isinstance(default, int) else list(default)
    budget = scale * float(errors[rows, base].sum())
    default_floats = float(sizes[rows, base].sum())
    choice = solve(errors, sizes, budget, buckets)
    fallback = None
    if choice is None:
        choice, fallback = base, "infeasible" if budget > 0 else "zero budget"
    elif float(sizes[rows, choice].sum()) > default_floats:
        choice, fallback = base, "no smaller"
    return Decision(choice, budget, float(errors[rows, choice].sum()), float(sizes[rows, choice].sum()),
                    default_floats, fallback)


# --- the window and the solve, shared by the L-GreCo methods -------------------------------------

class SolveWindow:
    """Rank 0's sum of its compensated gradients over the last `window` steps of every `period`,
    and the solve that turns their mean into levels for every worker (rank 0 solves, broadcasts).
    `rel` is the step counted from where the schedule starts (0 for lgreco; PowerSGD's start_step)."""

    def __init__(self, group, period: int, window: int, numel: int, device) -> None:
        self.group, self.period, self.window, self.numel, self.device = group, period, window, numel, device
        self.accum: torch.Tensor | None = None     # rank 0 only
        self.count = 0

    def due(self, rel: int) -> bool:
        """A solve happens before this step's compression."""
        return rel > 0 and rel % self.period == 0

    def add(self, rel: int, comp: torch.Tensor) -> None:
        """Rank 0 adds its compensated gradient when the step is among the period's last `window`."""
        if not self.group.is_main or rel % self.period < self.period - self.window:
            return
        self.accum = comp.detach().clone() if self.accum is None else self.accum.add_(comp)
        self.count += 1

    def solve(self, solve_on, worker_span) -> tuple[dict, tuple[float, float]]:
        """solve_on(mean) on rank 0 (timed by worker_span), broadcast; the window starts afresh.
        Returns the broadcast record and the solve's (measured, clock) seconds, 0 off rank 0."""
        out, spent = None, (0.0, 0.0)
        if self.group.is_main:
            a = self.accum / max(self.count, 1) if self.accum is not None else torch.zeros(self.numel, device=self.device)
            out, measured, model = worker_span(lambda: solve_on(a))
            spent = (measured, model)
        self.accum, self.count = None, 0
        return self.group.broadcast_object(out), spent

    def state_dict(self) -> dict:
        """Keys of their own: a method's state may hold another "accum" (Accordion's, in lgreco_accordion)."""
        return {"window_count": self.count, "window_accum": None if self.accum is None else self.accum.clone()}

    def load_state_dict(self, state: dict) -> None:
        old = "window_count" not in state               # checkpoints written before the keys had the prefix
        self.count = state["count" if old else "window_count"]
        accum = state["accum" if old else "window_accum"]
        self.accum = None if accum is None else accum.to(self.device).clone()


def charge_solve(res: StepResult, solved: tuple[dict, tuple[float, float]], measured_error) -> None:
    """Rank 0's solve holds up the step: its seconds count as compression, on the run's clock;
    the record gets what the solve predicted beside what the step then measured."""
    record, (measured, model) = solved
    res.compress_s += measured
    res.compress_model_s = (res.compress_model_s or 0.0) + model
    res.extra["lgreco_solve"] = {**record, "floats_measured": res.floats_sent, "error_measured": measured_error()}


# --- the method --------------------------------------------------------------------------------------

@METHODS.register("lgreco", LGrecoCfg, doc="L-GreCo: per-layer CFs by a DP under the uniform default's error "
                                           "(Alimohammadi et al. 2024)")
class LGreco(CompressingMethod):
    """Per-layer CFs re-chosen every `period` steps by L-GreCo's dynamic program; see module doc."""
    name = "lgreco"
    order = 4
    takes_fixed_cf = True        # a quantizer: the levels are its code widths (method.bits)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "takes_fixed_cf" not in vars(cls):
            cls.takes_fixed_cf = False     # a subclass chooses CFs unless it says it takes quantizers too

    def __init__(self, cfg: LGrecoCfg, compressor, env):
        super().__init__(cfg, compressor, env)
        errors = self.config_errors(cfg, compressor)
        if errors:
            raise UserError(errors[0])
        self.widths = self.widths_of(cfg, compressor)       # None: CFs of a sparsifier
        if self.widths is None:
            self.cands, start = [float(c) for c in cfg.candidates], self.start_cf(cfg)
        else:
            self.cands, start = list(self.widths), COMPRESSORS[compressor.name].target.default_width(compressor)
        self.default = self.cands.index(start)
        self.offsets = np.cumsum([0, *self.sizes]).tolist()
        self.layer_cfs = [start] * len(self.sizes)          # per layer: its CF, or its code width in bits
        self.window = SolveWindow(self.group, cfg.period, cfg.window, self.numel, self.device)
        self.announced = False                       # levels written to the records since the last change

    @staticmethod
    def start_cf(cfg) -> float:
        """Every layer's CF until the first solve: the uniform default (of a sparsifier)."""
        return float(cfg.default_cf)

    @classmethod
    def widths_of(cls, cfg, comp) -> list[int] | None:
        """The code widths a layer may take with a quantizer (method.bits, or every width it
        offers), or None for a sparsifier (method.candidates are CFs)."""
        if fixed_cf(comp) is None:
            return None
        return [int(b) for b in getattr(cfg, "bits", None) or []] or list(COMPRESSORS[comp.name].target.widths)

    @property
    def unit(self) -> str:
        """What a level is: "bits" (a quantizer's code width) or "cf"."""
        return "cf" if self.widths is None else "bits"

    def level_text(self, level) -> str:
        """A level as tables say it: "100x", or "4-bit"."""
        return f"{level:g}x" if self.widths is None else f"{level:g}-bit"

    def encode(self, x: torch.Tensor, level, seed: int):
        """x compressed at per-layer `level`s: CFs (a sparsifier) or code widths (a quantizer, whose
        layers are then each encoded at their own width: Quantizer.quantize_widths)."""
        if self.widths is None:
            return super().encode(x, level, seed)
        widths = [int(b) for b in level] if isinstance(level, (list, tuple)) else [int(level)] * len(self.sizes)
        return self.compressor.quantize_widths(x, widths, seed=seed)

    # --- one step -------------------------------------------------------------------------------
    def step(self, grads, ctx: StepContext) -> StepResult:
        extra = self.before(grads, ctx)
        solved = self.solve_now(ctx.step) if self.window.due(ctx.step) else None
        if not self.announced:
            extra["lgreco_levels"] = list(self.layer_cfs)
            self.announced = True
        c = self.compress_all(grads, list(self.layer_cfs), ctx.step)
        self.window.add(ctx.step, c.comps[0])
        res = self.finish(c, extra=extra)
        if solved is not None:
            charge_solve(res, solved, lambda: self.measured_error(c))
        self.after(res)
        return res

    def before(self, grads, ctx: StepContext) -> dict:
        """Record fields and level changes of a subclass before the step (none here)."""
        return {}

    def after(self, res: StepResult) -> None:
        """A subclass's look at the averaged gradient (nothing here)."""

    def solve_now(self, step: int) -> tuple[dict, tuple[float, float]]:
        """Rank 0 solves on its averaged window and broadcasts; every worker takes the levels.
        Returns the record and the solve's seconds (measured, on the run's clock; 0 off rank 0)."""
        out, spent = self.window.solve(lambda a: self.solve_on(a, step), self.worker_span)
        levels = out.pop("levels")
        if levels != self.layer_cfs:
            self.layer_cfs, self.announced = levels, False
        return out, spent

    def solve_on(self, a: torch.Tensor, step: int) -> dict:
        """The error and size table of `a`, the DP's levels and what they predict (timed)."""
        errors, sizes = self.table(a, step)
        base = self.baseline()
        d = self.timed(self.op_key("lgreco_dp", buckets=self.cfg.buckets, candidates=self.cands),
                       lambda: decide(errors, sizes, base, self.cfg.budget_scale, self.cfg.buckets))
        return {"levels": [self.cands[i] for i in d.choice], "error_budget": d.budget, "error_predicted": d.error,
                "error_default": float(errors[np.arange(len(base)), base].sum()), "floats_predicted": d.floats,
                "floats_default": d.default_floats, "fallback": d.fallback}

    def baseline(self) -> list[int]:
        """The candidate index per layer whose total error is the budget: the uniform default."""
        return [self.default] * len(self.sizes)

    def table(self, a: torch.Tensor, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Per layer and candidate: compression error of `a` and values sent (one trial per CF)."""
        errors = np.zeros((len(self.sizes), len(self.cands)))
        sizes = np.zeros_like(errors)
        for j, cf in enumerate(self.cands):
            errors[:, j], sizes[:, j] = self.timed(self.op_key("lgreco_trial", cf=cf),
                                                   lambda: self.trial(a, cf, step, j))
        return errors, sizes

    def trial(self, a: torch.Tensor, cf: float, step: int, j: int) -> tuple[np.ndarray, np.ndarray]:
        """One candidate: every layer of `a` compressed at `cf` (or code width); per-layer error and
        values sent (a quantizer's: each layer's wire value-equivalents at that width, wire bits / 32,
        as the layer's piece of a mixed-width payload: Quantizer.segment_bytes / 4)."""
        try:
            p = self.encode(a, cf, seed=self.step_seed(step, level=1 + j))
        except ValueError as e:
            raise_diverged(e, step, self.name)
        if self.widths is not None:
            return self.layer_errors(a, p), self.compressor.segment_bytes([int(cf)] * len(self.sizes)) / 4.0
        return self.layer_errors(a, p), self.layer_counts(p)

    def layer_errors(self, a: torch.Tensor, p) -> np.ndarray:
        """||a_l − C(a)_l|| per layer (squared with error=squared), in float64."""
        diff = (a - p.dense()).double()
        sq = np.array([float(diff[o:o + n].square().sum()) for o, n in zip(self.offsets, self.sizes)])
        return sq if self.cfg.error == "squared" else np.sqrt(sq)

    def layer_counts(self, p) -> np.ndarray:
        """Values the payload holds per layer (a dense payload: every element)."""
        if p.indices is None:
            return np.asarray(self.sizes, dtype=np.float64)
        seg = np.searchsorted(np.asarray(self.offsets[1:-1]), p.indices.cpu().numpy(), side="right")
        return np.bincount(seg, minlength=len(self.sizes)).astype(np.float64)

    def measured_error(self, c) -> float:
        """This step's total error at the new levels, mean over workers: Σ_l ||g_l − sent_l|| of each
        worker's compensated gradient (gathered for the record only, not a cost)."""
        mine = [[float(self.layer_errors(comp, p).sum())] for comp, p in zip(c.comps, c.payloads)]
        rows = self.group.bookkeeping(mine)
        return sum(r[0] for r in rows) / len(rows)

    # --- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "levels": list(self.layer_cfs), **self.window.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.layer_cfs, self.announced = list(state["levels"]), False
        self.window.load_state_dict(state)

    # --- what it did ------------------------------------------------------------------------------
    def level_histogram(self, stats: RunStats) -> dict[str, int]:
        """Layer-steps at each CF (code width) over the run, from the levels the records announce."""
        counts: Counter = Counter()
        levels: list | None = None
        for r in stats.records:
            levels = r.get("lgreco_levels", levels)
            counts.update(f"{cf:g}" for cf in levels or [])
        return {k: counts[k] for k in sorted(counts, key=float)}

    def parameter_shares(self, stats: RunStats) -> dict[str, float]:
        """Share of parameter-steps at each CF: each layer weighted by its size, so that the many
        tiny layers (biases, norms: one value sent at any CF) do not outweigh the few large ones."""
        weight: Counter = Counter()
        levels: list | None = None
        for r in stats.records:
            levels = r.get("lgreco_levels", levels)
            for cf, n in zip(levels or [], self.sizes):
                weight[f"{cf:g}"] += n
        total = sum(weight.values()) or 1
        return {k: weight[k] / total for k in sorted(weight, key=float)}

    def summarize(self, stats: RunStats) -> dict | None:
        unit = self.unit
        return {"level_unit": unit, f"layer_{unit}_histogram": self.level_histogram(stats),
                f"parameter_{unit}_share": self.parameter_shares(stats), "layer_sizes": list(self.sizes)}

    def explain(self, stats: RunStats) -> str | None:
        solves = [r for r in stats.records if "lgreco_solve" in r]
        what = "CF" if self.widths is None else "code width"
        if not solves:
            return (f"L-GreCo never solved in {stats.steps} steps (its first solve is at step method.period="
                    f"{self.cfg.period}), so every layer kept its starting {what} {self.level_text(self.cands[self.default])}; "
                    "try a smaller method.period or a longer run")
        last = solves[-1]["lgreco_solve"]
        hist = ", ".join(f"{self.level_text(float(k))}: {v:.0%}" if v >= 0.005 else f"{self.level_text(float(k))}: <1%"
                         for k, v in self.parameter_shares(stats).items())
        kept = sum(1 for r in solves if r["lgreco_solve"]["fallback"])
        widest = ""
        if self.widths is not None and kept == len(solves) and self.cands[self.default] == max(self.cands):
            widest = (f" (uniform {self.level_text(self.cands[self.default])} is the widest candidate, so no layer can "
                      "pay for a narrower one: give a narrower compressor width, e.g. compressor.bits=4, as the budget)")
        return (f"L-GreCo solved {len(solves)} time(s) ({kept} kept the default levels{widest}); last solve predicts "
                f"{last['floats_predicted']:.4g} floats per step against the default's {last['floats_default']:.4g} "
                f"at error {last['error_predicted']:.4g} <= budget {last['error_budget']:.4g}; parameter-steps per {what}: {hist}; "
                f"{stats.fewer_than_dense(self.numel):.1f}x fewer floats than dense")

    # --- what a configuration means ---------------------------------------------------------------
    @classmethod
    def config_errors(cls, cfg, comp) -> list[str]:
        """Per-layer levels need layer granularity; a sparsifier's own CF schedule must be off and
        method.bits empty; a quantizer must offer code widths, its own among method.bits."""
        if comp.granularity != "layer":
            return [f"method={cfg.name} chooses a CF per layer: set compressor.granularity=layer"]
        target = COMPRESSORS[comp.name].target
        bits = [int(b) for b in getattr(cfg, "bits", None) or []]
        if fixed_cf(comp) is None:                       # a sparsifier: the levels are CFs
            if bits:
                return [f"method.bits={bits} are a quantizer's code widths, and compressor={comp.name} is a sparsifier: "
                        "leave method.bits empty (method.candidates are its CFs), or use compressor=quant or qsgd"]
            start = cls.start_cf(cfg)
            if target.scheduled_cf(comp, start, 0.0) != start:
                return [f"method={cfg.name} chooses the CFs itself: switch off compressor={comp.name}'s own CF schedule "
                        "(compressor.warmup_epochs=0)"]
            return []
        widths = list(getattr(target, "widths", ()))
        if not widths:                                   # TernGrad, EF-SignSGD, the 16-bit casts
            return [f"method={cfg.name} chooses a code width per layer, and compressor={comp.name} has a single one "
                    f"(its CF is fixed): use method=static with it, or compressor=quant or qsgd (8, 4 or 2 bits per layer)"]
        default = target.default_width(comp)
        if default is None:                              # QSGD with levels that are not a width's most
            return [f"method={cfg.name} chooses among {comp.name}'s code widths at the most levels each holds (8-bit: "
                    f"127, 4-bit: 7, 2-bit: 1), and {target.width_text(comp)} is not one: set compressor.levels=127, 7 or 1"]
        bad = sorted(set(bits) - set(widths), reverse=True)
        if bad:
            return [f"method.bits={bits}: compressor={comp.name} encodes at {widths} bits, not {bad}"]
        if bits and default not in bits:
            return [f"{target.width_text(comp)} is the uniform width whose total error is the budget: it must be one "
                    f"of method.bits={bits}"]
        return []

    @classmethod
    def describe(cls, cfg, comp) -> dict:
        """The setting, with what a level is (`level_unit`: cf or bits), so that plots can name
        levels from config.yaml alone (a run still going has no summary)."""
        widths = cls.widths_of(cfg, comp) if comp.name in COMPRESSORS else None
        return {**super().describe(cfg, comp), "level_unit": "cf" if widths is None else "bits"}

    @classmethod
    def label(cls, cfg: LGrecoCfg, comp) -> str:
        widths = cls.widths_of(cfg, comp) if comp.name in COMPRESSORS else None
        if widths is not None:
            return (f"L-GreCo ({comp.name} {'/'.join(str(b) for b in widths)}-bit, budget {cfg.budget_scale:g}x uniform "
                    f"{COMPRESSORS[comp.name].target.code_bits(comp)}-bit)")
        return f"L-GreCo ({comp.name}, budget {cfg.budget_scale:g}x uniform {cfg.default_cf:g}x)"

    @classmethod
    def cf_text(cls, cfg: LGrecoCfg, comp) -> str:
        widths = cls.widths_of(cfg, comp) if comp.name in COMPRESSORS else None
        if widths is not None:
            return f"{min(widths)}–{max(widths)} bits per layer"
        return f"{min(cfg.candidates):g}x–{max(cfg.candidates):g}x per layer"

    @classmethod
    def sort_values(cls, cfg: LGrecoCfg, comp):
        fixed = fixed_cf(comp) if comp.name in COMPRESSORS else None
        return [fixed or cfg.default_cf]

    @classmethod
    def ignores(cls, cfg, comp):
        if comp.name in COMPRESSORS and fixed_cf(comp) is not None:
            return ["compressor.cf", "method.candidates", "method.default_cf"]
        return ["compressor.cf", "method.bits"]

    @classmethod
    def state_bytes(cls, cfg, comp, numel, momentum):
        return super().state_bytes(cfg, comp, numel, momentum) + 4 * numel    # + rank 0's window sum
