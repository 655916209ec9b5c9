"""COVAP: a coarse-grained filter over bucket shards, sized so communication hides behind backward.

COVAP (arXiv 2311.04499; public code Sun-Helloworld/COVAP, a patched DDP reducer,
torch/lib/c10d/reducer.cpp) cuts the DDP buckets (backward order) into shards and sends only every
R-th shard each step, rotating, so each step sends about d/R floats at almost no compression cost:
- layout: m = median bucket size (the code's integer median); a bucket of n elements gets
  t = int(n/m - 0.3) and c = 1 shard if t <= 0, else min(t + 1, R); shard j of a c-shard bucket is
  the strided slice j, j + c, j + 2c, ... of the bucket;
- filter: global shard index i (buckets in backward order, shards in order) is sent at iteration
  `it` iff (i + it) % R == 0. The kept set depends only on `it` and the layout, so it is the same
  on every worker: the kept values are all-reduced (no indices); a bucket with nothing kept sends
  no message;
- error feedback with a schedule: per element, compensated = f·residual + g; the kept shard sends
  it and its residual becomes 0, a dropped element keeps it (residual <- f·residual + g), with
  f = min(1, ef_init + 0.1·floor(it/decay_step)) (the code's formula; the min only absorbs float
  rounding); ef_init 0.5, decay_step 50, or 0.2 and 100 when R > 8 (the code's defaults).

Ours, and why:
- `drop_rate=auto` (default): step 0 is sent dense (the code takes R by hand from a profiled
  communication/computation ratio); its communication time on the run's clock (modelled when the
  network model is on, else measured) over the step's compute time (forward + backward) is the
  CCR, R = max(1, ceil(CCR)), decided on rank 0 and broadcast; `ccr` and `drop_rate` are recorded.
  An integer `drop_rate` skips the profiling step.
- `drop_rate=overlap` (ours too): ceil(CCR) does not guarantee overlap (only backward overlaps, and
  a model whose big gradients are ready last, as the LSTM, stays exposed at R = 1). After the same
  dense step 0, rank 0 plans R on the overlap timeline (gravac/cluster/timeline.py: the device profile's
  gradient-ready times and the network model): the smallest R in 1..`max_rate` whose exposed
  communication, averaged over the R steps of a rotation, is at most `overlap_tol` × the step's
  compute (forward + backward); if none is, the R with the shortest mean step. The plan leaves out
  COVAP's own compression cost (an element-wise pass, ~0 next to compute). Needs the network model.
- Buckets: DDP's 25 MB cap gives the mini models one or two buckets, which turns the filter into
  "send each bucket every R-th step". `method.buckets` (default 10) re-buckets the parameters in
  backward order with cap = model size / buckets (DDP's rule, no smaller first bucket; a parameter
  larger than the cap gets its own bucket, so the count can differ); 0 keeps the run's DDP buckets
  (network.bucket_cap_mb). The overlap timeline uses these buckets as the step's pieces.
- Error feedback for sharded buckets: the public code's re-injection for a bucket that keeps one
  shard appears inert (`scatter` and `scatter_add` are out of place and their results discarded;
  only the decay `*= f` takes effect), while a wholly dropped bucket adds its residual back when it
  is next sent. Here every element has its residual (the intent, a residual per shard) and the
  factor f is applied uniformly, also at the step that sends (the code adds the undecayed residual
  of a whole bucket). `ef=constant` is f = 1 (plain error feedback), `ef=off` drops the residual.
- Compression cost on the run's clock: per bucket, the error-feedback update (f·r + g) and the
  strided slice of the kept shard (`timed`); copying gradients into buckets is DDP's own work and
  not counted. Momentum stays with the optimizer after averaging, as for every method here.
- A step that sends nothing (fewer shards than R) records CF = d (as if one float was sent).
Records: `drop_rate` R, `ccr` (auto; null for an explicit R), `shards` (total), `kept_shards`,
`ef_factor` f (null on the dense profiling step); a bucket keeps at most one shard, so
`kept_shards` is also the number of buckets (messages) sent. floats_sent = kept elements.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial

import torch

from compressors import option
from gravac.cluster.comm import CommStats
from gravac.methods.base import METHODS, Method, RunStats, StepContext, StepResult
from gravac.core.schema import MethodCfg
from gravac.cluster.timeline import Piece, on_profile
from gravac.cluster.timeline import buckets as ddp_buckets

ELEMENT_BYTES = 4


def valid_rate(v) -> bool:
    return v in ("auto", "overlap") or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)


@dataclass
class CovapCfg(MethodCfg):
    """Drop rate R (or auto / overlap), the number of buckets, and the error-feedback schedule."""
    drop_rate: object = option("auto", check=valid_rate, valid="an integer >= 1, auto or overlap")
    max_rate: int = option(64, check=lambda v: v >= 1, valid=">= 1")                 # drop_rate=overlap only
    overlap_tol: float = option(0.02, check=lambda v: v >= 0, valid=">= 0")          # drop_rate=overlap only
    buckets: int = option(10, check=lambda v: v >= 0, valid=">= 0 (0: the run's DDP buckets)")
    ef: str = option("schedule", choices=("schedule", "constant", "off"))      # constant: f = 1
    ef_init: float | None = option(None, check=lambda v: v is None or 0 <= v <= 1, valid="in [0, 1], or null")
    decay_step: int | None = option(None, check=lambda v: v is None or v >= 1, valid=">= 1, or null")


# --- the layout, the filter and the schedule: pure functions (the DDP hook uses them too) ----------
def median_size(numels: list[int]) -> int:
    """The code's median bucket size: the middle one, or the integer mean of the two middle ones."""
    s = sorted(numels)
    h = len(s) // 2
    return s[h] if len(s) % 2 else (s[h - 1] + s[h]) // 2


def shard_counts(numels: list[int], rate: int) -> list[int]:
    """Shards per bucket: t = int(n/m - 0.3); 1 if t <= 0 else min(t + 1, R)."""
    m = median_size(numels)
    out = []
    for n in numels:
        t = int(n / m - 0.3)
        out.append(1 if t <= 0 else min(t + 1, rate))
    return out


def kept_shards(it: int, rate: int, counts: list[int]) -> list[int | None]:
    """Per bucket, the shard j sent at iteration `it` (global index i with (i + it) % R == 0), or
    None; c <= R, so a bucket keeps at most one shard."""
    out, start = [], 0
    for c in counts:
        j = (-(start + it)) % rate
        out.append(j if j < c else None)
        start += c
    return out


def ef_defaults(rate: int) -> tuple[float, int]:
    """The code's (ef_init, decay_step): (0.2, 100) when R > 8, else (0.5, 50)."""
    return (0.2, 100) if rate > 8 else (0.5, 50)


def ef_factor(it: int, ef_init: float, decay_step: int) -> float:
    """f = ef_init + 0.1 · min((1 - ef_init)/0.1, floor(it/decay_step)), i.e. min(1, ...)."""
    return min(1.0, ef_init + 0.1 * (it // decay_step))


def compensate(residual: torch.Tensor, grad: torch.Tensor, f: float, mode: str) -> torch.Tensor:
    """In place: residual <- f·residual + grad (mode "off": grad alone); returns it."""
    if mode == "off":
        return residual.copy_(grad)
    return residual.mul_(f).add_(grad)


def shard_size(n: int, c: int, j: int) -> int:
    """Elements of shard j of an n-element bucket cut into c strided shards."""
    return len(range(j, n, c))


def take(acc: torch.Tensor, j: int, c: int) -> torch.Tensor:
    """Shard j of c (strided slice) as a new tensor; its residual becomes 0."""
    vals = acc[j::c].clone()
    acc[j::c] = 0
    return vals


def overlap_rate(numels: list[int], groups: list[list[int]], profile, message, compute_s: float,
                 max_rate: int, tol: float) -> int:
    """drop_rate=overlap: the smallest R whose mean exposed communication over a rotation of R steps
    is <= tol × compute on the overlap timeline (buckets `groups` with `numels` elements, each kept
    shard one message costing message(elements) s); else the R with the shortest mean step."""
    best, best_s = 1, math.inf
    for rate in range(1, max_rate + 1):
        counts = shard_counts(numels, rate)
        plans = [on_profile(profile, compute_s, [Piece(g, 0.0, [message(shard_size(n, c, j))] if j is not None else [])
                                                 for g, n, c, j in zip(groups, numels, counts, kept_shards(it, rate, counts))])
                 for it in range(rate)]
        exposed = sum(p.exposed_comm_s for p in plans) / rate
        if exposed <= tol * compute_s:
            return rate
        step = sum(p.step_s for p in plans) / rate
        if step < best_s - 1e-12:
            best, best_s = rate, step
    return best


def rebucket(sizes: list[int], order: list[int], count: int) -> list[list[int]]:
    """Parameters (indices, in backward `order`) in buckets of cap = model size / count (DDP's rule)."""
    cap = sum(sizes) * ELEMENT_BYTES / count / 2**20
    return ddp_buckets(sizes, order, ELEMENT_BYTES, cap, cap)


@METHODS.register("covap", CovapCfg, doc="COVAP: every R-th bucket shard, rotating; overlap-sized drop rate, scheduled EF")
class Covap(Method):
    """COVAP's coarse-grained filter (module docstring); one Piece per bucket for the timeline."""
    name = "covap"
    order = 8

    def __init__(self, cfg, compressor, env):
        super().__init__(cfg, compressor, env)
        order = [i for b in env.buckets for i in b] if env.buckets else list(reversed(range(len(self.sizes))))
        if cfg.buckets > 0:
            self.groups = rebucket(self.sizes, order, cfg.buckets)
        else:
            self.groups = [list(b) for b in env.buckets] if env.buckets else [order]
        starts = [0]
        for n in self.sizes:
            starts.append(starts[-1] + n)
        self.index = [torch.cat([torch.arange(starts[i], starts[i + 1]) for i in g]).to(self.device)
                      for g in self.groups]
        self.numels = [int(ix.numel()) for ix in self.index]
        self.residuals = [[torch.zeros(n, device=self.device) for n in self.numels] for _ in self.group.local_ranks]
        self.t, self.ccr, self.rate = 0, None, None
        if cfg.drop_rate == "overlap" and not env.modelled_time:
            from gravac.core.errors import UserError
            raise UserError("method.drop_rate=overlap plans R on the network model, which is off here "
                            "(network.enabled=false); use drop_rate=auto (the measured CCR) or an integer R")
        if cfg.drop_rate not in ("auto", "overlap"):
            self.set_rate(int(cfg.drop_rate))

    def set_rate(self, rate: int) -> None:
        """Fix R: the shard layout and the EF schedule's defaults follow from it."""
        self.rate = rate
        self.counts = shard_counts(self.numels, rate)
        d_init, d_step = ef_defaults(rate)
        self.ef_init = d_init if self.cfg.ef_init is None else self.cfg.ef_init
        self.decay_step = d_step if self.cfg.decay_step is None else self.cfg.decay_step

    def factor(self, it: int) -> float:
        return 1.0 if self.cfg.ef == "constant" else ef_factor(it, self.ef_init, self.decay_step)

    # --- one step ----------------------------------------------------------------------------
    def step(self, grads, ctx: StepContext) -> StepResult:
        if self.rate is None:
            return self.profile_step(grads, ctx)
        it, f = self.t, self.factor(self.t)
        plan = kept_shards(it, self.rate, self.counts)
        sent, measured, model, costs = [], [], [], [0.0] * len(self.groups)
        for w, g in enumerate(grads):
            (vals, per_bucket), dt, m = self.worker_span(partial(self.filter, w, g, plan, f))
            sent.append(vals)
            measured.append(dt)
            model.append(m)
            costs = [max(a, b) for a, b in zip(costs, per_bucket)]
        kept = [b for b, j in enumerate(plan) if j is not None]
        out = torch.zeros(self.numel, dtype=grads[0].dtype, device=grads[0].device)
        comm = CommStats()
        if kept:
            lens = [shard_size(self.numels[b], self.counts[b], plan[b]) for b in kept]
            avg, comm = self.group.allreduce_mean([torch.cat(v) for v in sent], bucket_elements=lens)
            for b, part in zip(kept, torch.split(avg, lens)):
                out[self.index[b][plan[b]::self.counts[b]]] = part
        messages = iter(comm.messages)
        pieces = [Piece(g, c, [next(messages)] if j is not None else []) for g, c, j in zip(self.groups, costs, plan)]
        self.t += 1
        floats = comm.floats
        extra = {"drop_rate": self.rate, "ccr": self.ccr, "shards": sum(self.counts), "kept_shards": len(kept),
                 "ef_factor": f}
        return StepResult(grad=out, cf=self.numel / max(floats, 1.0), floats_sent=floats, comm=comm,
                          compress_s=max(measured), compress_model_s=max(model), extra=extra, pieces=pieces)

    def filter(self, w: int, g: torch.Tensor, plan: list, f: float) -> tuple[list[torch.Tensor], list[float]]:
        """Local worker w: every bucket's error-feedback update and kept shard (each timed);
        the kept values in bucket order and each bucket's seconds on the run's clock."""
        vals, costs = [], []
        for b, (ix, r) in enumerate(zip(self.index, self.residuals[w])):
            gb = g[ix]                                   # DDP's copy into the bucket (not compression)
            c = self.counts[b]
            acc, s = self.op(f"ef(n={ix.numel()})", partial(compensate, r, gb, f, self.cfg.ef), keep=r)
            if plan[b] is not None:
                v, s2 = self.op(f"slice(n={ix.numel()},c={c})", partial(take, acc, plan[b], c), keep=acc)
                vals.append(v)
                s += s2
            costs.append(s)
        return vals, costs

    def op(self, what: str, fn, keep: torch.Tensor):
        """fn() timed on the run's clock; (its result, its seconds there, or measured without a clock).
        fn works in place on `keep`, which a first calibration (fn re-run) must leave as it was."""
        t0, before = time.perf_counter(), getattr(self, "_tally", 0.0)
        out = self.timed(f"covap:{what}", fn, keep=keep)
        return out, (self._tally - before if self.env.costs is not None else time.perf_counter() - t0)

    def profile_step(self, grads, ctx: StepContext) -> StepResult:
        """drop_rate=auto, step 0: dense all-reduce, one message per bucket; CCR = its
        communication time on the run's clock / compute time; R = ceil(CCR), rank 0's."""
        avg, comm = self.group.allreduce_mean(grads, bucket_elements=self.numels)
        comm_s = comm.modelled_s if self.env.modelled_time else comm.measured_s
        ccr = comm_s / ctx.compute_s if ctx.compute_s > 0 else 1.0
        rate = overlap_rate(self.numels, self.groups, self.env.profile, self.plan_message, ctx.compute_s,
                            self.cfg.max_rate, self.cfg.overlap_tol) if self.cfg.drop_rate == "overlap" \
            else max(1, math.ceil(ccr))
        self.ccr, rate = self.group.broadcast_object((ccr, rate))
        self.set_rate(rate)
        pieces = [Piece(g, 0.0, [m]) for g, m in zip(self.groups, comm.messages)]
        self.t += 1
        extra = {"drop_rate": 1, "ccr": self.ccr, "shards": len(self.groups), "kept_shards": len(self.groups),
                 "ef_factor": None}
        return StepResult(grad=avg, cf=1.0, floats_sent=comm.floats, comm=comm, extra=extra, pieces=pieces)

    def plan_message(self, elements: int) -> float:
        """Modelled seconds of one bucket's all-reduce of `elements` floats (drop_rate=overlap)."""
        return self.group.net.allreduce(elements * ELEMENT_BYTES, self.group.world)

    # --- state, explanation, description -------------------------------------------------------
    def state_dict(self) -> dict:
        return {"t": self.t, "rate": self.rate, "ccr": self.ccr, "residuals": [[r.clone() for r in w] for w in self.residuals]}

    def load_state_dict(self, state: dict) -> None:
        self.t, self.ccr = state["t"], state["ccr"]
        if state["rate"] is not None:
            self.set_rate(state["rate"])
        for mine, saved in zip(self.residuals, state["residuals"]):
            for r, s in zip(mine, saved):
                r.copy_(s)

    def explain(self, stats: RunStats) -> str | None:
        recs = [r for r in stats.records if r.get("ef_factor") is not None]
        if not recs:
            return None
        how = ("given" if recs[0]["ccr"] is None else f"{self.cfg.drop_rate}: CCR {recs[0]['ccr']:.3g} from "
               "step 0's dense all-reduce over its compute" + (", R planned on the overlap timeline"
                                                               if self.cfg.drop_rate == "overlap" else ""))
        cf = len(recs) * self.numel / max(1.0, sum(r["floats_sent"] for r in recs))
        return (f"COVAP: R = {recs[0]['drop_rate']} ({how}), {recs[0]['shards']} shards in {len(self.groups)} "
                f"buckets, {cf:.3g}x fewer floats than dense on filtered steps, EF factor "
                f"{recs[0]['ef_factor']:.2g} -> {recs[-1]['ef_factor']:.2g}")

    @classmethod
    def label(cls, cfg, comp) -> str:
        extra = {"constant": ", f=1", "off": ", no EF"}.get(cfg.ef, "")
        return f"COVAP R={cfg.drop_rate}{extra}"

    @classmethod
    def cf_text(cls, cfg, comp) -> str:
        return f"~R ({cfg.drop_rate})" if cfg.drop_rate in ("auto", "overlap") else f"~{cfg.drop_rate}x"

    @classmethod
    def sort_values(cls, cfg, comp):
        rate = {"auto": 0, "overlap": -1}.get(cfg.drop_rate, cfg.drop_rate)
        return [int(rate), cfg.ef]

    @classmethod
    def state_bytes(cls, cfg, comp, numel, momentum):
        return 4 * numel + 8 * numel + 4 * numel      # residuals, bucket indices, one bucket copy
