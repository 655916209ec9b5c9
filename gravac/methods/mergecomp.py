"""MergeComp: a compression scheduler over any compressor (Wang, Wu, Ng, arXiv 2103.15195).

Per-layer compression pays a fixed cost per tensor and per message; whole-model compression cannot
start before backward ends. MergeComp merges consecutive gradient tensors, in backward order, into
y groups; each group is error-compensated and compressed once, as one flat tensor, as soon as its
last gradient is ready, and sent as its own message(s). The step returns one timeline `Piece` per
group, so the overlap model (gravac/cluster/timeline.py) knows when each group can go. `groups=1` is
whole-model compression, `groups=0` one group per parameter tensor (layer-wise).

The partition (public code Crystal-wxy/mergeComp, scheduler/scheduler.py and memory/memory_pool.py):
a partition is a list of cut points in backward order, [0, x1, ..., L]; x = the number of tensors
in the groups before the cut. The default (warm-up, `search=none`) is the code's equal split:
cuts at i * (L // y), the last group taking the remainder. `search=binary` (y = 2, the code): after
`warmup` rounds of `probe_steps` steps (code: 5 rounds of 20), binary search of the split x over
start=1, end=L-1: probe x and x+`search_step` (code: 2), each for `probe_steps` real training
steps, timed by the mean of the run's clock (`StepContext.prev_step_s`: the modelled overlapped step
time with the network on, measured wall time otherwise, the switch GraVAC uses); if t(x) >
t(x+step) go right (start = x+step), else left (end = x); then keep the fastest probed x with
1 < x < L-1 (the code's rule; L//2 when none qualifies). Rank 0's probe means are broadcast, so
every worker decides alike (the code's hvd.broadcast_object).

Added (the code has only y = 2 binary search): `search=exhaustive` evaluates every partition into
y groups under the timeline model at the step the search starts and keeps the fastest (the
yardstick for the binary search; refused above `max_candidates`), `search=greedy` adds one cut at
a time, the one that lowers the modelled step time most, up to y groups. The model of a candidate:
each group's compensation and compression on the run's clock (calibrated once on this step's real
gradient of the first local worker, the same cost-table keys the training steps use), its messages
from the network model for the payload that compression produced, scheduled with the device
profile's forward/backward/ready times (`MethodEnv.profile`; without one all groups wait for the end
of backward). Rank 0's choice is broadcast.

Records (steps.jsonl): `partition` (cut points in backward order, every step; during a probe, the
candidate probed), `search_phase` (warmup | probe | chosen | fixed), `candidates_s` ({"0,x,L":
seconds}: on the step a probe ends, its mean time on the run's clock; on the model search's step,
every candidate's modelled time, the best 200 when there are more), `chosen` (the partition, on
the step it is chosen). `explain` (summary.json) states the chosen partition, the step and the times.

Differences from the paper and the public code, and why:
- No dense first iteration: the backward order comes from the device profile (its ready times,
  measured in calibration; DDP-style buckets flattened) instead of hooks during a dense step, so
  groups=1/groups=L runs equal the static whole-model/layer-wise runs from step 0.
- Probes train on the run's batches (each probe step is an ordinary training step); the code
  times backward + step on one fixed batch. `warmup` counts rounds of `probe_steps` steps, as the
  code's scheduler_warmup counts calls of its 20-iteration benchmark.
- Error feedback is the suite's (residual = compensated - sent; DGC's momentum correction when
  compressor=dgc); the code's residual memory decays the residual (beta 0.9). The project's
  optimizer applies the averaged gradient (momentum, weight decay); the code's pool bypasses it.
- Within a group, tensors are laid out in parameter order (a contiguous slice of the flat gradient
  when the backward order is the reverse of it, as usual), so groups=1 compresses exactly the
  static method's flat gradient. A group's compressor seed is the step seed mixed with its first
  parameter's index, as Layerwise seeds each layer, so groups=L equals layer granularity for
  randomized compressors too; a single group uses the step seed, as flat granularity does.
- Messages: each group is aggregated by the collective its payload needs (Group.aggregate: a
  sparse all-gather with its count message, shared Random-k values all-reduced); the static
  layer-wise method instead joins all layers into one payload and one all-gather. The probe-time
  broadcast (8 bytes per probe, as the code's) is not charged to the step.
- compressor.granularity is ignored (groups are compressed flat). k = max(1, floor(n/cf)) per
  group (this suite's CF convention); the code keeps int(n * ratio), the same for cf = 1/ratio up
  to rounding.
- The search's wall-clock cost (the model search's calibrations, the probes' bookkeeping) is not
  on the run's clock; the probes themselves are (they are training steps).
"""
from __future__ import annotations

import time

import torch

from compressors import COMPRESSORS, ErrorFeedback
from compressors.base import mix_seed
from gravac.cluster.comm import CommStats
from gravac.methods.base import (
    METHODS,
    CompressingMethod,
    RunStats,
    StepContext,
    StepResult,
    compressor_text,
    fixed_cf,
    raise_diverged,
)
from gravac.cluster.timeline import Piece, on_profile

from gravac.methods.mergecomp_search import (MAX_RECORDED, SEARCHES, Group_, MergeCompCfg, binary_search,  # noqa: F401
                                          candidates, cuts_text, default_cuts, exhaustive, greedy,
                                          payload_messages, split_cuts)

@METHODS.register("mergecomp", MergeCompCfg, label="MergeComp",
                  doc="MergeComp: compress merged groups of tensors as they become ready; search the partition")
class MergeComp(CompressingMethod):
    """Groups of consecutive tensors in backward order, compressed and sent one by one (docstring)."""
    name = "mergecomp"
    order = 8
    takes_fixed_cf = True        # a quantizer per group: its payloads are all-gathered and decoded

    def __init__(self, cfg: MergeCompCfg, compressor, env):
        super().__init__(cfg, compressor, env)
        from gravac.core.errors import UserError
        self.flat = COMPRESSORS[compressor.name].target.from_config(compressor)
        self.memories = []                                   # per worker, per group (set_partition)
        self.bwd = [i for b in env.buckets for i in b] if env.buckets else list(reversed(range(len(self.sizes))))
        if sorted(self.bwd) != list(range(len(self.sizes))):
            raise ValueError(f"buckets {env.buckets} do not cover the {len(self.sizes)} parameters once")
        self.offsets = [0]
        for s in self.sizes:
            self.offsets.append(self.offsets[-1] + s)
        n = len(self.sizes)
        self.y = cfg.groups or n
        if self.y > n:
            raise UserError(f"method.groups={cfg.groups} is more than the model's {n} parameter tensors; use at "
                            f"most {n} (or method.groups=0: one group per tensor)")
        if cfg.search == "exhaustive" and candidates(n, self.y) > cfg.max_candidates:
            raise UserError(f"method.search=exhaustive: {candidates(n, self.y):,} partitions of {n} tensors into "
                            f"{self.y} groups exceed method.max_candidates={cfg.max_candidates}; use "
                            "method.search=greedy or fewer groups")
        self.t = 0
        self.phase = "fixed" if cfg.search == "none" else "warmup"
        self.probed: dict[int, float] = {}
        self.samples: list[float] = []
        self.current: int | None = None            # split probed this step
        self.prev_probe: int | None = None         # split probed in the previous step
        self.chosen_at: int | None = None
        self.own_prev: float | None = None         # own estimate of the last step's time (no loop)
        self.set_partition(default_cuts(n, self.y))

    # --- partition and per-group error feedback ------------------------------------------------
    def make_group(self, lo: int, hi: int) -> Group_:
        """The group of tensors at backward positions [lo, hi)."""
        params = sorted(self.bwd[lo:hi])
        if params == list(range(params[0], params[-1] + 1)):
            return Group_(params, None, self.offsets[params[0]], self.offsets[params[-1] + 1])
        idx = torch.cat([torch.arange(self.offsets[i], self.offsets[i + 1]) for i in params]).to(self.device)
        return Group_(params, idx, 0, 0)

    def set_partition(self, cuts: list[int]) -> None:
        """Use `cuts` from now on; residuals (and DGC's momentum) move with their elements."""
        cuts = list(cuts)
        if getattr(self, "cuts", None) == cuts:
            return
        new = [self.make_group(a, b) for a, b in zip(cuts, cuts[1:])]
        full = [self.full_state(w) for w in range(len(self.memories))]
        self.cuts, self.groups = cuts, new
        self.memories = [[self.memory(g, full[w] if full else None) for g in new] for w in range(len(self.group.local_ranks))]

    def memory(self, g: Group_, full: dict | None) -> ErrorFeedback:
        mem = ErrorFeedback(g.numel, device=self.device, enabled=self.comp_cfg.error_feedback,
                            momentum=self.memory_momentum)
        if full is not None and mem.enabled:
            mem.load_state_dict({**mem.state_dict(), "residual": g.take(full["residual"]),
                                 "momentum_buffer": None if full["momentum_buffer"] is None
                                 else g.take(full["momentum_buffer"])})
        return mem

    def full_state(self, w: int) -> dict:
        """Worker w's residual (and momentum buffer) over the whole flat gradient."""
        res = torch.zeros(self.numel, device=self.device)
        u = torch.zeros(self.numel, device=self.device) if self.memory_momentum > 0 else None
        for g, mem in zip(self.groups, self.memories[w]):
            if mem.enabled:
                g.put(res, mem.residual)
                if u is not None:
                    g.put(u, mem._u)
        return {"residual": res, "momentum_buffer": u}

    # --- one step -----------------------------------------------------------------------------
    def step(self, grads, ctx: StepContext) -> StepResult:
        extra = self.plan(ctx, grads)
        cf = self.compressor_cls.scheduled_cf(self.comp_cfg, self.comp_cfg.cf, ctx.epoch)
        out = torch.zeros(self.numel, dtype=grads[0].dtype, device=grads[0].device)
        comm, pieces, measured, model = CommStats(), [], 0.0, 0.0
        for gi, grp in enumerate(self.groups):
            spans = [self.worker_span(lambda w=w, g=g, gi=gi: self.compress_group(w, gi, g, cf, ctx.step))
                     for w, g in enumerate(grads)]
            comps, payloads = [s[0][0] for s in spans], [s[0][1] for s in spans]
            avg, agg = self.group.aggregate(payloads)
            grp.put(out, avg)
            for mem, c, p in zip(self.memories_of(gi), comps, payloads):
                mem.update(c, p)
            slow, slow_model = max(s[1] for s in spans), max(s[2] for s in spans)
            measured, model = measured + slow, model + slow_model
            pieces.append(Piece(grp.params, slow_model, list(agg.messages)))
            comm += agg
        self.t += 1
        self.own_prev = ctx.compute_s + model + (comm.modelled_s if self.env.modelled_time else comm.measured_s)
        return StepResult(grad=out, cf=self.numel / comm.floats, floats_sent=comm.floats, comm=comm,
                          compress_s=measured, compress_model_s=model, pieces=pieces, extra=extra)

    def memories_of(self, gi: int) -> list[ErrorFeedback]:
        return [m[gi] for m in self.memories]

    def group_seed(self, step: int, w: int, gi: int) -> int:
        """The step seed; mixed with the group's first parameter when there are several groups."""
        seed = self.seed_for(step, 0, self.group.local_ranks[w])
        return seed if len(self.groups) == 1 else mix_seed(seed, self.groups[gi].params[0])

    def compress_group(self, w: int, gi: int, g: torch.Tensor, cf: float, step: int):
        """Worker w's group gi: compensated and compressed, each on the run's clock."""
        grp, mem = self.groups[gi], self.memories[w][gi]
        x = grp.take(g)
        comp = self.timed(self.key("compensate", grp), lambda: mem.compensate(x), keep=mem)
        seed = self.group_seed(step, w, gi)
        try:
            return comp, self.timed(self.key("compress", grp, cf), lambda: self.flat.compress(comp, cf, seed=seed))
        except ValueError as e:
            raise_diverged(e, step, self.name)

    def key(self, op: str, grp: Group_, cf: float | None = None) -> str:
        params = {"params": grp.params} if cf is None else {"params": grp.params, "cf": cf}
        return self.op_key(f"group_{op}", **params)

    # --- the search ---------------------------------------------------------------------------
    def plan(self, ctx: StepContext, grads) -> dict:
        """This step's partition (module docstring) and its record fields."""
        extra: dict = {}
        last = ctx.prev_step_s if ctx.prev_step_s is not None else self.own_prev
        if self.prev_probe is not None and last is not None:
            self.samples.append(last)
        if self.phase == "warmup" and self.t >= self.cfg.warmup * self.cfg.probe_steps:
            if self.cfg.search == "binary":
                self.phase = "probe"
            else:
                extra.update(self.model_search(ctx, grads))
        if self.phase == "probe":
            extra.update(self.probe(ctx))
        self.prev_probe = self.current if self.phase == "probe" else None
        extra.update(partition=list(self.cuts), search_phase=self.phase)
        return extra

    def probe(self, ctx: StepContext) -> dict:
        """Binary search: close the running probe when it has its steps, pick the next or the best."""
        extra: dict = {}
        if self.current is not None and len(self.samples) >= self.cfg.probe_steps:
            mean = self.group.broadcast_object(sum(self.samples) / len(self.samples))
            self.probed[self.current] = mean
            extra["candidates_s"] = {cuts_text(split_cuts(len(self.sizes), self.current)): mean}
            self.current, self.samples = None, []
        if self.current is None:
            n = len(self.sizes)
            kind, x = binary_search(n, self.cfg.search_step, self.probed)
            self.set_partition(split_cuts(n, x))
            if kind == "probe":
                self.current = x
            else:
                self.phase, self.chosen_at = "chosen", self.t
                extra["chosen"] = list(self.cuts)
        return extra

    def model_search(self, ctx: StepContext, grads) -> dict:
        """Exhaustive or greedy search under the timeline model (rank 0's choice for everyone)."""
        n, cost = len(self.sizes), self.model_cost(ctx, grads[0])
        search = exhaustive if self.cfg.search == "exhaustive" else greedy
        best, times = search(n, self.y, cost)
        best, times = self.group.broadcast_object((best, times))
        self.set_partition(best)
        self.phase, self.chosen_at = "chosen", self.t
        top = sorted(times.items(), key=lambda kv: kv[1])[:MAX_RECORDED]
        return {"chosen": list(best), "candidates_s": {cuts_text(c): t for c, t in top}}

    def model_cost(self, ctx: StepContext, g0: torch.Tensor):
        """cuts -> modelled step seconds: each group's compression on the run's clock and its
        messages, scheduled on the device profile (module docstring)."""
        full = self.full_state(0)
        cf = self.compressor_cls.scheduled_cf(self.comp_cfg, self.comp_cfg.cf, ctx.epoch)
        memo: dict[tuple[int, int], Piece] = {}

        def piece(lo: int, hi: int) -> Piece:
            if (lo, hi) not in memo:
                grp = self.make_group(lo, hi)
                memo[(lo, hi)] = self.model_piece(grp, g0, full, cf, ctx.step)
            return memo[(lo, hi)]

        def cost(cuts: list[int]) -> float:
            return on_profile(self.env.profile, ctx.compute_s, [piece(a, b) for a, b in zip(cuts, cuts[1:])]).step_s
        return cost

    def model_piece(self, grp: Group_, g0: torch.Tensor, full: dict, cf: float, step: int) -> Piece:
        """A candidate group on the clock, from the first local worker's gradient and residual."""
        res, u, m = grp.take(full["residual"]), full["momentum_buffer"], self.memory_momentum
        x = grp.take(g0)
        if not self.comp_cfg.error_feedback:
            comp_fn = lambda: x.clone()   # noqa: E731
        elif u is None:
            comp_fn = lambda: x + res     # noqa: E731
        else:
            ug = grp.take(u)
            comp_fn = lambda: ug.mul(m).add_(x).add_(res)   # noqa: E731
        t0 = time.perf_counter()
        comp = comp_fn()
        t_comp = time.perf_counter() - t0
        seed = self.seed_for(step, 0, self.group.local_ranks[0])
        seed = seed if self.y == 1 else mix_seed(seed, grp.params[0])     # as group_seed with several groups
        t0 = time.perf_counter()
        try:
            p = self.flat.compress(comp, cf, seed=seed)
        except ValueError as e:
            raise_diverged(e, step, self.name)
        t_press = time.perf_counter() - t0
        costs = self.env.costs
        if costs is not None:
            t_comp = costs.cost(self.key("compensate", grp), comp_fn, t_comp)
            t_press = costs.cost(self.key("compress", grp, cf), lambda: self.flat.compress(comp, cf, seed=seed), t_press)
        return Piece(grp.params, t_comp + t_press, payload_messages(self.group.net, self.group.world, p))

    # --- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"cuts": list(self.cuts), "memories": [[m.state_dict() for m in w] for w in self.memories],
                "t": self.t, "phase": self.phase, "probed": list(self.probed.items()), "samples": list(self.samples),
                "current": self.current, "prev_probe": self.prev_probe, "chosen_at": self.chosen_at,
                "own_prev": self.own_prev}

    def load_state_dict(self, state: dict) -> None:
        self.set_partition(state["cuts"])
        for mine, saved in zip(self.memories, state["memories"]):
            for m, s in zip(mine, saved):
                m.load_state_dict(s)
        self.t, self.phase, self.samples = state["t"], state["phase"], list(state["samples"])
        self.probed = {int(x): float(t) for x, t in state["probed"]}
        self.current, self.prev_probe, self.chosen_at = state["current"], state["prev_probe"], state["chosen_at"]
        self.own_prev = state["own_prev"]

    # --- what it did ------------------------------------------------------------------------------
    def explain(self, stats: RunStats) -> str | None:
        """The partition chosen, when, and the candidates' times (or why none was chosen)."""
        recs = stats.records
        if not recs or "partition" not in recs[-1]:
            return None
        how = f"{self.cfg.search} search" if self.cfg.search != "none" else "fixed partition"
        head = f"MergeComp ({how}, {len(recs[-1]['partition']) - 1} group(s) of {len(self.sizes)} tensors)"
        chosen = [r for r in recs if "chosen" in r]
        cands = {k: v for r in recs for k, v in r.get("candidates_s", {}).items()}
        binary = self.cfg.search == "binary"
        probed = ", ".join(f"[{k}] {v * 1e3:.2f} ms" for k, v in cands.items()) if binary else ""
        if self.cfg.search == "none":
            return f"{head}: partition {recs[-1]['partition']} (cut points in backward order) throughout"
        if not chosen:
            need = self.cfg.warmup * self.cfg.probe_steps
            return (f"{head}: the search did not finish in {stats.steps} steps (warm-up alone is {need}; "
                    f"probed {probed or 'nothing'}); lower method.warmup / method.probe_steps or train longer")
        c = chosen[-1]
        text = f"{head}: chose {c['chosen']} (cut points in backward order) at step {c['step']}"
        if probed:
            text += f"; probed {probed}"
        if not binary and cands:
            text += (f"; modelled {min(cands.values()) * 1e3:.2f} ms (best) to {max(cands.values()) * 1e3:.2f} ms "
                     f"over {len(cands)} candidate(s) recorded")
        return text

    # --- what a configuration means ---------------------------------------------------------------
    @classmethod
    def label(cls, cfg: MergeCompCfg, comp) -> str:
        base = compressor_text(comp) if comp.name in COMPRESSORS else comp.name
        if cfg.search == "none":
            what = {0: "layer-wise", 1: "whole-model"}.get(cfg.groups, f"{cfg.groups} groups")
            return f"MergeComp {base}, {what}"
        return f"MergeComp {base}, {cfg.search} search" + (f" ({cfg.groups} groups)" if cfg.groups != 2 else "")

    @classmethod
    def cf_text(cls, cfg, comp) -> str:
        fixed = fixed_cf(comp)
        return f"{fixed:.3g}x" if fixed else f"{comp.cf:g}x"

    @classmethod
    def ignores(cls, cfg, comp):
        keys = ["compressor.granularity"] + (["compressor.cf"] if fixed_cf(comp) else [])
        return keys + (["method.warmup", "method.probe_steps", "method.search_step", "method.max_candidates"]
                       if cfg.search == "none" else [])

    @classmethod
    def sort_values(cls, cfg, comp):
        return [fixed_cf(comp) or comp.cf, SEARCHES.index(cfg.search), cfg.groups]
