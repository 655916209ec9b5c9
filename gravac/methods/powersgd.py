"""PowerSGD (Vogels, Karimireddy & Jaggi, NeurIPS 2019) as a method: rank-r gradient approximation.

Per parameter tensor viewed as an n × m matrix M (first dimension × the rest) of the
error-compensated gradient: P = M Q, all-reduce P, orthogonalise, Q = Mᵀ P, all-reduce Q (mean),
approximation P Qᵀ; each worker's residual is its compensated M minus the averaged approximation.
Q is shared by all workers: drawn from the run's seed, then (warm start) the averaged Q of the
previous step, orthogonalised before use. Tensors that would not compress go dense in one
all-reduce: 1-D tensors, and by torch's rule those with (n + m)·r·min_compression_rate ≥ n·m
(r = min(n, m, rank)). Floats sent per worker per step = Σ (n + m)·r + uncompressed elements;
CF = parameters / that. Three collectives per step, each a message on the timeline (uncompressed
tensors, P, Q); compression (compensate, the matmuls, orthogonalisation, approximation, residual)
is timed per operation on the run's clock like every compressor.

Checked against torch's `powerSGD_hook` (tests/test_powersgd.py, 2 gloo processes): same result
within float tolerance when both use the same rank, min_compression_rate, orthogonalisation
epsilon, warm start, error feedback, start step, and the same initial Q. Differences from torch's
hook and the public code, and why:
- Initial Q: torch seeds `torch.manual_seed(np.random.RandomState(seed).randint(1e9))` once per
  DDP bucket and draws the Qs in the order of the bucket's tensors grouped by shape, which depends
  on DDP's bucketing; here every tensor draws from (seed, step, tensor index), the same on sim and
  ddp. The agreement test hands ours the Q that torch's rule draws.
- Uncompressed tensors: torch keeps local − average as their residual (it sums to zero over the
  workers, so the averaged gradient is the same up to rounding); here their residual is zero,
  as what a worker sent dense it sent exactly.
- 1-D tensors never compress; torch would view one as an n × 1 matrix and compress it when
  min_compression_rate < n/(n + 1). The PowerSGD paper and Accordion's code send them dense.
- P is averaged, torch sums it: orthogonalisation removes the scale (bitwise for 2 workers).
- Orthogonalisation is Gram–Schmidt at every rank; torch uses a QR factorisation above rank 2,
  which gives the same columns up to sign, and the approximation P Pᵀ M does not depend on signs.
- `epsilon` defaults to 1e-8, torch's to 0: with 0 an all-zero gradient tensor (an unused layer)
  turns into NaN; torch's documentation suggests 1e-8 for that case.
- `start_step` defaults to 0 (the paper compresses from the start); torch's start_powerSGD_iter
  defaults to 1000 (dense all-reduces before it, partly for DDP's bucket rebuild).
- The public PowerSGD/Accordion code (epfml/powersgd, uw-mad-dash/Accordion powersgd_grad.py)
  compresses every tensor of 2+ dimensions and does not orthogonalise a reused Q; this follows
  torch's hook, which does both, as the check is against torch.
- A tensor whose rank changes (Accordion switching) gets a fresh Q at the new rank, as
  Accordion's code builds a new reducer on a switch; its residual is kept (zero_memory off).
- Modelled time: the whole model is compressed after backward (one timeline piece: compression,
  then the three messages), as for the other methods here; torch's hook runs per DDP bucket and
  overlaps with backward. The orthogonalisations and the approximation, computed once for all
  simulated workers, count once in the step's compression time (every real worker computes them).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from compressors.lowrank import (
    compresses,
    effective_rank,
    matrix_shape,
    orthogonalise,
    random_q,
)
from gravac.core.registry import option
from gravac.cluster.comm import CommStats
from gravac.methods.base import METHODS, Method, StepContext, StepResult, raise_diverged
from gravac.core.schema import MethodCfg


@dataclass
class PowerSGDCfg(MethodCfg):
    """PowerSGD's options; defaults as torch's hook except epsilon and start_step (module doc)."""
    rank: int = option(1, check=lambda v: v >= 1, valid=">= 1")                     # r of the approximation
    min_compression_rate: float = option(2.0, check=lambda v: v > 0, valid="> 0")    # torch's compress rule
    warm_start: bool = True                    # reuse the previous step's Q (else a fresh one each step)
    error_feedback: bool = True
    epsilon: float = option(1e-8, check=lambda v: v >= 0, valid=">= 0")   # added to norms in orthogonalisation
    start_step: int = option(0, check=lambda v: v >= 0, valid=">= 0")     # dense all-reduce before this step


@dataclass
class Plan:
    """Which tensors compress at which rank: (index, offset, n, m, r) each, and the rest's offsets."""
    low: list[tuple[int, int, int, int, int]]
    dense: list[tuple[int, int]] = field(default_factory=list)      # (offset, size)

    @property
    def floats(self) -> int:
        return sum((n + m) * r for _, _, n, m, r in self.low) + sum(s for _, s in self.dense)


@METHODS.register("powersgd", PowerSGDCfg, label="PowerSGD",
                  doc="PowerSGD: rank-r approximation per tensor, two all-reduces (Vogels et al. 2019)")
class PowerSGD(Method):
    """Rank-`rank` PowerSGD on every tensor that compresses, dense on the rest; see module doc."""
    name = "powersgd"
    order = 3

    def __init__(self, cfg: PowerSGDCfg, compressor, env):
        super().__init__(cfg, compressor, env)
        offsets = [0]
        for n in self.sizes:
            offsets.append(offsets[-1] + n)
        self.offsets = offsets
        self.qs: dict[int, torch.Tensor] = {}          # tensor index -> the shared Q (m × r)
        self.residuals = [torch.zeros(self.numel, device=self.device) if cfg.error_feedback else None
                          for _ in self.group.local_ranks]

    # --- what is sent ------------------------------------------------------------------------
    def ranks(self, ctx: StepContext) -> list[int]:
        """The rank per tensor this step (Accordion with PowerSGD overrides it)."""
        return [self.cfg.rank] * len(self.sizes)

    def plan(self, ranks: list[int]) -> Plan:
        """Compressed tensors (with their matrix shape and effective rank) and dense ones."""
        plan = Plan([])
        for i, (shape, r) in enumerate(zip(self.shapes, ranks)):
            if compresses(shape, r, self.cfg.min_compression_rate):
                n, m = matrix_shape(shape)
                plan.low.append((i, self.offsets[i], n, m, effective_rank(shape, r)))
            else:
                plan.dense.append((self.offsets[i], self.sizes[i]))
        return plan

    def step(self, grads, ctx: StepContext) -> StepResult:
        if ctx.step < self.cfg.start_step:
            avg, comm = self.group.allreduce_mean(grads)
            return StepResult(grad=avg, cf=1.0, floats_sent=comm.floats, comm=comm)
        return self.reduce(grads, self.ranks(ctx), ctx.step)

    # --- the step ------------------------------------------------------------------------------
    def reduce(self, grads: list[torch.Tensor], ranks: list[int], step: int, extra: dict | None = None) -> StepResult:
        """Compensate, all-reduce the dense part, P and Q, approximate, keep the residuals."""
        plan = self.plan(ranks)
        key = self._op_key(ranks)
        comps, t1 = self._each(grads, lambda w, g: self.timed(key("compensate"), lambda: self._compensate(w, g)))
        out = torch.empty(self.numel, dtype=grads[0].dtype, device=self.device)
        comm = CommStats()
        if plan.dense:
            dense, c = self.group.allreduce_mean([torch.cat([x[o:o + s] for o, s in plan.dense]) for x in comps])
            _scatter(out, plan.dense, dense)
            comm += c
        t2 = t3 = t4 = (0.0, 0.0)
        if plan.low:
            qs, t0 = self._span(lambda: self.timed(key("orthogonalise_q"), lambda: self._shared_qs(plan, step)))
            ps, t2 = self._each(comps, lambda w, x: self.timed(key("p"), lambda: _products(x, plan, qs, left=True)))
            p_avg, c = self.group.allreduce_mean(ps)
            comm += c
            p_hat, t3 = self._span(lambda: self.timed(key("orthogonalise_p"), lambda: self._orthogonal(p_avg, plan)))
            qw, t4 = self._each(comps, lambda w, x: self.timed(key("q"), lambda: _products(x, plan, p_hat, left=False)))
            q_avg, c = self.group.allreduce_mean(qw)
            comm += c
            q_new, t5 = self._span(lambda: self.timed(key("approximate"), lambda: self._approximate(out, plan, p_hat, q_avg)))
            t3 = (t0[0] + t3[0] + t5[0], t0[1] + t3[1] + t5[1])
            if self.cfg.warm_start:
                self.qs.update(q_new)
        if not torch.isfinite(out).all():
            raise_diverged(ValueError("nan or inf in the approximation"), step, self.name)
        _, t6 = self._each(comps, lambda w, x: self.timed(key("residual"), lambda: self._keep_residual(w, x, out, plan)))
        spans = [t1, t2, t3, t4, t6]
        return StepResult(grad=out, cf=self.numel / comm.floats, floats_sent=comm.floats, comm=comm,
                          compress_s=sum(s[0] for s in spans), compress_model_s=sum(s[1] for s in spans),
                          extra=dict(extra or {}))

    def _compensate(self, w: int, g: torch.Tensor) -> torch.Tensor:
        r = self.residuals[w]
        return g if r is None else g + r

    def _shared_qs(self, plan: Plan, step: int) -> dict[int, torch.Tensor]:
        """Every compressed tensor's Q, orthogonalised: the kept one (warm start, same rank) or a
        fresh draw from (seed, step, tensor)."""
        out = {}
        for i, _, _, m, r in plan.low:
            q = self.qs.get(i)
            if q is None or q.shape[1] != r or not self.cfg.warm_start:
                q = random_q(m, r, self.seed, step, i, device=self.device)
            out[i] = orthogonalise(q, self.cfg.epsilon)
        return out

    def _orthogonal(self, p_flat: torch.Tensor, plan: Plan) -> dict[int, torch.Tensor]:
        """The averaged Ps, cut per tensor and orthogonalised."""
        out, pos = {}, 0
        for i, _, n, _, r in plan.low:
            out[i] = orthogonalise(p_flat[pos:pos + n * r].view(n, r), self.cfg.epsilon)
            pos += n * r
        return out

    def _approximate(self, out: torch.Tensor, plan: Plan, p_hat: dict, q_flat: torch.Tensor) -> dict:
        """Write P Qᵀ of every compressed tensor into `out`; the averaged Qs, per tensor."""
        qs, pos = {}, 0
        for i, o, n, m, r in plan.low:
            q = q_flat[pos:pos + m * r].view(m, r).clone()
            out[o:o + n * m] = (p_hat[i] @ q.T).reshape(-1)
            qs[i] = q
            pos += m * r
        return qs

    def _keep_residual(self, w: int, comp: torch.Tensor, out: torch.Tensor, plan: Plan) -> None:
        """Residual = compensated − averaged approximation on compressed tensors, 0 elsewhere."""
        r = self.residuals[w]
        if r is None:
            return
        r.zero_()
        for _, o, n, m, _ in plan.low:
            r[o:o + n * m] = comp[o:o + n * m] - out[o:o + n * m]

    # --- timing ----------------------------------------------------------------------------------
    def _each(self, xs, fn):
        """fn(w, x) for every local worker; results and the slowest worker's (measured, clock) s."""
        outs, slow = [], (0.0, 0.0)
        for w, x in enumerate(xs):
            out, dt, model = self.worker_span(lambda: fn(w, x))     # noqa: B023 (called at once)
            outs.append(out)
            slow = (max(slow[0], dt), max(slow[1], model))
        return outs, slow

    def _span(self, fn):
        """fn() done once for all local workers (shared values): result and its (measured, clock) s."""
        out, dt, model = self.worker_span(fn)
        return out, (dt, model)

    def _op_key(self, ranks: list[int]):
        """Names operations for the clock's cost table: method options, layout and ranks."""
        text = f"{self.cfg!r}|{self.shapes}|{ranks}"
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        return lambda op: f"powersgd:{digest}:{op}"

    # --- checkpoints and descriptions ------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"qs": {i: q.clone() for i, q in self.qs.items()},
                "residuals": [None if r is None else r.clone() for r in self.residuals]}

    def load_state_dict(self, state: dict) -> None:
        self.qs = {int(i): q.to(self.device).clone() for i, q in state["qs"].items()}
        for mine, saved in zip(self.residuals, state["residuals"]):
            if mine is not None:
                mine.copy_(saved.to(self.device))

    @classmethod
    def label(cls, cfg, comp) -> str:
        return f"PowerSGD rank {cfg.rank}"

    @classmethod
    def cf_text(cls, cfg, comp) -> str:
        return f"rank {cfg.rank}"

    @classmethod
    def sort_values(cls, cfg, comp):
        return [cfg.rank]

    @classmethod
    def state_bytes(cls, cfg, comp, numel, momentum):
        return 4 * numel * (2 if cfg.error_feedback else 1)   # residual + the compensated gradient


def _products(x: torch.Tensor, plan: Plan, factors: dict, left: bool) -> torch.Tensor:
    """One worker's M Q (left) or Mᵀ P̂ (right) of every compressed tensor, flat in plan order."""
    parts = []
    for i, o, n, m, _ in plan.low:
        mat = x[o:o + n * m].view(n, m)
        parts.append(((mat if left else mat.T) @ factors[i]).reshape(-1))
    return torch.cat(parts)


def _scatter(out: torch.Tensor, segments: list[tuple[int, int]], values: torch.Tensor) -> None:
    """Write consecutive pieces of `values` into `out` at the (offset, size) segments."""
    pos = 0
    for o, s in segments:
        out[o:o + s] = values[pos:pos + s]
        pos += s
