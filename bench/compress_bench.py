"""Compression micro-benchmark: our compressors against torch.topk and one memory pass, side by side.

For each gradient size (ResNet101 / VGG16 / LSTM parameter counts, or --numel), every case is
timed round-robin in ONE run (so load from other processes hits all of them alike) and reported
as a median:
  * pass        one memory pass, ``x.abs().sum()``; compression times are also given in passes;
  * torch.topk  ``torch.topk(x.abs(), k)`` - the baseline for exact Top-k (same index set checked);
  * compress    each compressor at each CF;
  * multilevel  the Table-3 analogue: direct C(g,10) + C(g,1000) against multi-level
                C(g,10) + recompress(C(g,10), 100), and C(g,1000) alone against the recompress alone;
  * quantize    each quantizer (its CF is fixed by its code width, so once, not per CF): encode,
                decode, and encode + decode (kind=quantize; passes = encode + decode).
Memory is kept mapped between calls by default (``--alloc steady``): with glibc's defaults every
large temporary is a fresh mmap whose first touch page-faults, and those faults (host-dependent,
about 3x the cost of the pass itself at ResNet101's size) made the medians noisy and the pass, the
unit, far too slow. ``--alloc fresh`` measures that default; the CSV records the mode and each
case's page faults per call.
Gradients are synthetic and heavy-tailed, ``randn * exp(randn)`` (a log-normal scale mixture of
Gaussians, like real gradients whose per-coordinate scales vary over orders of magnitude); Top-k
is also timed on plain ``randn`` ("normal"); ``--dists vgg16fc1`` adds VGG16's tie-heavy structure
(see synthetic_gradient). Writes a CSV (atomically) and prints tables.

    python bench/compress_bench.py [--sizes resnet101,vgg16,lstm | --numel 1000000] [--cfs 10,100,1000]
                                   [--repeats 5] [--alloc steady|fresh] [--quick] [--out results/compress_bench.csv]
    --compressors takes options after a colon, joined by +: quant:bits=4+bucket=1024 (quantizers at other widths).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import csv
import io
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from compressors import COMPRESSORS, Compressor, build_compressor, target_k  # noqa: E402
from gravac.core.io import atomic_write  # noqa: E402

SIZES = {"resnet101": 44_549_160, "vgg16": 138_357_544, "lstm": 66_034_000}
QUICK_NUMEL = 1_000_000
COLUMNS = ["kind", "dist", "size", "numel", "compressor", "label", "cf", "threads", "runs", "median_s", "pass_s", "passes",
           "torch_topk_s", "speedup_vs_torch_topk", "same_set_as_torch", "nnz", "wire_bytes",
           "direct_s", "multilevel_s", "multilevel_speedup", "direct_high_s", "recompress_s", "recompress_speedup",
           "direct_repeats_s", "multilevel_repeats_s", "encode_s", "decode_s", "no_dither_s", "no_dither_passes",
           "alloc", "page_faults"]
ALLOCS = ("steady", "fresh")


@contextlib.contextmanager
def allocator(mode: str):
    """How freed memory behaves while timing. ``steady``: glibc never returns it to the kernel
    (mmap off, trim threshold at its maximum), so after one warm-up call no case page-faults and a
    time is the code's compute and memory traffic, as under a caching allocator (CUDA's, jemalloc).
    ``fresh``: glibc's defaults, where every temporary over 32 MB is a new mmap that faults on first
    touch, as in a default CPU PyTorch process (slower, and by how much depends on the host).
    glibc's defaults come back on exit (the quick test runs inside pytest)."""
    if mode == "fresh":
        yield
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4   # malloc.h
    if not hasattr(libc, "mallopt") or not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)):
        raise SystemExit("compress_bench: --alloc steady needs glibc's mallopt, which this C library lacks; "
                         "use --alloc fresh (times then include page faults)")
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_MAX, 65536)
        libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)
        libc.malloc_trim(0)


def _label(name: str) -> str:
    """Display name of a compressor for the CSV (plots read it from there)."""
    base = name.split(":")[0]
    return COMPRESSORS[base].label if base in COMPRESSORS else name


def parse_spec(spec: str) -> tuple[str, dict]:
    """``name`` or ``name:opt=val,...`` (e.g. ``quant:bits=4``) -> (name, integer-or-string options)."""
    name, _, opts = spec.partition(":")
    options = {}
    for kv in filter(None, opts.split("+")):
        k, _, v = kv.partition("=")
        options[k] = int(v) if v.lstrip("-").isdigit() else v
    return name, options


def make(spec: str) -> Compressor:
    """The compressor a --compressors entry names, with its options."""
    name, options = parse_spec(spec)
    return build_compressor(name, **options)


class TorchTopK(Compressor):
    """Top-k as in the reference code (GRACE): torch.topk(|x|, k). Baseline for the Table-3 rows."""

    name = "topk_torch"

    def _select(self, a, k, cf, seed, check):
        t = torch.from_numpy(a) if not isinstance(a, torch.Tensor) else a
        idx = torch.topk(t.abs(), k, sorted=False).indices
        return idx, t[idx]


def synthetic_gradient(n: int, dist: str, seed: int) -> torch.Tensor:
    """Heavy-tailed (randn * exp(randn)) or normal float32 data, reproducible from the seed.

    ``vgg16fc1``: the tie structure of VGG16's gradient at 32 px input. Its fc1 weight (4096 x
    25088, 77% of the model) sees a 1x1 feature map replicated 49 times by AdaptiveAvgPool2d(7),
    so its gradient outer(dL/dout, input) repeats every |value| 49 times (~1.6M distinct values
    at full size), with zero rows and columns (ReLU / dropout: ~25M zeros); the rest are ordinary
    heavy-tailed values at a smaller scale (the conv layers).

    ``zeros95``: heavy-tailed with 95% exact zeros (embedding rows outside the batch, dead units), so
    at 10x and 20x the k-th magnitude is a tie at 0 that spans most of the tensor.
    """
    torch.manual_seed(seed)
    if dist == "vgg16fc1":
        rows = min(4096, max(1, round(0.765 * n / 25088)))
        u = torch.randn(rows) * torch.randn(rows).exp()
        u[torch.rand(rows) < 0.15] = 0
        v = (torch.randn(512) * torch.randn(512).exp()).abs()
        v[torch.rand(512) < 0.12] = 0
        fc1 = torch.outer(u, v.repeat_interleave(49)).reshape(-1)[:n]
        rest = synthetic_gradient(n - fc1.numel(), "heavy", seed + 1).mul_(0.05)
        cut = rest.numel() // 10  # the conv layers come first, fc2/fc3 after fc1
        return torch.cat([rest[:cut], fc1, rest[cut:]])
    g = torch.randn(n)
    if dist in ("heavy", "zeros95"):
        g.mul_(torch.randn(n).exp_())
    if dist == "zeros95":
        g[torch.rand(n) < 0.95] = 0
    return g


class Suite:
    """Cases timed round-robin: each repeat runs every case once, so drift hits all alike."""

    def __init__(self, repeats: int, budget_s: float) -> None:
        self.repeats, self.budget_s = repeats, budget_s
        self.cases: dict[str, object] = {}
        self.times: dict[str, list[float]] = {}
        self.faults: dict[str, list[int]] = {}

    def add(self, name: str, fn) -> None:
        self.cases[name] = fn
        self.times[name] = []
        self.faults[name] = []

    def run(self) -> None:
        for fn in self.cases.values():  # warm-up of every case (lazy init; the steady heap grows to its peak), not timed
            fn()
        for rep in range(self.repeats):
            for name, fn in self.cases.items():
                spent = sum(self.times[name])
                if rep > 0 and spent > self.budget_s:  # slow baseline (torch.topk on VGG16): bounded
                    continue
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter()
                fn()
                self.times[name].append(time.perf_counter() - t0)
                self.faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])

    def page_faults(self, name: str) -> int:
        """Median minor page faults of one call: about 0 under --alloc steady."""
        return int(statistics.median(self.faults[name]))

    def runs(self, name: str) -> int:
        return len(self.times[name])

    def timings(self, name: str) -> str:
        """Every timed repeat of a case, ';'-separated (the figures' error bars come from these)."""
        return ";".join(f"{t:.6g}" for t in self.times[name])


def same_set(idx: torch.Tensor, ref_idx: torch.Tensor, x: torch.Tensor) -> str:
    """'yes' if the index sets agree, 'ties' if only tied magnitudes differ, else 'NO'."""
    if torch.equal(torch.sort(idx).values, torch.sort(ref_idx).values):
        return "yes"
    a, b = x[idx].abs().sort().values, x[ref_idx].abs().sort().values
    return "ties" if torch.equal(a, b) else "NO"


def bench_size(size: str, n: int, args, threads: int) -> list[dict]:
    """All rows for one gradient size."""
    rows: list[dict] = []
    for dist in args.dists:
        x = synthetic_gradient(n, dist, args.seed)
        names = ["topk"] if dist == "normal" else args.compressors
        quants = {name: make(name) for name in names if is_quantizer(name)}
        comps = {name: make(name) for name in names if not is_quantizer(name)}
        s = Suite(args.repeats, args.budget)
        s.add("pass", lambda: x.abs().sum())
        for cf in args.cfs:
            k = target_k(n, cf)
            if "topk" in names:
                s.add(f"torch.topk/{cf}", lambda k=k: torch.topk(x.abs(), k, sorted=False))
            for name, c in comps.items():
                s.add(f"{name}/{cf}", lambda c=c, cf=cf: c.compress(x, cf, seed=1))
        for name, c in quants.items():
            p_q = c.compress(x, 1, seed=1)
            s.add(f"{name}/encode", lambda c=c: c.compress(x, 1, seed=1))
            s.add(f"{name}/decode", lambda c=c, p=p_q: c.decode(p))
            s.add(f"{name}/both", lambda c=c: c.compress(x, 1, seed=1).dense())
            if getattr(c, "stochastic", False):   # the same work without its random bits: the floor a dither sits on
                s.add(f"{name}/nodither", lambda c=c: c.compress(x, 1, seed=None).dense())
        if dist == "heavy":
            lo, hi = args.multilevel
            cs = hi / lo
            ml = dict(comps, topk_torch=TorchTopK()) if args.reference else comps
            for name, c in ml.items():
                p_lo = c.compress(x, lo, seed=1)
                s.add(f"{name}/direct", lambda c=c: (c.compress(x, lo, seed=1), c.compress(x, hi, seed=1)))
                s.add(f"{name}/multi", lambda c=c: c.recompress(c.compress(x, lo, seed=1), cs, seed=2))
                s.add(f"{name}/high", lambda c=c: c.compress(x, hi, seed=1))
                s.add(f"{name}/re", lambda c=c, p=p_lo: c.recompress(p, cs, seed=2))
        s.run()
        pass_s = s.median("pass")
        base = dict(dist=dist, size=size, numel=n, threads=threads, alloc=args.alloc)
        for cf in args.cfs:
            k = target_k(n, cf)
            ref = torch.topk(x.abs(), k, sorted=False).indices if "topk" in names else None
            for name, c in comps.items():
                med = s.median(f"{name}/{cf}")
                p = c.compress(x, cf, seed=1)
                row = dict(base, kind="compress", compressor=name, label=_label(name), cf=cf,
                           runs=s.runs(f"{name}/{cf}"), median_s=med, pass_s=pass_s, passes=med / pass_s, nnz=p.nnz, wire_bytes=p.wire_bytes(),
                           page_faults=s.page_faults(f"{name}/{cf}"))
                if name == "topk":
                    tt = s.median(f"torch.topk/{cf}")
                    row.update(torch_topk_s=tt, speedup_vs_torch_topk=tt / med,
                               same_set_as_torch=same_set(p.indices, ref, x))
                rows.append(row)
        for name, c in quants.items():
            p = c.compress(x, 1, seed=1)
            med = s.median(f"{name}/both")
            rows.append(dict(base, kind="quantize", compressor=name, label=_label(name), cf=n / p.floats,
                             runs=s.runs(f"{name}/both"), median_s=med, pass_s=pass_s, passes=med / pass_s,
                             nnz=p.nnz, wire_bytes=p.wire_bytes(), encode_s=s.median(f"{name}/encode"),
                             decode_s=s.median(f"{name}/decode"), page_faults=s.page_faults(f"{name}/both")))
            if f"{name}/nodither" in s.cases:
                nd = s.median(f"{name}/nodither")
                rows[-1].update(no_dither_s=nd, no_dither_passes=nd / pass_s)
        if dist == "heavy":
            lo, hi = args.multilevel
            for name, c in ml.items():
                d, m = s.median(f"{name}/direct"), s.median(f"{name}/multi")
                h, r = s.median(f"{name}/high"), s.median(f"{name}/re")
                q = c.recompress(c.compress(x, lo, seed=1), hi / lo, seed=2)
                rows.append(dict(base, kind="multilevel", compressor=name, label=_label(name), cf=hi,
                                 runs=s.runs(f"{name}/multi"), median_s=m, pass_s=pass_s, passes=m / pass_s, nnz=q.nnz, wire_bytes=q.wire_bytes(),
                                 direct_s=d, multilevel_s=m, multilevel_speedup=d / m, direct_high_s=h,
                                 recompress_s=r, recompress_speedup=h / r,
                                 direct_repeats_s=s.timings(f"{name}/direct"), multilevel_repeats_s=s.timings(f"{name}/multi"),
                                 page_faults=s.page_faults(f"{name}/multi")))
        del x
    return rows


def is_quantizer(name: str) -> bool:
    """A compressor whose options fix its CF (a quantizer's code width, a 16-bit cast): timed
    once, encode and decode, without multi-level rows."""
    base, options = parse_spec(name)
    e = COMPRESSORS[base] if base in COMPRESSORS else None
    return e is not None and e.target.fixed_cf(e.config(name=base, **options)) is not None


def fmt(v, spec: str) -> str:
    return "" if v is None or v == "" else format(v, spec)


def print_tables(rows: list[dict], threads: int, lo: float, hi: float) -> None:
    print(f"\ntorch {torch.__version__}, threads={threads}, alloc={rows[0]['alloc'] if rows else '-'}; "
          "times are medians, 'passes' = time / x.abs().sum() time")
    print(f"\n{'size':10} {'dist':6} {'compressor':10} {'CF':>6} {'time ms':>9} {'passes':>7} {'nnz':>10} "
          f"{'torch.topk ms':>14} {'speedup':>8} {'same set':>8}")
    for r in rows:
        if r["kind"] != "compress":
            continue
        print(f"{r['size']:10} {r['dist']:6} {r['compressor']:10} {r['cf']:>6g} {r['median_s'] * 1e3:9.1f} "
              f"{r['passes']:7.2f} {r['nnz']:10d} {fmt(r.get('torch_topk_s') and r['torch_topk_s'] * 1e3, '14.1f'):>14} "
              f"{fmt(r.get('speedup_vs_torch_topk'), '8.2f'):>8} {r.get('same_set_as_torch', ''):>8}")
    quant = [r for r in rows if r["kind"] == "quantize"]
    if quant:
        print("\nQuantizers and 16-bit casts (CF fixed by the code width): encode, decode, and both in passes; "
              "'no dither': both without the stochastic rounding's random bits (seed=None), the floor of a dither")
        print(f"{'size':10} {'dist':6} {'compressor':10} {'CF':>6} {'encode ms':>10} {'decode ms':>10} {'both ms':>9} "
              f"{'passes':>7} {'no dither':>9} {'wire bytes':>11}")
        for r in quant:
            print(f"{r['size']:10} {r['dist']:6} {r['compressor']:10} {r['cf']:6.2f} {r['encode_s'] * 1e3:10.1f} "
                  f"{r['decode_s'] * 1e3:10.1f} {r['median_s'] * 1e3:9.1f} {r['passes']:7.2f} "
                  f"{fmt(r.get('no_dither_passes'), '9.2f'):>9} {r['wire_bytes']:11d}")
    print(f"\nMulti-level {lo:g}x -> {hi:g}x (Table 3 analogue): direct = C(g,{lo:g}) + C(g,{hi:g}); "
          f"multi = C(g,{lo:g}) + recompress(., {hi / lo:g})")
    print(f"{'size':10} {'compressor':10} {'direct ms':>10} {'multi ms':>9} {'speedup':>8} "
          f"{'C(g,' + format(hi, 'g') + ') ms':>13} {'recompress ms':>14} {'speedup':>8}")
    for r in rows:
        if r["kind"] == "multilevel":
            print(f"{r['size']:10} {r['compressor']:10} {r['direct_s'] * 1e3:10.1f} {r['multilevel_s'] * 1e3:9.1f} "
                  f"{r['multilevel_speedup']:8.2f} {r['direct_high_s'] * 1e3:13.1f} {r['recompress_s'] * 1e3:14.1f} "
                  f"{r['recompress_speedup']:8.2f}")


def write_csv(rows: list[dict], out: Path) -> None:
    """Write rows atomically (gravac.loop.results.atomic_write)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k, "")) for k in COLUMNS})
    atomic_write(str(out), buf.getvalue())


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="resnet101,vgg16,lstm", help=f"comma list of {', '.join(SIZES)}")
    ap.add_argument("--numel", default=None, help="comma list of element counts (instead of --sizes)")
    ap.add_argument("--cfs", default="10,100,1000", help="compression factors")
    ap.add_argument("--compressors", default=",".join(COMPRESSORS.names()),
                    help="comma list of compressors, each optionally with options: quant:bits=4+bucket=1024")
    ap.add_argument("--dists", default="heavy,normal", help="heavy (randn*exp(randn), all compressors), normal (Top-k only) "
                    "and/or vgg16fc1 (VGG16's tie structure: fc1's 49-fold repeated values and zeros; all compressors), "
                    "zeros95 (heavy with 95%% exact zeros; all compressors)")
    ap.add_argument("--multilevel", default="10,1000", help="low,high CF of the multi-level comparison")
    ap.add_argument("--no-reference", dest="reference", action="store_false",
                    help="skip the torch.topk-based Top-k (reference code) in the multi-level table")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--alloc", choices=ALLOCS, default="steady",
                    help="steady: freed memory stays mapped, no page faults after the warm-up (default); "
                         "fresh: glibc's defaults, every large temporary faults on first touch")
    ap.add_argument("--budget", type=float, default=8.0, help="stop repeating a case after this many seconds")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: what torch uses)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help=f"one small size ({QUICK_NUMEL:,} elements)")
    ap.add_argument("--out", default="results/compress_bench.csv")
    a = ap.parse_args(argv)
    try:
        if a.quick:
            a.sizes = [("quick", QUICK_NUMEL)]
        elif a.numel:
            a.sizes = [(f"n{int(v)}", int(v)) for v in a.numel.split(",")]
        else:
            bad = [s for s in a.sizes.split(",") if s not in SIZES]
            if bad:
                ap.error(f"unknown size(s) {', '.join(bad)}; valid: {', '.join(SIZES)} (or use --numel)")
            a.sizes = [(s, SIZES[s]) for s in a.sizes.split(",")]
        a.cfs = [float(v) for v in a.cfs.split(",")]
        a.compressors = a.compressors.split(",")
        a.dists = a.dists.split(",")
        a.multilevel = tuple(float(v) for v in a.multilevel.split(","))
    except ValueError as e:
        ap.error(f"bad argument: {e}")
    for c in a.compressors:
        if parse_spec(c)[0] not in COMPRESSORS:
            ap.error(f"unknown compressor {c!r}; valid: {', '.join(COMPRESSORS)}")
    if set(a.dists) - {"heavy", "normal", "vgg16fc1", "zeros95"} or len(a.multilevel) != 2 or a.repeats < 1 or min(a.cfs) < 1:
        ap.error("need --dists from heavy,normal,vgg16fc1,zeros95; --multilevel low,high; --repeats >= 1; CFs >= 1")
    return a


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    rows = []
    with allocator(args.alloc):
        for size, n in args.sizes:
            t0 = time.perf_counter()
            rows += bench_size(size, n, args, threads)
            print(f"[{size}: {n:,} elements done in {time.perf_counter() - t0:.0f} s]", flush=True)
    print_tables(rows, threads, *args.multilevel)
    out = Path(args.out)
    write_csv(rows, out)
    print(f"\nwrote {out}")
    return rows


if __name__ == "__main__":
    main()
