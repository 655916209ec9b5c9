"""Should I compress on my cluster? Predicted iteration times, speedups and break-even bandwidths.

    python bench/utility.py experiment=mini_vgg workers=8,32,128 bandwidths=1,10,25,100,400

Following Agarwal et al. (MLSys'22, "On the Utility of Gradient Compression in Distributed
Training Systems"), with no training: every method's step is run ONCE on one synthetic gradient
through the suite's own code (the method, the communication layer recording each message's
collective and bytes, the device profile and the compression cost table of gravac/cluster/clock.py),
then priced at every (workers N, bandwidth) on the suite's overlap timeline
(gravac/cluster/timeline.py) with its alpha-beta network model (gravac/cluster/netmodel.py). Dense
fp32 and the 16-bit casts all-reduce DDP's buckets as backward produces them (overlap); methods
that compress the whole gradient after backward (Top-k, DGC, Random-k, the quantizers, PowerSGD)
send after it, as the suite's methods do. Speedups are against dense fp32 with overlap and against
dense fp16 (method=static compressor=fp16: torch's fp16 hook, the same buckets at 2 bytes a value
plus the cast, gravac/methods/static.py); the break-even
bandwidth is where a method's iteration time equals the reference's (the highest such crossing in
[1 Mbit/s, 10 Tbit/s], found on a log grid and refined by bisection): below it the method pays.

Keys (besides any bench/run.py override such as experiment=, model=, dataset=, train.batch_size=):
workers (comma list, >= 2), bandwidths (comma list, Gbit/s), methods (comma list: dense, fp16,
bf16, <sparsifier>:<CF>, powersgd:<rank>, <quantizer>), compute_s (stated forward+backward seconds
per step, for a device not profiled here), cost_scale (multiplies every compression cost),
latency_us (default: the network config's), out (folder of the CSVs and the figure). The messages
are priced by `network.collectives` as in bench/run.py: ideal (the default) or a fitted profile
(gloo-cpu, or a profile file; gravac/cluster/netmodel.py).

    python bench/utility.py --validate experiment=mini_vgg out=results/reference/utility   # root, ~3 min

runs each (method, N, bandwidth) cell for real instead (default: dense and Top-k 100x, N = 2, 4,
0.1 and 1 Gbit/s): cluster=ddp steps in network namespaces over tc-tbf links (bench/netval.py's
harness), each beside utility's prediction under network.collectives=ideal and gloo-cpu, in
validation.csv (validation_row says what is compared with what).
"""
from __future__ import annotations

import csv
import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compressors import COUNT_BYTES  # noqa: E402
from gravac.cluster.netmodel import CollectiveProfile, NetworkModel, load_profile  # noqa: E402
from gravac.cluster.timeline import Piece, schedule  # noqa: E402

OWN_KEYS = ("workers", "bandwidths", "methods", "compute_s", "cost_scale", "latency_us", "out")
DEFAULTS = {"workers": "8,32,128", "bandwidths": "1,10,25,100,400", "compute_s": "0", "cost_scale": "1"}
BISECT_GBPS = (1e-3, 1e4)           # the bandwidth range a break-even is searched in
REFERENCES = ("dense", "fp16")      # the baselines every method is compared with
TIE = 0.005                         # a speedup within 0.5% of 1 is a tie in the paragraph (cost noise)
REPEATS = 15                        # timings per compression cost measured here (clock.repeats), median


class InputError(ValueError):
    """A bad key, list or unit: printed as one line."""


class Msg(float):
    """A message's modelled seconds on the recording network, plus what re-pricing needs."""

    def __new__(cls, seconds: float, kind: str, nbytes: float):
        m = float.__new__(cls, seconds)
        m.kind, m.nbytes = kind, float(nbytes)
        return m


class Tape(NetworkModel):
    """The suite's network model, its answers tagged with the collective and the bytes (a sparse
    all-gather's two messages as its own kind, so a collective profile can price them as one)."""

    def allreduce(self, nbytes, workers):
        return Msg(super().allreduce(nbytes, workers), "allreduce", nbytes)

    def allgather(self, nbytes_per_worker, workers):
        return Msg(super().allgather(nbytes_per_worker, workers), "allgather", nbytes_per_worker)

    def sparse_allgather(self, nbytes_per_worker, workers):
        counts, values = super().sparse_allgather(nbytes_per_worker, workers)
        return [Msg(counts, "sparse_counts", nbytes_per_worker), Msg(values, "sparse_values", nbytes_per_worker)]

    def broadcast(self, nbytes, workers):
        return Msg(super().broadcast(nbytes, workers), "broadcast", nbytes)


def wire_of(m: Msg) -> float:
    """The bytes one worker contributes to message `m` (a sparse all-gather's counts: COUNT_BYTES)."""
    return float(COUNT_BYTES) if m.kind == "sparse_counts" else m.nbytes


def price(m: Msg, net: NetworkModel, workers: int) -> float:
    """Message `m`'s seconds on network `net` with `workers` workers."""
    if m.kind in ("sparse_counts", "sparse_values"):
        return net.sparse_allgather(m.nbytes, workers)[m.kind == "sparse_values"]
    return getattr(net, m.kind)(m.nbytes, workers)


@dataclass
class Plan:
    """One method's step, to be priced at any N and bandwidth: its timeline pieces (messages are Msg)."""
    name: str
    label: str
    pieces: list[Piece]
    cast: bool = False          # a 16-bit cast (a baseline's variant, not a compressor)

    @property
    def wire_bytes(self) -> float:
        return sum(wire_of(m) for p in self.pieces for m in p.messages)

    @property
    def compress_s(self) -> float:
        return sum(p.compress_s for p in self.pieces)

    @property
    def collectives(self) -> str:
        kinds = {"sparse_counts": "sparse_allgather", "sparse_values": "sparse_allgather"}
        return "+".join(sorted({kinds.get(m.kind, m.kind) for p in self.pieces for m in p.messages}))


# --- pricing (the suite's timeline and network model) --------------------------------------------
def comm_s(plan: Plan, workers: int, gbps: float, alpha_s: float, collectives: CollectiveProfile | None = None,
           burst_bytes: float = 0.0, shared_cores: int = 0) -> float:
    """The plan's messages one after another (no overlap): its communication seconds with N workers
    on a `gbps` Gbit/s network priced by `collectives` (None: ideal; `burst_bytes`: a shaped link's;
    `shared_cores`: the cores the workers share on one machine, 0 for a cluster)."""
    net = NetworkModel(alpha_s=alpha_s, beta_Bps=gbps * 1e9 / 8, profile=collectives, burst_bytes=burst_bytes,
                       shared_cores=shared_cores)
    return sum(price(m, net, workers) for p in plan.pieces for m in p.messages)


def iteration_s(plan: Plan, profile, workers: int, gbps: float, alpha_s: float,
                collectives: CollectiveProfile | None = None) -> float:
    """The plan's step on the overlap timeline with N workers on a `gbps` Gbit/s network whose
    collectives cost as `collectives` says (None: the ideal alpha-beta ring)."""
    net = NetworkModel(alpha_s=alpha_s, beta_Bps=gbps * 1e9 / 8, profile=collectives)
    pieces = [Piece(p.params, p.compress_s, [price(m, net, workers) for m in p.messages]) for p in plan.pieces]
    return schedule(profile.forward_s, profile.backward_s, profile.ready_s, profile.optimizer_s, pieces).step_s


def _grid_wins(plan: Plan, ref: Plan, profile, workers: int, alpha_s: float, lo: float, hi: float,
               per_decade: int, collectives: CollectiveProfile | None = None):
    """gain(g) = ref's time - plan's, the log grid over [lo, hi] and where the plan is faster on it."""
    def gain(g: float) -> float:
        return (iteration_s(ref, profile, workers, g, alpha_s, collectives)
                - iteration_s(plan, profile, workers, g, alpha_s, collectives))
    steps = max(1, math.ceil(per_decade * math.log10(hi / lo)))
    grid = [math.log(lo) + (math.log(hi) - math.log(lo)) * i / steps for i in range(steps + 1)]
    return gain, grid, [gain(math.exp(x)) > 0 for x in grid]


def _bisect(gain, a: float, b: float, faster_below: bool, iters: int = 60) -> float:
    """The crossing of gain between log bandwidths a < b (faster on the `faster_below` side of it)."""
    for _ in range(iters):
        mid = (a + b) / 2
        a, b = (mid, b) if (gain(math.exp(mid)) > 0) == faster_below else (a, mid)
    return math.exp((a + b) / 2)


def break_even(plan: Plan, ref: Plan, profile, workers: int, alpha_s: float, lo: float = BISECT_GBPS[0],
               hi: float = BISECT_GBPS[1], per_decade: int = 8, collectives: CollectiveProfile | None = None) -> float:
    """The bandwidth (Gbit/s) below which `plan` is faster than `ref`: the highest crossing from
    faster (below) to slower (above) on a log grid (`per_decade` points a decade), refined by
    bisection in log bandwidth; inf when faster over the whole range, 0 when no such crossing.
    (Near a tie in bytes the gain can change sign more than once; a method that wins only at the
    top, where per-message latency dominates, has no "pays below" and shows in `pays_above`.)"""
    gain, grid, wins = _grid_wins(plan, ref, profile, workers, alpha_s, lo, hi, per_decade, collectives)
    if all(wins):
        return math.inf
    drops = [i for i in range(len(wins) - 1) if wins[i] and not wins[i + 1]]
    return _bisect(gain, grid[drops[-1]], grid[drops[-1] + 1], True) if drops else 0.0


def pays_above(plan: Plan, ref: Plan, profile, workers: int, alpha_s: float, lo: float = BISECT_GBPS[0],
               hi: float = BISECT_GBPS[1], per_decade: int = 8, collectives: CollectiveProfile | None = None) -> float:
    """The bandwidth (Gbit/s) above which `plan` stays faster up to `hi` (fewer messages than DDP's
    buckets when latency dominates); inf when it is slower at `hi`, 0 when faster everywhere."""
    gain, grid, wins = _grid_wins(plan, ref, profile, workers, alpha_s, lo, hi, per_decade, collectives)
    if not wins[-1]:
        return math.inf
    if all(wins):
        return 0.0
    i = max(i for i, w in enumerate(wins) if not w)
    return _bisect(gain, grid[i], grid[i + 1], False)


# --- the command line ----------------------------------------------------------------------------
def numbers(key: str, text: str, kind, low: float, above: bool = False) -> list:
    """A comma list of numbers >= low (> low with `above`), or one InputError line."""
    bound = f"{'>' if above else '>='} {low:g}" + (" in Gbit/s (1,10,25), without units" if key == "bandwidths" else "")
    try:
        vals = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{key}={text}: expected a comma list of {kind.__name__}s {bound}") from None
    if not vals or any(not math.isfinite(v) or v < low or (above and v == low) for v in vals):
        raise InputError(f"{key}={text}: every value must be a finite number {bound}")
    return sorted(set(vals))


def number(key: str, text: str) -> float:
    """One finite number >= 0, or one InputError line."""
    vals = numbers(key, text, float, 0)
    if len(vals) != 1 or "," in text:
        raise InputError(f"{key}={text}: expected one number >= 0")
    return vals[0]


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    """The script's own keys (checked) and the overrides passed on to the run config."""
    own, rest = dict(DEFAULTS), []
    for a in argv:
        key, eq, value = a.partition("=")
        if not eq:
            raise InputError(f"{a}: arguments are key=value (keys: {', '.join(OWN_KEYS)}, "
                             "or any bench/run.py override)")
        if key in OWN_KEYS:
            own[key] = value
        else:
            rest.append(a)
    out = {"workers": numbers("workers", own["workers"], int, 2),
           "bandwidths": numbers("bandwidths", own["bandwidths"], float, 0, above=True),
           "compute_s": number("compute_s", own["compute_s"]), "cost_scale": number("cost_scale", own["cost_scale"]),
           "latency_us": number("latency_us", own["latency_us"]) if "latency_us" in own else None,
           "methods": method_specs(own.get("methods")), "out": own.get("out")}
    return out, rest


def method_specs(text: str | None) -> list[tuple[str, dict, dict]]:
    """(name, method section, compressor section) per method; names and forms from the registries."""
    from compressors import COMPRESSORS
    casts = [n for n in COMPRESSORS.names() if hasattr(COMPRESSORS[n].target, "wire_dtype")]
    fixed = [n for n in COMPRESSORS.names() if n not in casts
             and COMPRESSORS[n].target.fixed_cf(COMPRESSORS[n].config(name=n)) is not None]
    sparse = [n for n in COMPRESSORS.names() if n not in casts and n not in fixed]
    if text is None:
        text = ",".join(["dense", *casts, *(f"{s}:{cf}" for s in sparse if s != "redsync" for cf in (10, 100, 1000)),
                         "powersgd:1", "powersgd:2", "powersgd:4", *fixed])
    specs = []
    for item in [x.strip() for x in text.split(",") if x.strip()]:
        name, _, arg = item.partition(":")
        try:
            if name == "dense" and not arg:
                specs.append((item, {"name": "dense"}, {"name": "none"}))
            elif name in casts + fixed and not arg:
                specs.append((item, {"name": "static"}, {"name": name}))
            elif name in sparse and float(arg) >= 1:
                specs.append((item, {"name": "static"}, {"name": name, "cf": float(arg)}))
            elif name == "powersgd" and int(arg) >= 1:
                specs.append((item, {"name": "powersgd", "rank": int(arg)}, {"name": "none"}))
            else:
                raise ValueError
        except ValueError:
            raise InputError(f"methods: {item!r} is not one of: dense, {', '.join(casts + fixed)}, "
                             f"<{'|'.join(sparse)}>:<CF >= 1>, powersgd:<rank >= 1>") from None
    for ref in REFERENCES:        # the baselines are always priced
        if ref not in [s[0] for s in specs]:
            specs.insert(0, (ref, {"name": "dense"}, {"name": "none"}) if ref == "dense" else
                         (ref, {"name": "static"}, {"name": ref}))
    return specs


# --- recording every method's step ---------------------------------------------------------------
def record(overrides: list[str], specs, compute_s: float, cost_scale: float, say=print):
    """(plans by name, profile, run config, ops measured on this host): each method's step run once
    on one worker of a recorded 2-worker cluster, on the run's clock."""
    import torch
    from hydra import compose, initialize_config_dir
    from compressors import COMPRESSORS
    from gravac.cluster.clock import Clock
    from gravac.cluster.comm import SimGroup
    from gravac.config.cli import check_overrides
    from gravac.config.compose import build_config, register_base
    from gravac.data import load_dataset
    from gravac.loop.workers import Workers
    from gravac.methods import StepContext, build_method
    from gravac.methods.base import method_class
    from gravac.models import build_model

    torch.set_num_threads(1)        # as the study device was measured (clock.machine=auto needs it)
    check_overrides(overrides, str(ROOT / "conf"))     # bench/run.py's one-line errors for its keys
    register_base()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        repeats = [] if any(o.startswith("clock.repeats=") for o in overrides) else [f"clock.repeats={REPEATS}"]
        # the step runs on this host's CPU (below), so its profile is a CPU one even under a preset
        # that names cuda (the paper presets): otherwise the profile would be filed as a GPU's
        base = build_config(compose(config_name="config",
                                    overrides=overrides + repeats + ["cluster.workers=2", "cluster.device=cpu"]))
    if compute_s > 0:
        base.clock.compute_s = compute_s

    class OneOfTwo(SimGroup):       # worker 0 of 2: the collectives' sizes, one worker's compute
        def __init__(self):
            super().__init__(2, Tape(alpha_s=base.network.latency_us * 1e-6, beta_Bps=1e9))
            self.local_ranks = [0]

    group = OneOfTwo()
    dataset = load_dataset(base.dataset)
    model = build_model(base.model, dataset.num_classes, dataset.task, getattr(dataset, "image_size", None))
    workers = Workers(base.train, base.cluster, model, dataset, group, torch.device("cpu"))
    workers.check_memory(0)
    clock = Clock.build(base, workers, group, say)
    grad = torch.randn(workers.numel, generator=torch.Generator().manual_seed(0)) * 1e-2
    plans = {}
    for name, msec, csec in specs:
        run = build_config({**dataclasses.asdict(base), "method": msec, "compressor": csec})
        m = build_method(run, group, workers.sizes, torch.device("cpu"), buckets=clock.buckets, costs=clock.costs,
                         shapes=workers.shapes, profile=clock.profile)
        for step in (0, 1):         # the second step: past first-step set-up (PowerSGD's Q)
            res = m.step([grad.clone()], StepContext(step=step, epoch=1e3, lr=0.1, lr_decayed=False,
                                                     compute_s=clock.profile.compute_s, samples=2))
        pieces = [Piece(p.params, p.compress_s * cost_scale, list(p.messages)) for p in res.timeline_pieces()]
        if any(not isinstance(x, Msg) for p in pieces for x in p.messages):
            raise InputError(f"method {name}: its messages were not priced by the network model; "
                             "cannot re-price them")
        label = method_class(run.method.name).label(run.method, run.compressor)
        cast = csec["name"] in COMPRESSORS and hasattr(COMPRESSORS[csec["name"]].target, "wire_dtype")
        plans[name] = Plan(name, label, pieces, cast=cast)
    return plans, clock.profile, base, list(clock.costs.measured)


# --- outputs -------------------------------------------------------------------------------------
def table(plans: dict, profile, workers: list[int], bandwidths: list[float], alpha_s: float,
          collectives: CollectiveProfile | None = None) -> tuple[list, list]:
    """Rows per (method, N, bandwidth) and break-even rows per (method, N), the messages priced by
    `collectives` (None: ideal)."""
    rows, even = [], []
    for n in workers:
        for g in bandwidths:
            ref = {r: iteration_s(plans[r], profile, n, g, alpha_s, collectives) for r in REFERENCES}
            for p in plans.values():
                t = iteration_s(p, profile, n, g, alpha_s, collectives)
                rows.append({"method": p.name, "label": p.label, "cast": p.cast, "workers": n, "bandwidth_gbps": g,
                             "iteration_s": t, "speedup_vs_fp32": ref["dense"] / t, "speedup_vs_fp16": ref["fp16"] / t,
                             "compress_s": p.compress_s, "wire_bytes": p.wire_bytes, "collectives": p.collectives,
                             "pieces": len(p.pieces)})
        for p in plans.values():
            if p.name not in REFERENCES:
                row = {"method": p.name, "label": p.label, "cast": p.cast, "workers": n}
                for r in REFERENCES:
                    vs = "fp32" if r == "dense" else r
                    args = (p, plans[r], profile, n, alpha_s)
                    row[f"pays_below_gbps_vs_{vs}"] = break_even(*args, collectives=collectives)
                    row[f"pays_above_gbps_vs_{vs}"] = pays_above(*args, collectives=collectives)
                even.append(row)
    return rows, even


def paragraph(rows: list, even: list, workers: list[int], bandwidths: list[float]) -> str:
    """One paragraph: what beats fp16 DDP at a middle cell, and each compressing method's break-even
    there (the other 16-bit casts are fp16's own variants: their tie is measurement noise)."""
    n = 32 if 32 in workers else workers[len(workers) // 2]
    g = 25.0 if 25.0 in bandwidths else bandwidths[len(bandwidths) // 2]
    cell = [r for r in rows if r["workers"] == n and r["bandwidth_gbps"] == g and r["method"] not in REFERENCES
            and not r["cast"]]
    win = sorted((r for r in cell if r["speedup_vs_fp16"] > 1 + TIE), key=lambda r: -r["speedup_vs_fp16"])
    head = (f"At N={n} on {g:g} Gbit/s " + (f"nothing beats fp16 DDP by more than {TIE:.1%}" if not win else
            "fp16 DDP is beaten by " + ", ".join(f"{r['label']} ({r['speedup_vs_fp16']:.3f}x)" for r in win)))
    pays, never, above = [], [], []
    for e in (e for e in even if e["workers"] == n and not e["cast"]):
        b, top = e["pays_below_gbps_vs_fp16"], e["pays_above_gbps_vs_fp16"]
        if b > 0:
            pays.append((b, e["label"]))
        elif top < math.inf:
            above.append(f"{e['label']} (above {top:.3g} Gbit/s, where fewer messages beat the buckets' latency)")
        else:
            never.append(e["label"])
    parts = [f"{lab} pays below {'any bandwidth up to 10 Tbit/s' if math.isinf(b) else f'{b:.3g} Gbit/s'}"
             for b, lab in sorted(pays, reverse=True)]
    tail = (f"; only at the top: {', '.join(above)}" if above else "") + \
        (f"; never: {', '.join(never)}" if never else "")
    return f"{head}; against fp16 DDP at N={n}: " + ("; ".join(parts) or "no method pays at any bandwidth") + tail + "."


def heatmaps(rows: list, even: list, workers: list[int], bandwidths: list[float], path: Path) -> None:
    """One panel per method: speedup vs fp16 over workers x bandwidth, with the break-even bandwidth
    per N (vs fp16) drawn as a line (the contour where the speedup is 1)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    names = list(dict.fromkeys(r["method"] for r in rows if r["method"] not in REFERENCES))
    cols = min(4, len(names))
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.4 * cols, 2.6 * nrows), squeeze=False)
    norm = LogNorm(vmin=0.1, vmax=10)
    for ax, name in zip(axes.flat, names):
        grid = [[next(r["speedup_vs_fp16"] for r in rows if r["method"] == name and r["workers"] == n
                      and r["bandwidth_gbps"] == g) for g in bandwidths] for n in workers]
        ax.imshow(grid, cmap="RdBu", norm=norm, aspect="auto", origin="lower")
        for i, line in enumerate(grid):
            for j, v in enumerate(line):
                ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=7)
        be = [next(e["pays_below_gbps_vs_fp16"] for e in even if e["method"] == name and e["workers"] == n)
              for n in workers]
        xs = [_index(b, bandwidths) for b in be]
        ax.plot(xs, range(len(workers)), "k--", lw=1.2)
        ax.set_title(next(r["label"] for r in rows if r["method"] == name), fontsize=8)
        ax.set_xticks(range(len(bandwidths)), [f"{g:g}" for g in bandwidths], fontsize=7)
        ax.set_yticks(range(len(workers)), [str(n) for n in workers], fontsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.supxlabel("bandwidth (Gbit/s); dashed: break-even vs fp16 (pays left of it)", fontsize=9)
    fig.supylabel("workers N", fontsize=9)
    fig.suptitle("speedup over fp16 DDP (blue > 1: compression pays)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _index(gbps: float, bandwidths: list[float]) -> float:
    """A bandwidth's position on the heat map's axis (log-interpolated between columns, clipped)."""
    if gbps <= 0:
        return -0.5
    logs = [math.log(b) for b in bandwidths]
    x = math.log(gbps) if math.isfinite(gbps) else logs[-1] + 1
    if x <= logs[0] or len(logs) == 1:
        return -0.5 if x < logs[0] else 0.0
    for j in range(len(logs) - 1):
        if x <= logs[j + 1]:
            return j + (x - logs[j]) / (logs[j + 1] - logs[j])
    return len(logs) - 0.5


def _cell(e: dict, vs: str) -> str:
    """A break-even table cell: the bandwidth below which the method pays, + when it also pays at the top."""
    b, top = e[f"pays_below_gbps_vs_{vs}"], e[f"pays_above_gbps_vs_{vs}"]
    text = "never" if b == 0 else "always" if math.isinf(b) else f"{b:.3g}"
    return text + ("+" if 0 < top < math.inf else "")


def write_csv(path: Path, rows: list) -> None:
    """Rows as CSV: whole numbers (bytes) exact, other floats to 6 significant digits."""
    def cell(v):
        if not isinstance(v, float):
            return v
        return int(v) if v.is_integer() and abs(v) < 1e15 else f"{v:.6g}"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({k: cell(v) for k, v in r.items()} for r in rows)


def model_text(collectives: CollectiveProfile | None) -> str:
    """Which collective model priced the messages, for the printed assumptions."""
    if collectives is None:
        return "network.collectives=ideal (the alpha-beta ring: 2(N-1)a + 2(N-1)/N B/b per all-reduce)"
    return (f"network.collectives={collectives.source} (the fitted profile '{collectives.name}': "
            f"{collectives.note or 'no note'})")


def report(args: dict, plans: dict, profile, here: list[str], alpha: float, rows: list, even: list,
           collectives: CollectiveProfile | None = None) -> None:
    """Print the assumptions (loudly), the break-even table and the paragraph."""
    print("ASSUMPTIONS (the numbers below rest on them):")
    src = "STATED (compute_s=)" if profile.source == "given" else \
        f"profiled ({profile.source}, device '{profile.machine[:60]}')"
    print(f"  compute per step: forward {profile.forward_s * 1e3:.2f} ms + backward {profile.backward_s * 1e3:.2f} ms, "
          f"optimizer {profile.optimizer_s * 1e3:.2f} ms: {src}")
    which = f": of {', '.join(dict.fromkeys(k.split(':')[0] for k in here))}" if here else ""
    print(f"  compression costs x {args['cost_scale']:g}" + (" (STATED scale)" if args["cost_scale"] != 1 else "")
          + f"; {len(here)} operation(s) the device lacked were MEASURED ON THIS HOST on a random normal gradient "
          f"(under this host's load){which}")
    print(f"  network: latency {alpha * 1e6:g} us per message; collectives priced by {model_text(collectives)}; "
          "every worker sends what worker 0 does (DGC/RedSync counts vary in practice); decoding/aggregation "
          "not timed; a cast's cost shared by the buckets pro rata")
    print(f"  break-even: the highest faster-below/slower-above crossing in [{BISECT_GBPS[0]:g}, {BISECT_GBPS[1]:g}] "
          "Gbit/s (8 points a decade, then bisection)")
    print(f"\n{'method':42s} " + " ".join(f"{'N=' + str(n):>18s}" for n in args["workers"]))
    print(f"{'(pays below, Gbit/s: vs fp32 | vs fp16)':42s}")
    for name in dict.fromkeys(e["method"] for e in even):
        cells = [next(e for e in even if e["method"] == name and e["workers"] == n) for n in args["workers"]]
        print(f"{cells[0]['label'][:42]:42s} " + " ".join(
            f"{_cell(c, 'fp32') + ' | ' + _cell(c, 'fp16'):>18s}" for c in cells))
    print("(never: slower at every bandwidth below; +: also faster above the bandwidth in pays_above_gbps_* "
          "of break_even.csv, where per-message latency dominates DDP's bucketed all-reduces)")
    print("\n" + paragraph(rows, even, args["workers"], args["bandwidths"]))


# --- --validate: the predictions against real steps over shaped links ----------------------------
VALIDATE = {"workers": "2,4", "bandwidths": "0.1,1", "methods": "dense,topk:100"}   # --validate's defaults
VALIDATE_MODELS = ("ideal", "gloo-cpu")   # the collective models every measured cell is predicted by
VALIDATE_STEPS = 25                       # steps per real run; the first SKIP are dropped
SKIP = 3                                  # warm-up and calibration steps (as bench/netval.py's step rows)


def run_overrides(msec: dict, csec: dict) -> list[str]:
    """bench/run.py overrides that run the method a spec names (its method and compressor sections)."""
    return ([f"method={msec['name']}", *(f"method.{k}={v}" for k, v in msec.items() if k != "name"),
             f"compressor={csec['name']}", *(f"compressor.{k}={v}" for k, v in csec.items() if k != "name")])


def validation_row(plan: Plan, records: list[dict], workers: int, gbps: float, alpha_s: float, models: dict,
                   burst_bytes: float, study=None, shared_cores: int = 0) -> dict:
    """One measured cell against the predictions. The real loop does not overlap and computes on
    this host, so each model's prediction is the run's own measured compute + compression +
    optimizer (medians) plus the plan's recorded messages priced one after another; the ratio of
    the communication alone is the network model's own error. A profile gets the shaped link's
    tbf bucket (`burst_bytes`, as it was fitted) and the cores the workers shared here
    (`shared_cores`); ideal gets neither. `study`: the study device's profile, whose overlapped
    utility prediction is added for contrast (not a like-for-like one)."""
    import statistics
    med = lambda key: statistics.median(r[key] for r in records)  # noqa: E731
    host = statistics.median(r["compute_s"] + r["compress_s"] + r["optimizer_s"] for r in records)
    row = {"method": plan.name, "label": plan.label, "workers": workers, "rate_mbit": gbps * 1e3,
           "steps": len(records), "measured_step_s": med("step_wall_s"), "measured_comm_s": med("comm_s"),
           "host_compute_s": med("compute_s"), "host_compress_s": med("compress_s"),
           "host_optimizer_s": med("optimizer_s"), "measured_wire_bytes": med("wire_bytes"),
           "recorded_wire_bytes": plan.wire_bytes}
    for name, prof in models.items():
        comm = comm_s(plan, workers, gbps, alpha_s, prof, burst_bytes, shared_cores)   # ideal ignores both
        row[f"predicted_comm_{name}_s"] = comm
        row[f"predicted_step_{name}_s"] = host + comm
        row[f"ratio_step_{name}"] = row["measured_step_s"] / (host + comm)
        row[f"ratio_comm_{name}"] = row["measured_comm_s"] / comm
        if study is not None:
            row[f"utility_study_device_{name}_s"] = iteration_s(plan, study, workers, gbps, alpha_s, prof)
    return row


def validate(args: dict, overrides: list[str], out: Path) -> int:
    """Run every (method, N, bandwidth) cell for real (cluster=ddp steps in network namespaces over
    tbf links, bench/netval.py's harness) and write its measurement beside utility's predictions
    under each of VALIDATE_MODELS to `out`/validation.csv."""
    sys.path.insert(0, str(ROOT / "bench"))
    from netns import burst_bytes, missing
    from netval import HOST_CORES, step_records
    why = missing()
    if why:
        print(f"utility --validate: skipped: {why}")
        return 0
    plans, profile, base, _ = record(overrides, args["methods"], args["compute_s"], args["cost_scale"])
    alpha = (args["latency_us"] if args["latency_us"] is not None else base.network.latency_us) * 1e-6
    models = {m: load_profile(m) for m in VALIDATE_MODELS}
    asked = [s for s in args["methods"] if s[0] in args["asked"]]
    rows = []
    for name, msec, csec in asked:
        for n in args["workers"]:
            for g in args["bandwidths"]:
                recs = step_records(n, g * 1e3, 0.0, [*overrides, *run_overrides(msec, csec)], "ideal",
                                    VALIDATE_STEPS, timeout_s=900.0, skip=SKIP, latency_us=alpha * 1e6)
                rows.append(validation_row(plans[name], recs, n, g, alpha, models, burst_bytes(g * 1e3), profile,
                                           HOST_CORES))
                r = rows[-1]
                print(f"{name} N={n} {g * 1e3:g} Mbit/s: measured {r['measured_step_s']:.4f} s (comm "
                      f"{r['measured_comm_s']:.4f}); predicted " + ", ".join(
                          f"{m} {r[f'predicted_step_{m}_s']:.4f} (x{r[f'ratio_step_{m}']:.3f}; comm "
                          f"{r[f'predicted_comm_{m}_s']:.4f}, x{r[f'ratio_comm_{m}']:.3f})" for m in models),
                      flush=True)
                out.mkdir(parents=True, exist_ok=True)
                write_csv(out / "validation.csv", rows)     # after every cell: an interrupted run keeps them
    print(f"wrote {out / 'validation.csv'} ({len(rows)} cells)")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    checking = "--validate" in argv
    if checking:
        argv = [a for a in argv if a != "--validate"]
        argv = [f"{k}={v}" for k, v in VALIDATE.items() if not any(a.startswith(k + "=") for a in argv)] + argv
    from hydra.errors import HydraException
    from gravac.core.check import ConfigError
    from gravac.core.errors import UserError
    from gravac.core.registry import PluginError
    try:
        args, overrides = parse(argv)
        if checking:
            args["asked"] = [x.strip() for x in next(a for a in argv if a.startswith("methods=")).split("=", 1)[1]
                             .split(",") if x.strip()]
            return validate(args, overrides, Path(args["out"] or ROOT / "results" / "utility" / "validation"))
        plans, profile, base, here = record(overrides, args["methods"], args["compute_s"], args["cost_scale"])
    except (InputError, ConfigError, UserError, PluginError, HydraException) as e:   # one line each
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    alpha = (args["latency_us"] if args["latency_us"] is not None else base.network.latency_us) * 1e-6
    out = Path(args["out"] or ROOT / "results" / "utility" / f"{base.model.name}-{base.dataset.name}")
    out.mkdir(parents=True, exist_ok=True)
    collectives = load_profile(base.network.collectives)     # checked with the config: None for ideal
    rows, even = table(plans, profile, args["workers"], args["bandwidths"], alpha, collectives)
    write_csv(out / "utility.csv", rows)
    write_csv(out / "break_even.csv", even)
    heatmaps(rows, even, args["workers"], args["bandwidths"], out / "heatmaps.png")
    report(args, plans, profile, here, alpha, rows, even, collectives)
    print(f"\nwrote {out / 'utility.csv'}, {out / 'break_even.csv'}, {out / 'heatmaps.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
