"""L-GreCo over PowerSGD ranks, the paper's own setting (Alimohammadi, Markov, Frantar, Alistarh,
MLSys 2024, arXiv 2210.17357; public code LGrCo/L-GreCo, hooks/lgreco_hook.py): a PowerSGD rank per
tensor, chosen by L-GreCo's dynamic program so that the values sent are fewest while the total
compression error stays within `budget_scale` times that of uniform PowerSGD at `rank`.

PowerSGD itself is gravac/methods/powersgd.py (its differences from torch's hook are listed there);
the DP and its fallbacks are gravac/methods/lgreco.py's `decide` (discretisation into `buckets`
rounded up, so the chosen ranks never exceed the budget on the errors the DP saw). Here:

- The DP's layers are the tensors PowerSGD compresses at the default `rank` (torch's rule with
  `min_compression_rate`; the code's `tensors_to_compress`, decided at the default rank). 1-D
  tensors and those that would not compress at `rank` are sent dense throughout and are not part of
  the DP; their floats are added to the predicted ones.
- Every `period` steps (code: adjust_freq 100; first at step `start_step` + `period`) rank 0 takes
  the mean of its own error-compensated gradients over the last `window` steps of the period (code:
  acc_iter 10), and tabulates per DP tensor (an n × m matrix M) and candidate rank r:
  size (n + m)·min(n, m, r) (the code's size) and error ||M − M_r||, the Frobenius norm (the code's
  `torch.dist`; `error=squared` uses its square). `error_method=svd` (default) takes the optimal
  rank-r error from the singular values, sqrt(Σ_{i>r} σ_i²) (the code's `error_method='SVD'`):
  exact and deterministic. `error_method=power` is the code's default ('Power'): `power_iters` (5)
  power iterations from a random Q (orthogonalise Q, P = M Q, orthogonalise P, Q = Mᵀ P), error
  ||M − P Qᵀ||; Q is drawn from (seed, step, tensor, rank), the same on sim and ddp.
- A candidate rank at which torch's rule would send the tensor dense ((n + m)·r·min_compression_rate
  ≥ n·m, e.g. r ≥ min(n, m)) is priced as PowerSGD here would send it: n·m values, error 0.
- The budget is `budget_scale` (code: alpha, 1) × the total error of uniform `rank` on the same
  table; rank 0 broadcasts the ranks; every worker uses them from that step on. A tensor whose rank
  changes gets a fresh Q and keeps its residual (PowerSGD's rule, as Accordion's switch).
- The solve (the table and the DP) is rank 0's compression time of that step, on the run's clock
  (every worker waits for the broadcast), as for method=lgreco.

Differences from the public code, and why:
- Default error measure SVD, not the code's default 5 power iterations from an unseeded random Q:
  the optimal rank-r error is deterministic and what the power iterations approach; `power` is
  offered with a seeded Q (`error_method=power`).
- Candidates are a list (`candidates`, default [1, 2, 3, 4] = the code's floor(0.5·r)..ceil(2·r)
  around its rank r = 2) instead of every integer in that range; `rank` must be one of them (so
  uniform `rank` is always feasible).
- The code re-draws every Q (all tensors) after each adjustment; here only the tensors whose rank
  changed get a fresh Q, the others keep their warm start (a solve that changes nothing changes
  nothing, so `candidates=[rank]` is exactly method=powersgd).
- A candidate rank at which torch's rule would not compress a DP tensor ((n + m)·r·min_compression_rate
  ≥ n·m) is priced and sent dense here (n·m values, error 0), as this suite's PowerSGD decides per
  step and rank; the code fixes the set of compressed tensors at the default rank and compresses
  them at any chosen rank, and prices a rank above min(n, m) at min(n, m)·(n + m) + 1 so that the
  DP never picks it.
- Ranks are at least 1: the code's range floor(0.5·r)..ceil(2·r) includes rank 0 for r = 1.
- DP details as method=lgreco (module doc there): no ≥1-bucket clamp, the total may use every
  bucket; infeasible or no smaller → the uniform default (the code keeps the previous ranks when
  infeasible); the accumulated gradient is the plain mean (the code scales by delta/acc_iter,
  which changes no decision).
- The code's `warmup_after_adjusting` (off by default there) is not offered; PowerSGD's own dense
  warm-up is `start_step` (0 here, the code 1000; the schedule counts from it as the code's iter_rel).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from compressors.lowrank import compresses, effective_rank, matrix_shape, orthogonalise, random_q
from gravac.core.errors import UserError
from gravac.core.registry import option
from gravac.methods.base import METHODS, RunStats, StepContext, StepResult
from gravac.methods.lgreco import SolveCfg, SolveWindow, charge_solve, decide
from gravac.methods.powersgd import PowerSGD, PowerSGDCfg


def _ranks_ok(v) -> bool:
    return (isinstance(v, (list, tuple)) and len(v) >= 1
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v))


@dataclass
class LGrecoPowerSGDCfg(SolveCfg, PowerSGDCfg):
    """PowerSGD's options (`rank`: the uniform default whose error is the budget) and L-GreCo's."""
    rank: int = option(2, check=lambda v: v >= 1, valid=">= 1",
                       doc="uniform default rank whose total error is the budget (one of the candidates)")
    candidates: list = option(factory=lambda: [1, 2, 3, 4], check=_ranks_ok, valid="a non-empty list of ranks >= 1",
                              doc="PowerSGD ranks a tensor may use (code: floor(rank/2)..ceil(2 rank))")
    error: str = option("norm", choices=("norm", "squared"),
                        doc="per-tensor error ||M - M_r|| (code) | ||M - M_r||^2")
    error_method: str = option("svd", choices=("svd", "power"),
                               doc="optimal rank-r error from singular values | power iterations (code's default)")
    power_iters: int = option(5, check=lambda v: v >= 1, valid=">= 1",
                              doc="power iterations per candidate with error_method=power (code: error_method_iter)")

    def errors(self, prefix: str) -> list[str]:
        out = []
        if _ranks_ok(self.candidates) and self.rank not in self.candidates:
            out.append(f"{prefix}.rank={self.rank} must be one of {prefix}.candidates={list(self.candidates)}, "
                       "so that uniform PowerSGD at that rank (the budget) is always a feasible choice")
        return out + super().errors(prefix)


# --- the error table (pure numbers) -------------------------------------------------------------

def rank_errors_svd(mat: torch.Tensor, ranks: list[int]) -> list[float]:
    """||M − M_r||² of the best rank-r approximation M_r, per r: Σ_{i≥r} σ_i² (float64)."""
    s2 = torch.linalg.svdvals(mat.double()).square()
    tail = torch.flip(torch.cumsum(torch.flip(s2, [0]), 0), [0]).tolist() + [0.0]    # tail[k] = Σ_{i≥k} σ_i²
    return [float(tail[min(r, len(s2))]) for r in ranks]


def rank_error_power(mat: torch.Tensor, q: torch.Tensor, iters: int) -> float:
    """||M − P Qᵀ||² after `iters` power iterations from `q` (m × r), as the code's 'Power' (float64)."""
    m = mat.double()
    q = q.double()
    p = None
    for _ in range(iters):
        q = orthogonalise(q)
        p = orthogonalise(m @ q)
        q = m.T @ p
    return float((m - p @ q.T).square().sum())


@METHODS.register("lgreco_powersgd", LGrecoPowerSGDCfg, label="L-GreCo (PowerSGD)",
                  doc="L-GreCo: per-tensor PowerSGD ranks by a DP under uniform rank's error (the paper's setting)")
class LGrecoPowerSGD(PowerSGD):
    """PowerSGD whose rank per tensor L-GreCo's DP re-chooses every `period` steps; see module doc."""
    name = "lgreco_powersgd"
    order = 4

    def __init__(self, cfg: LGrecoPowerSGDCfg, compressor, env):
        super().__init__(cfg, compressor, env)
        errors = cfg.errors("method")
        if errors:
            raise UserError(errors[0])
        self.cands = [int(c) for c in cfg.candidates]
        self.default = self.cands.index(int(cfg.rank))
        self.layers = [i for i, s in enumerate(self.shapes) if compresses(s, cfg.rank, cfg.min_compression_rate)]
        self.fixed_floats = sum(n for i, n in enumerate(self.sizes) if i not in self.layers)   # always dense
        self.tensor_ranks = [int(cfg.rank)] * len(self.sizes)
        self.window = SolveWindow(self.group, cfg.period, cfg.window, self.numel, self.device)
        self.announced = False
        self._comps: dict[int, torch.Tensor] | None = None     # this step's compensated gradients, by worker
        digest = hashlib.sha256(f"{cfg!r}|{self.shapes}".encode()).hexdigest()[:12]
        self._solve_key = lambda op: f"lgreco_powersgd:{digest}:{op}"

    def _op_key(self, ranks: list[int]):
        """PowerSGD's operations named by PowerSGD's own options (method=powersgd's name, not
        L-GreCo's fields), so that at the same ranks they are the same entries of the clock's cost
        table as method=powersgd's (uniform `rank`: the study's costs of arm powersgd2)."""
        own = PowerSGDCfg(**{f.name: getattr(self.cfg, f.name) for f in dataclasses.fields(PowerSGDCfg)})
        own.name = "powersgd"
        digest = hashlib.sha256(f"{own!r}|{self.shapes}|{ranks}".encode()).hexdigest()[:12]
        return lambda op: f"powersgd:{digest}:{op}"

    # --- levels ------------------------------------------------------------------------------------
    def ranks(self, ctx: StepContext) -> list[int]:
        return list(self.tensor_ranks)

    def levels(self) -> list[int | None]:
        """The recorded level of every tensor: its rank if the DP chooses it, None if always dense."""
        return [r if i in self.layers else None for i, r in enumerate(self.tensor_ranks)]

    # --- one step -------------------------------------------------------------------------------------
    def step(self, grads, ctx: StepContext) -> StepResult:
        rel = ctx.step - self.cfg.start_step           # the code's iter_rel
        if rel < 0:
            return super().step(grads, ctx)            # PowerSGD's dense warm-up
        solved = self.solve_now(ctx.step) if self.window.due(rel) else None
        extra = {}
        if not self.announced:
            extra["lgreco_levels"] = self.levels()
            self.announced = True
        self._comps = {}
        try:
            res = self.reduce(grads, self.ranks(ctx), ctx.step, extra=extra)
            comps = [self._comps[w] for w in range(len(grads))]
        finally:
            self._comps = None
        self.window.add(rel, comps[0])
        if solved is not None:
            charge_solve(res, solved, lambda: self.measured_error(comps, res.grad))
        return res

    def _compensate(self, w: int, g: torch.Tensor) -> torch.Tensor:
        out = super()._compensate(w, g)
        if self._comps is not None:
            self._comps[w] = out       # by worker: a first cost calibration runs this twice
        return out

    def solve_now(self, step: int) -> tuple[dict, tuple[float, float]]:
        """Rank 0 solves on its averaged window and broadcasts; every worker takes the ranks.
        Returns the record and the solve's seconds (measured, on the run's clock; 0 off rank 0)."""
        out, spent = self.window.solve(lambda a: self.solve_on(a, step), self.worker_span)
        ranks = out.pop("ranks")
        if ranks != self.tensor_ranks:
            self.tensor_ranks, self.announced = ranks, False
        return out, spent

    def solve_on(self, a: torch.Tensor, step: int) -> dict:
        """The error and size table of `a`, the DP's ranks and what they predict (timed)."""
        errors, sizes = self.timed(self._solve_key(f"table({self.cfg.error_method})"), lambda: self.table(a, step))
        d = self.timed(self._solve_key("dp"), lambda: decide(errors, sizes, self.default, self.cfg.budget_scale,
                                                             self.cfg.buckets))
        ranks = list(self.tensor_ranks)
        for row, i in enumerate(self.layers):
            ranks[i] = self.cands[d.choice[row]]
        return {"ranks": ranks, "error_budget": d.budget, "error_predicted": d.error,
                "error_default": float(errors[:, self.default].sum()) if len(self.layers) else 0.0,
                "floats_predicted": d.floats + self.fixed_floats, "floats_default": d.default_floats + self.fixed_floats,
                "fallback": d.fallback}

    def table(self, a: torch.Tensor, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Per DP tensor and candidate rank: the error of `a`'s rank-r approximation and the values
        PowerSGD sends at that rank (dense, error 0, where torch's rule would not compress)."""
        errors = np.zeros((len(self.layers), len(self.cands)))
        sizes = np.zeros_like(errors)
        for row, i in enumerate(self.layers):
            shape, o = self.shapes[i], self.offsets[i]
            n, m = matrix_shape(shape)
            mat = a[o:o + n * m].view(n, m)
            low = [compresses(shape, r, self.cfg.min_compression_rate) for r in self.cands]
            ks = [effective_rank(shape, r) for r in self.cands]
            if self.cfg.error_method == "svd":
                sq = rank_errors_svd(mat, ks)
            else:
                sq = [rank_error_power(mat, random_q(m, k, self.seed, step, i, k, 1), self.cfg.power_iters) if ok else 0.0
                      for k, ok in zip(ks, low)]
            for c, (ok, k) in enumerate(zip(low, ks)):
                e2 = sq[c] if ok else 0.0
                errors[row, c] = e2 if self.cfg.error == "squared" else math.sqrt(e2)
                sizes[row, c] = (n + m) * k if ok else n * m
        return errors, sizes

    def measured_error(self, comps: list[torch.Tensor], out: torch.Tensor) -> float:
        """This step's total error at the new ranks, mean over workers: Σ over the DP's tensors of
        ||compensated − averaged approximation|| (each worker's new residual; 0 for a tensor sent
        dense), gathered for the record only, not a cost."""
        plan = self.plan(self.tensor_ranks)
        mine = []
        for comp in comps:
            total = 0.0
            for i, o, n, m, _ in plan.low:
                if i in self.layers:
                    sq = float((comp[o:o + n * m] - out[o:o + n * m]).double().square().sum())
                    total += sq if self.cfg.error == "squared" else math.sqrt(sq)
            mine.append([total])
        rows = self.group.bookkeeping(mine)
        return sum(r[0] for r in rows) / len(rows)

    # --- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "tensor_ranks": list(self.tensor_ranks), **self.window.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.tensor_ranks, self.announced = [int(r) for r in state["tensor_ranks"]], False
        self.window.load_state_dict(state)

    # --- what it did ------------------------------------------------------------------------------
    def _weights(self, stats: RunStats, by_size: bool) -> Counter:
        """Layer-steps (or parameter-steps) per rank over the run from the announced levels;
        tensors outside the DP (always dense) count under "dense"."""
        counts: Counter = Counter()
        levels: list | None = None
        for r in stats.records:
            levels = r.get("lgreco_levels", levels)
            for lv, n in zip(levels or [], self.sizes):
                counts["dense" if lv is None else f"{lv:g}"] += n if by_size else 1
        return counts

    @staticmethod
    def _ordered(counts: Counter) -> list[str]:
        return sorted(counts, key=lambda k: (k == "dense", float(k) if k != "dense" else 0.0))

    def level_histogram(self, stats: RunStats) -> dict[str, int]:
        counts = self._weights(stats, by_size=False)
        return {k: counts[k] for k in self._ordered(counts)}

    def parameter_shares(self, stats: RunStats) -> dict[str, float]:
        """Share of parameter-steps at each rank (each tensor weighted by its size)."""
        weight = self._weights(stats, by_size=True)
        total = sum(weight.values()) or 1
        return {k: weight[k] / total for k in self._ordered(weight)}

    def summarize(self, stats: RunStats) -> dict | None:
        return {"layer_rank_histogram": self.level_histogram(stats), "parameter_rank_share": self.parameter_shares(stats),
                "layer_sizes": list(self.sizes), "level_unit": "rank"}

    def explain(self, stats: RunStats) -> str | None:
        solves = [r for r in stats.records if "lgreco_solve" in r]
        if not solves:
            return (f"L-GreCo (PowerSGD) never solved in {stats.steps} steps (its first solve is at step "
                    f"method.start_step + method.period = {self.cfg.start_step + self.cfg.period}), so every tensor "
                    f"kept rank {self.cfg.rank}; try a smaller method.period or a longer run")
        last = solves[-1]["lgreco_solve"]
        hist = ", ".join(f"{'dense' if k == 'dense' else 'rank ' + k}: {v:.0%}" if v >= 0.005 else
                         f"{'dense' if k == 'dense' else 'rank ' + k}: <1%" for k, v in self.parameter_shares(stats).items())
        kept = sum(1 for r in solves if r["lgreco_solve"]["fallback"])
        return (f"L-GreCo (PowerSGD) solved {len(solves)} time(s) ({kept} kept uniform rank {self.cfg.rank}); last solve "
                f"predicts {last['floats_predicted']:.4g} floats per step against uniform rank {self.cfg.rank}'s "
                f"{last['floats_default']:.4g} at error {last['error_predicted']:.4g} <= budget {last['error_budget']:.4g}; "
                f"parameter-steps per rank: {hist}; {stats.fewer_than_dense(self.numel):.1f}x fewer floats than dense")

    # --- what a configuration means ---------------------------------------------------------------
    @classmethod
    def describe(cls, cfg, comp) -> dict:
        """The setting, with what a level is (`level_unit`: rank) for plots of a run still going."""
        return {**super().describe(cfg, comp), "level_unit": "rank"}

    @classmethod
    def label(cls, cfg, comp) -> str:
        return f"L-GreCo (PowerSGD, budget {cfg.budget_scale:g}x uniform rank {cfg.rank})"

    @classmethod
    def cf_text(cls, cfg, comp) -> str:
        return f"rank {min(cfg.candidates)}–{max(cfg.candidates)} per tensor"

    @classmethod
    def sort_values(cls, cfg, comp):
        return [cfg.rank]

    @classmethod
    def state_bytes(cls, cfg, comp, numel, momentum):
        return super().state_bytes(cfg, comp, numel, momentum) + 4 * numel    # + rank 0's window sum
