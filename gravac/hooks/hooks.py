"""DDP communication hooks: the suite's compressors and GraVAC in your own DistributedDataParallel code.

    state = SparseState(None, compressor="topk", cf=100)          # None: the default process group
    ddp_model.register_comm_hook(state, sparse_hook)
    state = GraVACState(None, compressor="topk", cf_min=10, cf_max=1000, window=500, epsilon=0.7)
    ddp_model.register_comm_hook(state, gravac_hook)

A state takes a process group and plain keyword options: the compressor's (any registered name,
its config fields: `granularity`, `error_feedback`, DGC's `sample_ratio`, ...) and, for GraVAC, the
method's (`cf_min`, `cf_max`, `window`, `step`, `epsilon`, `omega`, `policy`, `ewma`, `gain`, ...;
same defaults and checks as `method=gravac`). A wrong name, type or value raises one ValueError
line, the config check's own (gravac.core.check.checked).

Every rank must give its state the same options, `seed` included: a seeded compressor (Random-k
with shared_indices, the default) draws the same positions on every rank from the seed and sends
no indices, so `seed=rank` would scatter each rank's average to its own positions and the model
copies would drift apart; a compressor that draws per rank (shared_indices=False) mixes in the
rank itself. Differing options are refused, not overridden: at the first bucket every rank
all-gathers a hash of its options (state kind, compressor and its options, cf, seed, momentum,
GraVAC's or COVAP's options; once, not counted in `state.last`), and where they differ the hook
raises one ValueError line naming each differing option with each rank's value, instead of the
hang, gloo abort or silent drift that mismatched collectives give. Parameters with no elements
(`nn.Parameter(torch.zeros(0))`) send nothing.
After every backward, `state.last` says what this step sent: `floats_sent` per worker (values
only, as everywhere in the suite), `wire_bytes` (padding, indices and counts included), `cf` =
gradient elements / floats sent; `state.floats_total` sums the floats over all steps.

How the hooks meet DDP's contract: a hook gets one bucket's local (undivided) gradient and
returns a Future of the averaged bucket. Per bucket (keyed by `bucket.index()`) the state keeps
a compressor and an error-feedback memory (compressors/), built afresh when the bucket's layout
changes (DDP rebuilds its buckets after the first iteration); `bucket.is_last()` ends a step.
Dense and shared-index payloads are all-reduced, other sparse payloads go through the padded
all-gather of gravac.cluster.comm (counts first; never an empty buffer), quantized (packed) payloads
through an all-gather of their bytes (one size on every rank), 16-bit casts (fp16, bf16) through a
16-bit all-reduce of their values divided by the world size first (half_wire), and the average is
formed the way the Method does it (gravac.cluster.comm.sparse_mean, packed_mean), so a bucket's result equals the static
Method's on that bucket bit for bit. Every collective is issued by the hook itself, in bucket order,
and only decoding is chained as a Future callback.

Differences from the in-loop methods (bench/run.py), and why:
- Compression is per DDP bucket, not over the whole model: `granularity="flat"` compresses each
  bucket as one tensor; with "layer" (the default) every parameter tensor is compressed on its
  own, which selects the same entries as the loop. Seeds are per bucket and step
  (mix_seed(seed, bucket index), then the methods' step_seed), so seeded compressors agree across
  ranks but draw differently from the loop.
- The count all-gather before a sparse payload blocks the hook (one small message per bucket):
  its result sizes the payload buffer, and a collective issued from a Future callback could be
  issued in a different order on different ranks (gloo completes buckets on several threads).
- A bucket whose layout changes starts with a zero residual: the residual left by DDP's first
  iteration(s) is dropped once, when DDP rebuilds its buckets.
- GraVAC decides at `is_last()` from the whole model's gains of step i (per-bucket squared
  norms, summed, then all-gathered without blocking) and applies the decision at step i+1: a
  one-step lag. The loop decides before sending, from the same step's gains, which a hook cannot:
  bucket 0 is sent before the later buckets' gains exist. Consequences: step 0 is sent dense;
  the level decided at step i (c / min / dense) is applied with step i+1's cf_min and cs (they
  differ only right after a window update); error feedback follows what was actually sent.
  `python bench/hook_lag.py` measures the effect (README, "Use in your own DDP code").
- GraVAC's T_system uses the measured wall time between two steps' last buckets (a hook has no
  network model) and `batch_size` samples per worker (default 1: only ratios of T_compression
  matter to the saturation rule). The exchanged statistics (3 floats + the time per worker,
  6 + 1 with gain="code") are counted in `wire_bytes`, as in the loop.
- DGC's sparsity warm-up is not applied (a hook has no epochs): set `state.cf` between steps
  (every rank alike) to schedule a CF. DGC's momentum correction is `momentum=` (the optimizer's
  momentum, which the optimizer must then run without, as the loop does).
- GraVAC's `state.last` says what was sent (`level`, `cf_sent`, `cf_min`, `cs`) and
  `state.decision` the controller's latest Decision (smoothed and raw gains); only the deciding
  gain definition is computed (the loop records both for its step records).
- Hook states are not checkpointed (residuals and GraVAC's controller start afresh on restart).

Adding a state: subclass `CompressionState`, implement
`choose(slot, grad, bucket)` (compensate, pick the payload, update the residual) and, if it
decides per step, `end_step()`; its hook is `make_hook(TheState)`. COVAP's coarse-grained filter
is one: `CovapState` and `covap_hook` in gravac/hooks/covap_hook.py.
"""
from __future__ import annotations

import time
from dataclasses import fields

import torch

from compressors import COMPRESSORS, Payload
from gravac.core.check import checked
from gravac.methods.gains import (
    CodeGain,
    layer_norm_sum,
    payload_layer_norm_sum,
    segment_bounds,
)
from gravac.methods.gravac_control import Decision, GraVACCfg, controller_for, ratio, sq_norm
from gravac.hooks.state import CompressionState, HookOptions, Slot, compressor_cfg, differing_options, make_hook  # noqa: F401

__all__ = ["SparseState", "sparse_hook", "GraVACState", "gravac_hook", "CompressionState", "make_hook"]


class SparseState(CompressionState):
    """Static compression with error feedback: compressor `compressor` at CF `cf` every step.

    Keywords: `compressor` (a registered name), `cf` (dense size / sent size; settable between
    steps, every rank alike), `granularity` ("layer": per parameter tensor, or "flat": per bucket),
    `error_feedback`, `seed` (the same on every rank: checked at the first bucket, see the module
    docstring), `momentum` (DGC's momentum correction), and the compressor's own options.
    """

    def __init__(self, process_group=None, *, compressor: str = "topk", cf: float = 100.0,
                 seed: int = 0, momentum: float = 0.0, **options):
        comp_cfg = compressor_cfg(compressor, cf=cf, **options)
        super().__init__(process_group, comp_cfg, seed=seed, momentum=momentum)
        self.cf = comp_cfg.cf

    def options(self) -> dict:
        return {**super().options(), "cf": self.cf}

    def choose(self, slot: Slot, grad: torch.Tensor, bucket) -> Payload:
        comp = slot.memory.compensate(grad)
        p = slot.compressor.compress(comp, self.cf, seed=self.seed_for(bucket.index()))
        slot.memory.update(comp, p)
        return p


sparse_hook = make_hook(SparseState)


class GraVACState(CompressionState):
    """GraVAC as a hook: per bucket, compress at cf_min and (multi-level) at cf_min·cs, add the
    bucket's squared norms to the step's sums, send the level decided at the previous step; at
    the last bucket, gather the sums and decide the next step's level (a one-step lag, see the
    module docstring).

    Keywords: `compressor` (default "dgc", as the paper), its options (not `cf`: GraVAC chooses),
    `seed`, `momentum`, `batch_size` (samples per worker and step, for T_system), and every
    `method=gravac` option with its defaults (gravac/methods/gravac.py).
    """

    def __init__(self, process_group=None, *, compressor: str = "dgc", seed: int = 0, momentum: float = 0.0,
                 batch_size: int = 1, **options):
        method_keys = {f.name for f in fields(GraVACCfg)} - {"name"}
        comp_opts = {k: v for k, v in options.items() if k not in method_keys}
        if "cf" in comp_opts:
            raise ValueError("GraVAC chooses its own CF: give cf_min and cf_max instead of cf")
        cfg = checked(GraVACCfg, {"name": "gravac", **{k: v for k, v in options.items() if k in method_keys}},
                      "gravac")
        batch_size = checked(HookOptions, {"batch_size": batch_size}, type(self).__name__).batch_size
        comp_cfg = compressor_cfg(compressor, **comp_opts)
        if COMPRESSORS[compressor].target.fixed_cf(comp_cfg) is not None:
            free = [n for n in COMPRESSORS.names()
                    if COMPRESSORS[n].target.fixed_cf(COMPRESSORS[n].config(name=n)) is None]
            raise ValueError(f"GraVAC chooses compression factors, and compressor={compressor!r} has none to choose "
                             "(its options fix its CF: a quantizer's code width, a 16-bit cast's 2x): use "
                             f"SparseState for it, or a sparsifier ({', '.join(free)})")
        super().__init__(process_group, comp_cfg, seed=seed, momentum=momentum)
        self.cfg, self.batch_size = cfg, batch_size
        self.code = cfg.gain == "code"
        self.ctl = controller_for(cfg, self.world)
        self.code_min, self.code_c = CodeGain(cfg.gain_window, cfg.gain_alpha), CodeGain(cfg.gain_window, cfg.gain_alpha)
        self.level = "dense"                     # step 0: no gains yet
        self.decision: Decision | None = None    # the latest decision (for the step after it)
        self._pending = None                     # (step, Future of the gathered sums)
        self._t_last: float | None = None
        self._sums = [0.0] * 6

    def options(self) -> dict:
        out = {**super().options(), "batch_size": self.batch_size}
        out.pop("cf")                             # not used: GraVAC chooses
        return {**out, **{f.name: getattr(self.cfg, f.name) for f in fields(self.cfg) if f.name != "name"}}

    def begin(self, bucket) -> None:
        if self._pending is not None:
            self.decide()

    def decide(self) -> Decision:
        """Wait for the last step's gathered sums and take the decision for the current step."""
        i, fut = self._pending
        self._pending = None
        rows = [t.tolist() for t in fut.wait()]
        k = 6 if self.code else 3
        s = [sum(r[j] for r in rows) for j in range(k)]
        t_iter = max(r[k] for r in rows)
        if self.code:
            d_min = self.code_min.update(s[4], s[3])
            d_c = self.code_c.update(s[5], s[3])
        else:
            d_min, d_c = ratio(s[1], s[0]), ratio(s[2], s[0])
        self.decision = self.ctl.step(i, d_min, d_c, t_iter, self.world * self.batch_size)
        self.level = self.decision.level
        return self.decision

    def choose(self, slot: Slot, grad: torch.Tensor, bucket) -> Payload:
        cf_min, cs, idx = self.ctl.cf_min, self.ctl.cs, bucket.index()
        comp = slot.memory.compensate(grad)
        p_min = slot.compressor.compress(comp, cf_min, seed=self.seed_for(idx))
        p_c = slot.compressor.recompress(p_min, cs, seed=self.seed_for(idx, 1)) if cs > 1 else p_min
        norms = [sq_norm(comp), sq_norm(p_min.values), sq_norm(p_c.values)]
        if self.code:
            bounds = segment_bounds(slot.sizes)
            norms += [layer_norm_sum(grad, bounds), payload_layer_norm_sum(p_min, bounds),
                      payload_layer_norm_sum(p_c, bounds)]
        for j, v in enumerate(norms):
            self._sums[j] += v
        if self.level == "c":
            sent = p_c
        elif self.level == "min":
            sent = p_min
        else:
            sent = Payload(comp, None, comp.numel())
        slot.memory.update(comp, sent)
        return sent

    def end_step(self) -> None:
        """Record the level sent, then start gathering the step's sums (+ its wall time)."""
        now = time.perf_counter()
        t_iter = now - self._t_last if self._t_last is not None else 0.0
        self._t_last = now
        k = 6 if self.code else 3
        row = torch.tensor(self._sums[:k] + [t_iter], dtype=torch.float64)
        self._wire += row.numel() * row.element_size()
        out = [torch.empty_like(row) for _ in range(self.world)]
        fut = self.group.allgather([out], [row]).get_future()
        self._pending = (self.iteration, fut)
        self._sums = [0.0] * 6
        cf_sent = {"c": self.ctl.cf_c, "min": self.ctl.cf_min}.get(self.level, 1.0)
        level = self.level
        super().end_step()
        self.last.update(level=level, cf_sent=cf_sent, cf_min=self.ctl.cf_min, cs=self.ctl.cs)


gravac_hook = make_hook(GraVACState)
