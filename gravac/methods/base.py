"""What every method shares: the step interface, the method registry, and the compression step.

A Method gets each local worker's flat gradient for the step, decides what to send (the same on
every worker), communicates through the Group and returns the averaged gradient plus the step's
record (CF, floats sent, wire bytes, timings). `CompressingMethod` holds the compression step,
written once: compensate (error feedback) -> compress -> aggregate -> update the residuals ->
StepResult; static, Accordion, GraVAC and MergeComp (per merged group) only choose the CF, level or
groups and add record fields.

A method plug-in is a Method subclass registered with `@METHODS.register(name, ItsCfg)`, where
ItsCfg subclasses MethodCfg with the method's options (see CONTRIBUTING.md).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from compressors import COMPRESSORS, ErrorFeedback, Payload, from_config
from gravac.core.registry import Registry
from gravac.cluster.comm import CommStats, Group
from gravac.cluster.opcosts import OpCosts
from gravac.core.schema import CompressorCfg, MethodCfg
from gravac.cluster.timeline import Piece

METHODS = Registry("method", MethodCfg, package="gravac.methods")


@dataclass
class StepContext:
    """Facts about the current step a method may decide on."""
    step: int                 # 0-based global step
    epoch: float              # epochs completed by the workers (fractional)
    lr: float
    lr_decayed: bool          # the learning rate dropped at this step
    compute_s: float          # cluster compute time of this step (slowest worker)
    samples: int              # samples (or sequences) processed by the whole cluster this step
    prev_step_s: float | None = None   # the previous step's cluster time on the run's clock, when known


@dataclass
class StepResult:
    """The averaged gradient and what the step cost."""
    grad: torch.Tensor
    cf: float                                  # CF actually sent (1 = dense)
    floats_sent: float                         # per worker (mean over all workers when they differ)
    comm: CommStats = field(default_factory=CommStats)
    compress_s: float = 0.0                    # slowest local worker's compression time, measured
    extra: dict[str, Any] = field(default_factory=dict)   # method-specific record fields
    compress_model_s: float | None = None      # the same on the run's clock (None: as measured)
    pieces: list[Piece] | None = None          # what was sent when, for the overlap timeline
                                               # (None: one piece after backward, all compression
                                               # and every message of `comm`)

    def timeline_pieces(self) -> list[Piece]:
        if self.pieces is not None:
            return self.pieces
        c = self.compress_s if self.compress_model_s is None else self.compress_model_s
        return [Piece(None, c, list(self.comm.messages))]


@dataclass
class RunStats:
    """What a finished run did, for `Method.explain`: its step records (steps.jsonl, every step of
    the run, resumed segments included) and the steps per epoch."""
    records: list[dict]
    steps_per_epoch: int

    @property
    def steps(self) -> int:
        return len(self.records)

    @property
    def epochs(self) -> float:
        return self.steps / self.steps_per_epoch if self.steps_per_epoch else 0.0

    @property
    def floats(self) -> float:
        """Floats one worker sent over the run."""
        return sum(r["floats_sent"] for r in self.records)

    def fewer_than_dense(self, numel: int) -> float:
        """How many times fewer floats the run sent than dense all-reduces of `numel` would."""
        return self.steps * numel / self.floats if self.floats else float("inf")


@dataclass
class MethodEnv:
    """What a method is built with besides its own config sections."""
    group: Group
    sizes: list[int]              # parameter tensor sizes, in the flat gradient's order
    device: torch.device
    seed: int = 0                 # the run's seed (compressor randomness derives from it)
    momentum: float = 0.0         # the optimizer's momentum (a compressor may take it over, as DGC)
    modelled_time: bool = True    # step times use modelled communication (network on), else measured
    buckets: list[list[int]] | None = None   # DDP-style buckets: parameter indices, in backward order
    costs: OpCosts | None = None  # the run's clock for compression operations (None: measured)
    shapes: list[tuple[int, ...]] | None = None   # parameter shapes, same order (None: flat, one per size)
    profile: Any = None           # the run's DeviceProfile (forward/backward/ready times), for methods that
                                  # plan on the overlap timeline (MergeComp's model search); None: unknown


def fixed_cf(comp: CompressorCfg) -> float | None:
    """The CF the configured compressor's own options fix (a quantizer's: 32 / bits per element),
    or None when compressor.cf sets it."""
    return COMPRESSORS[comp.name].target.fixed_cf(comp) if comp.name in COMPRESSORS else None


def compressor_text(comp: CompressorCfg) -> str:
    """The compressor and its CF as tables name it: "Top-k 10x", "QSGD 8-bit, bucket 512"."""
    entry = COMPRESSORS[comp.name]
    setting = entry.target.setting(comp)
    return f"{entry.label} {setting}" if setting else f"{entry.label} {comp.cf:g}x"


def step_seed(seed: int, step: int, level: int = 0, rank: int = 0) -> int:
    """Seed for a compressor's randomness at `step` (and compression `level`) of a run seeded
    `seed`: shared by all workers unless `rank` differs (the DDP hooks use it too)."""
    return (seed * 1_000_003 + step * 101 + level * 7 + rank * 7_919) % (2**62)


class Method:
    """Base class: holds the group, the parameter layout and the run seed."""
    name = "base"
    needs_compressor = False     # config refuses compressor=none when True
    compressor_keys: tuple = ()  # common compressor keys (cf, error_feedback) read without a compressor
    order = 9                    # position of the method in tables and legends
    takes_fixed_cf = False       # works with a compressor whose options fix its CF (the quantizers)

    clock = staticmethod(time.perf_counter)     # replaceable by tests that need deterministic times

    def __init__(self, cfg: MethodCfg, compressor: CompressorCfg, env: MethodEnv):
        self.cfg, self.comp_cfg, self.env = cfg, compressor, env
        self.group, self.sizes, self.device, self.seed = env.group, list(env.sizes), env.device, env.seed
        self.numel = sum(self.sizes)
        self.shapes = [tuple(s) for s in env.shapes] if env.shapes is not None else [(n,) for n in self.sizes]
        if [math.prod(s) for s in self.shapes] != self.sizes:
            raise ValueError(f"parameter shapes {self.shapes} do not match sizes {self.sizes}")

    def step(self, grads: list[torch.Tensor], ctx: StepContext) -> StepResult:
        raise NotImplementedError

    @property
    def optimizer_momentum(self) -> float:
        """The momentum the optimizer applies (0 when the method keeps it itself)."""
        return self.env.momentum

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def explain(self, stats: RunStats) -> str | None:
        """One line, printed at the end of a run and kept in summary.json, saying what an adaptive
        method did and why (from the run's records), so a run that never adapted says how to make
        it; None (the default) for methods with nothing to explain."""
        return None

    def summarize(self, stats: RunStats) -> dict | None:
        """Method-specific figures for summary.json's `method_summary` (from the run's records, as
        `explain`), e.g. L-GreCo's per-layer CF histogram; None (the default) for none."""
        return None

    def step_seed(self, step: int, level: int = 0, rank: int = 0) -> int:
        """Seed for a compressor's randomness: shared by all workers unless `rank` differs."""
        return step_seed(self.seed, step, level, rank)

    # --- timing: compression operations are measured and put on the run's clock -------------
    def timed(self, key: str, fn, keep=None):
        """fn(), adding its seconds on the run's clock (the cost table) to the current worker's
        tally; without a clock (the method used on its own) only the measured span counts. `keep`:
        what fn changes in place (an object with state_dict/load_state_dict, as the error feedback
        with DGC's momentum, or a tensor), restored after a first calibration re-runs fn."""
        costs = self.env.costs
        if costs is None:
            return fn()
        t0 = time.perf_counter()
        out = fn()
        measured = time.perf_counter() - t0
        saved = None
        if keep is not None and costs.calibrates(key):
            saved = keep.clone() if isinstance(keep, torch.Tensor) else copy.deepcopy(keep.state_dict())
        self._tally += costs.cost(key, fn, measured)
        if saved is not None:
            keep.copy_(saved) if isinstance(keep, torch.Tensor) else keep.load_state_dict(saved)
        return out

    def worker_span(self, work):
        """(work(), measured seconds, seconds on the run's clock) of one worker's compression;
        a first calibration of an operation's cost is not part of the measured time."""
        costs = self.env.costs
        self._tally = 0.0
        spent = costs.spent_s if costs is not None else 0.0
        t0 = self.clock()
        out = work()
        dt = self.clock() - t0
        if costs is None:
            return out, dt, dt
        return out, dt - (costs.spent_s - spent), self._tally

    # --- what a configuration means, without building the method ---------------------------
    @classmethod
    def label(cls, cfg: MethodCfg, comp: CompressorCfg) -> str:
        """Human-readable name of the setting, for plots and tables."""
        return cfg.name

    @classmethod
    def config_errors(cls, cfg: MethodCfg, comp: CompressorCfg) -> list[str]:
        """One line per way the method's and the compressor's settings do not fit together
        (checked with the config, before a run starts); none by default."""
        return []

    @classmethod
    def ignores(cls, cfg: MethodCfg, comp: CompressorCfg) -> list[str]:
        """Config key prefixes the method does not use (so plots ignore them)."""
        return [] if cls.needs_compressor else ["compressor."]

    @classmethod
    def cf_text(cls, cfg: MethodCfg, comp: CompressorCfg) -> str:
        """The CFs the setting uses, for tables ("10x", "10x–1000x")."""
        return "adaptive"

    @classmethod
    def sort_values(cls, cfg: MethodCfg, comp: CompressorCfg) -> list:
        """Values ordering settings of this method and compressor in tables (e.g. the CF)."""
        return []

    @classmethod
    def describe(cls, cfg: MethodCfg, comp: CompressorCfg) -> dict:
        """The run's setting as config.yaml and summary.json state it, so plots need not import the
        library: label, style family, sort order, CF text, compressor label, ignored config keys."""
        registered = comp.name in COMPRESSORS
        order = [cls.order, COMPRESSORS[comp.name].spec.order if registered else 0, comp.name]
        return {"label": cls.label(cfg, comp), "family": cfg.name, "order": order + cls.sort_values(cfg, comp),
                "cf_text": cls.cf_text(cfg, comp), "ignores": cls.ignores(cfg, comp),
                "compressor_label": COMPRESSORS[comp.name].label if registered else comp.name}

    @classmethod
    def state_bytes(cls, cfg: MethodCfg, comp: CompressorCfg, numel: int, momentum: float) -> int:
        """Per-worker memory the method will hold, so the simulated cluster can refuse to start
        before allocating it."""
        return 0


def method_class(name: str) -> type["Method"]:
    """The registered Method class for `name` (built-ins and plug-ins loaded)."""
    return METHODS.load()[name].target


def build_method(run, group: Group, sizes: list[int], device: torch.device, buckets=None,
                 costs: OpCosts | None = None, shapes: list[tuple[int, ...]] | None = None,
                 profile=None) -> Method:
    """The configured method for this group and parameter layout (run: a RunConfig); `shapes`:
    the parameters' shapes (methods that view tensors as matrices need them, PowerSGD)."""
    cls = method_class(run.method.name)
    net = run.network
    env = MethodEnv(group, sizes, device, run.train.seed, run.train.momentum,
                    modelled_time=net.enabled and net.time_source != "wall", buckets=buckets, costs=costs,
                    shapes=shapes, profile=profile)
    return cls(run.method, run.compressor, env)


@dataclass
class Compressed:
    """Every local worker's error-compensated gradient and its payload, and the slowest worker's
    compression time, measured and on the run's clock."""
    comps: list[torch.Tensor]
    payloads: list[Payload]
    seconds: float
    model_s: float


class CompressingMethod(Method):
    """A method that compresses with one compressor and error feedback per worker per level."""

    needs_compressor = True
    levels = 1

    def __init__(self, cfg, compressor, env):
        super().__init__(cfg, compressor, env)
        self.compressor_cls = COMPRESSORS[compressor.name].target
        self.compressor = from_config(compressor, self.sizes)
        self.memory_momentum = self.memory_momentum_of(compressor, env.momentum)
        self.memories = [[ErrorFeedback(self.numel, device=self.device, enabled=compressor.error_feedback,
                                        momentum=self.memory_momentum) for _ in self.group.local_ranks]
                         for _ in range(self.levels)]

    @staticmethod
    def memory_momentum_of(comp: CompressorCfg, momentum: float) -> float:
        """Momentum the error-feedback memory takes over from the optimizer (DGC), else 0."""
        if not comp.error_feedback:
            return 0.0
        return COMPRESSORS[comp.name].target.memory_momentum(comp, momentum)

    @property
    def optimizer_momentum(self) -> float:
        return 0.0 if self.memory_momentum > 0 else self.env.momentum

    @classmethod
    def ignores(cls, cfg, comp):
        return ["compressor.cf"]                # adaptive methods choose their own CFs

    @classmethod
    def state_bytes(cls, cfg, comp, numel, momentum):
        residual = (3 if cls.memory_momentum_of(comp, momentum) > 0 else 1) if comp.error_feedback else 0
        return 4 * numel * (cls.levels * residual + 1)   # residuals (+ DGC's u, v) + the compensated gradient

    def seed_for(self, step: int, level: int, rank: int) -> int:
        """One seed per step for all workers, unless the compressor draws per worker."""
        return self.step_seed(step, level, rank + 1 if self.compressor.per_rank_seed else 0)

    # --- timing: every compression operation is measured and put on the run's clock ----------
    def op_key(self, op: str, **params) -> str:
        """Names an operation for the clock's cost table: what it is, on which compressor and
        layout, at which CF; identical on every worker and in every identical run."""
        if not hasattr(self, "_op_id"):
            import hashlib
            text = f"{self.comp_cfg!r}|{self.sizes}|{self.memory_momentum}"
            self._op_id = hashlib.sha256(text.encode()).hexdigest()[:12]
        args = ",".join(f"{k}={_text(v)}" for k, v in sorted(params.items()))
        return f"{self.comp_cfg.name}:{self._op_id}:{op}({args})"

    def compress_one(self, w: int, g: torch.Tensor, cf, step: int, level: int = 0) -> tuple[torch.Tensor, Payload]:
        """Local worker `w`: its gradient plus residual, and that compressed at `cf` (timed)."""
        mem = self.memories[level][w]
        comp = self.timed(self.op_key("compensate"), lambda: mem.compensate(g), keep=mem)
        seed = self.seed_for(step, level, self.group.local_ranks[w])
        try:
            return comp, self.timed(self.op_key("compress", cf=cf), lambda: self.encode(comp, cf, seed))
        except ValueError as e:
            raise_diverged(e, step, self.name)

    def encode(self, x: torch.Tensor, cf, seed: int) -> Payload:
        """x compressed at `cf`; a method whose levels are not CFs (L-GreCo's code widths) says
        here what its level means to the compressor."""
        return self.compressor.compress(x, cf, seed=seed)

    def compress_all(self, grads: list[torch.Tensor], cf, step: int, level: int = 0) -> Compressed:
        """compress_one for every local worker; the slowest worker's times count."""
        comps, payloads, slowest, slowest_model = [], [], 0.0, 0.0
        for w, g in enumerate(grads):
            (comp, p), dt, model = self.worker_span(lambda: self.compress_one(w, g, cf, step, level))
            slowest, slowest_model = max(slowest, dt), max(slowest_model, model)
            comps.append(comp)
            payloads.append(p)
        return Compressed(comps, payloads, slowest, slowest_model)

    def finish(self, c: Compressed, sent: list[Payload] | None = None, comm: CommStats | None = None,
               extra: dict | None = None, level: int = 0) -> StepResult:
        """Aggregate what every worker sends (`sent`, default c.payloads), update each worker's
        residual (compensated − sent), and state the step's cost; `comm` holds collectives the
        method already ran this step."""
        comps, compress_s, compress_model_s = c.comps, c.seconds, c.model_s
        sent = c.payloads if sent is None else sent
        avg, agg = self.group.aggregate(sent)
        comm = agg if comm is None else comm + agg
        extra = dict(extra or {})
        for mem, c, p in zip(self.memories[level], comps, sent):
            mem.update(c, p)
        return StepResult(grad=avg, cf=self.numel / comm.floats, floats_sent=comm.floats, comm=comm,
                          compress_s=compress_s, compress_model_s=compress_model_s, extra=extra)

    def state_dict(self) -> dict:
        return {"memories": [[m.state_dict() for m in lvl] for lvl in self.memories]}

    def load_state_dict(self, state: dict) -> None:
        for lvl, saved in zip(self.memories, state["memories"]):
            for m, s in zip(lvl, saved):
                m.load_state_dict(s)


def _text(v) -> str:
    """A CF or CF list as text for an operation's key (a list becomes a short digest)."""
    if isinstance(v, (list, tuple)):
        import hashlib
        return "list-" + hashlib.sha256(repr([float(x) for x in v]).encode()).hexdigest()[:10]
    return f"{float(v):.6g}" if isinstance(v, (int, float)) else str(v)


def raise_diverged(err: Exception, step: int, method: str):
    """Turn a compressor's NaN/Inf complaint into the run's one-line divergence error."""
    from compressors.half import CastOverflow
    from gravac.core.errors import DivergedError
    if isinstance(err, CastOverflow):
        raise DivergedError(f"step {step}: {err} (method={method})") from None
    if "nan" in str(err).lower() or "inf" in str(err).lower():
        raise DivergedError(f"step {step}: gradient contains NaN/Inf (method={method}); "
                            "lower train.lr or enable train.grad_clip") from None
    raise err
