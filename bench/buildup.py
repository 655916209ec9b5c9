"""Gradient build-up study: union size and wire bytes of Top-k, shared Top-k, MiCRO and ExDyna at equal global K.

For each mini family (conf/experiment/mini_vgg, mini_resnet, mini_lstm: their model, data, batch
size and network), the model takes --warmup dense SGD steps (so gradients are not initial ones),
then a pool of --pool real per-worker gradients is drawn at those weights. For every N in
--workers, each method runs --steps steps on a simulated group of N workers, all methods on the
same gradients (worker r at step t takes pool gradient (t·N + r) mod pool), weights fixed, each
method with its own error feedback. Global target K = floor(d / --cf). Methods:
  topk         Top-k per worker at k = K (static Top-k at cf, this suite's per-worker convention):
               the union of the workers' selections lies in [K, N·K] (the build-up)
  topk_split   Top-k per worker at k = floor(K/N) (the same global budget as ExDyna): union <= K
  topk_shared  rank 0's top-K positions used by every worker (union K): values all-reduced after
               rank 0 broadcasts K int32 indices (modelled as (N-1)·alpha + 4K/beta, pipelined)
  micro, exdyna  gravac/methods/exdyna.py as a run uses them, recorded for max(--steps, 2N) steps
               (two partition cycles per worker, so the swing over a cycle is averaged) after an
               unrecorded settle: 4N + 20 steps that also multiply the threshold by (union/K)^(1/4)
               (the code's start 1/(2 sqrt K) can be off by 30x and its controller moves 0.5% a
               step), then the code's rule alone until it holds K (mean union/K over the last 2N
               of those steps in [0.9, 1.1]) or --settle-cap steps in all. Error feedback makes
               the threshold that holds K depend on N (a worker meets a partition again after N
               steps of accumulated residual), so the controller is given the time, not steered
               while recorded. The summary gives the settle steps, whether the criterion was met
               (a NOT HELD line when not) and the last 2N settle steps' mean union/K.
Recorded per step: union, the sum of the workers' counts (union / sum is 1 for exclusive
partitions, the overlap for Top-k), wire bytes one worker sends (Group's count: values, indices,
counts, padding), bytes one worker receives, and modelled communication seconds. Tracking: MiCRO
and ExDyna at N = --track-workers for --track-steps steps on the pool (asked vs achieved density,
load imbalance, threshold; fixed weights, so this is the threshold controller's dynamics on real
gradients, not a training run). Selection time, one worker, measured round-robin in one run: the
one-pass threshold on a partition of d/N (ExDyna's selection) and on the whole gradient, against
our exact Top-k and torch.topk at K and at K/N. --buildup-only skips tracking and selection
timing and leaves their files as they are.

    python bench/buildup.py [--families mini_vgg,mini_resnet,mini_lstm] [--workers 4,8,16,32] [--cf 1000]
                            [--steps 15] [--settle-cap 600] [--pool 48] [--track-steps 800] [--buildup-only]
                            [--out results/reference/exdyna]
"""
from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from compressors import ErrorFeedback, Payload, target_k  # noqa: E402
from compressors.arrays import above, native  # noqa: E402
from compressors.topk import topk_select  # noqa: E402
from gravac.cluster.comm import SimGroup  # noqa: E402
from gravac.methods import StepContext, build_method  # noqa: E402
from gravac.methods.exdyna import select  # noqa: E402
from gravac.cluster.netmodel import NetworkModel  # noqa: E402
from gravac.core.io import atomic_write  # noqa: E402
from plots.buildup import METHODS, figure, tracking_figure

HOLD_LO, HOLD_HI = 0.9, 1.1                         # settling criterion on union / K (held)
def family_config(experiment: str, workers: int, extra: list[str] | None = None):
    """The experiment's RunConfig with `workers` simulated workers, composed as bench/run.py does."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from gravac.config.compose import build_config, register_base
    register_base()
    overrides = [f"experiment={experiment}", f"cluster.workers={workers}", *(extra or [])]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        node = compose(config_name="config", overrides=overrides)
    return build_config(OmegaConf.to_container(node, resolve=True), overrides)


def gradient_pool(experiment: str, pool: int, warmup: int, seed: int):
    """(d, network model, `pool` real per-worker gradients after `warmup` dense SGD steps)."""
    from gravac.data import load_dataset
    from gravac.models import build_model
    from gravac.loop.workers import Workers
    cfg = family_config(experiment, pool)
    torch.manual_seed(seed)
    ds = load_dataset(cfg.dataset)
    model = build_model(cfg.model, ds.num_classes, ds.task)
    net = NetworkModel.from_cfg(cfg.network)
    workers = Workers(cfg.train, cfg.cluster, model, ds, SimGroup(pool, net), torch.device("cpu"))
    workers.check_memory(0)
    opt = torch.optim.SGD(workers.params, lr=cfg.train.lr, momentum=cfg.train.momentum)
    for s in range(warmup):
        avg = torch.stack(workers.compute(s).grads).mean(0)
        workers.apply(avg, s, "dense")                 # clips as the run does (the LM: 0.25)
        opt.step()
    grads = [g.clone() for g in workers.compute(warmup).grads]
    return workers.numel, workers.sizes, net, grads


def ctx(step: int) -> StepContext:
    return StepContext(step=step, epoch=0.0, lr=0.1, lr_decayed=False, compute_s=0.0, samples=0)


class SharedTopK:
    """Every worker sends its values at rank 0's top-K positions (union K): one value all-reduce
    after rank 0 broadcasts the K int32 positions."""

    def __init__(self, group: SimGroup, numel: int, k: int):
        self.group, self.numel, self.k = group, numel, k
        self.memories = [ErrorFeedback(numel) for _ in range(group.world)]

    def step(self, grads):
        comps = [m.compensate(g) for m, g in zip(self.memories, grads)]
        idx = torch.from_numpy(topk_select(native(comps[0]), self.k)[0]).long()
        payloads = [Payload(c[idx], idx, self.numel, shared=True) for c in comps]
        avg, comm = self.group.aggregate(payloads)
        for m, c, p in zip(self.memories, comps, payloads):
            m.update(c, p)
        net, n = self.group.net, self.group.world
        bcast = (n - 1) * net.alpha_s + 4 * self.k / net.beta_Bps
        return avg, comm.wire_bytes + 4 * self.k, comm.modelled_s + bcast


def build(name: str, group: SimGroup, sizes: list[int], cf: float, k: int):
    """The study's method `name` on `group` (module docstring)."""
    from gravac.config.compose import build_config
    numel, n = sum(sizes), group.world
    if name == "topk_shared":
        return SharedTopK(group, numel, k)
    if name in ("micro", "exdyna"):
        cfg = build_config({"method": {"name": name}, "compressor": {"name": "none", "cf": cf}})
    else:
        per = k if name == "topk" else max(1, k // n)
        cfg = build_config({"method": {"name": "static"},     # cf d/(per + 0.5): floor(d/cf) = per exactly
                            "compressor": {"name": "topk", "cf": numel / (per + 0.5), "granularity": "flat"}})
    return build_method(cfg, group, sizes, torch.device("cpu"))


def held(ratios: list[float], n: int) -> bool:
    """The settling criterion: mean union / K over the last 2N steps (two partition cycles per
    worker, so the swing over a cycle is averaged) lies in [HOLD_LO, HOLD_HI]."""
    window = ratios[-2 * n:]
    return len(window) == 2 * n and HOLD_LO <= statistics.fmean(window) <= HOLD_HI


def settle(method, grads_at, n: int, k: int, fast: int, cap: int) -> dict:
    """Unrecorded steps of MiCRO / ExDyna until the code's own controller holds K (`held` over
    code-rule steps only) or `cap` steps; the first `fast` steps also multiply the threshold by
    (union/K)^(1/4) to get near K sooner. Returns the steps used, whether `held` was met and the
    mean union / K over the last 2N steps (what the criterion saw)."""
    ratios = []
    for t in range(cap):
        u = method.step(grads_at(t, n), ctx(t)).extra["union"] / k
        if t < fast:
            method.threshold *= u ** 0.25
            continue
        ratios.append(u)
        if held(ratios, n):
            return {"settle_steps": t + 1, "settled": True, "settle_window": statistics.fmean(ratios[-2 * n:])}
    return {"settle_steps": cap, "settled": False,
            "settle_window": statistics.fmean(ratios[-2 * n:]) if ratios else float("nan")}


def run_method(name: str, grads_at, sizes, net, n: int, cf: float, steps: int, cap: int) -> list[dict]:
    """Per recorded step of method `name` on N = n workers: union, counts, bytes, modelled seconds,
    and the settling that preceded it (MiCRO / ExDyna: max(steps, 2N) steps after `settle`)."""
    numel = sum(sizes)
    k = target_k(numel, cf)
    group = SimGroup(n, net)
    method = build(name, group, sizes, cf, k)
    info = {"settle_steps": 0, "settled": "", "settle_window": ""}
    if name in ("micro", "exdyna"):
        info = settle(method, grads_at, n, k, fast=4 * n + 20, cap=cap)
        steps = max(steps, 2 * n)
    start = info["settle_steps"]
    rows = []
    for t in range(start, start + steps):
        grads = grads_at(t, n)
        if name == "topk_shared":
            avg, wire, model_s = method.step(grads)
            recv, selected = (n - 1) * 4 * k + 4 * k, n * k
        else:
            res = method.step(grads, ctx(t))
            avg, wire, model_s = res.grad, res.comm.wire_bytes, res.comm.modelled_s
            if name == "topk":
                selected, recv = n * k, n * (wire - 8)                   # every worker's padded pairs
            elif name == "topk_split":
                selected, recv = n * max(1, k // n), n * (wire - 8)
            else:
                selected = res.extra["union"]
                recv = n * 4 * res.extra["max_k"] + 4 * res.extra["union"]
        union = int(torch.count_nonzero(avg))
        rows.append({"method": name, "workers": n, "step": t - start, "numel": numel, "k_global": k, "selected": selected,
                     "union": union, "union_over_k": union / k, "union_over_selected": union / selected,
                     "wire_bytes": wire, "recv_bytes": recv, "comm_model_s": model_s, **info})
    return rows


def track(name: str, grads_at, sizes, net, n: int, cf: float, steps: int) -> list[dict]:
    """MiCRO / ExDyna's density, imbalance and threshold step by step on the pool."""
    numel = sum(sizes)
    method = build(name, SimGroup(n, net), sizes, cf, target_k(numel, cf))
    out = []
    for t in range(steps):
        res = method.step(grads_at(t, n), ctx(t))
        e = res.extra
        out.append({"method": name, "workers": n, "step": t, "density_target": e["density_target"],
                    "density": e["density"], "imbalance": e["imbalance"], "threshold": e["threshold"],
                    "blocks_min": e.get("blocks_min", ""), "blocks_max": e.get("blocks_max", "")})
    return out, method.threshold


def time_selection(x: torch.Tensor, n: int, k: int, thr: float, repeats: int) -> dict:
    """Median seconds of each selection on one worker's gradient, cases interleaved per repeat."""
    numel = x.numel()
    part = numel // n
    a = native(x)
    cases = {
        "threshold_partition": lambda: select(x, 0, part, thr, 0),
        "threshold_full": lambda: above(a, thr),
        "topk_ours_K": lambda: topk_select(a, k),
        "topk_torch_K": lambda: torch.topk(x.abs(), k, sorted=False),
        "topk_ours_K_over_N": lambda: topk_select(a, max(1, k // n)),
        "topk_torch_K_over_N": lambda: torch.topk(x.abs(), max(1, k // n), sorted=False),
    }
    times = {c: [] for c in cases}
    for _ in range(repeats):
        for c, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[c].append(time.perf_counter() - t0)
    return {c: statistics.median(v) for c, v in times.items()}


def write_csv(rows: list[dict], out: Path) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    atomic_write(out, buf.getvalue())


def summarise(rows: list[dict]) -> list[dict]:
    """Per (family, method, N): means over the recorded steps, union / K's min and max, and the settling."""
    keys = sorted({(r["family"], r["method"], r["workers"]) for r in rows}, key=lambda x: (x[0], METHODS.index(x[1]), x[2]))
    out = []
    for fam, m, n in keys:
        sel = [r for r in rows if (r["family"], r["method"], r["workers"]) == (fam, m, n)]
        mean = {c: statistics.fmean(r[c] for r in sel) for c in ("union", "union_over_k", "union_over_selected",
                                                                 "wire_bytes", "recv_bytes", "comm_model_s")}
        ratios = [r["union_over_k"] for r in sel]
        out.append({"family": fam, "method": m, "workers": n, "k_global": sel[0]["k_global"], "recorded_steps": len(sel),
                    **mean, "union_over_k_min": min(ratios), "union_over_k_max": max(ratios),
                    **{c: sel[0][c] for c in ("settle_steps", "settled", "settle_window")}})
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default="mini_vgg,mini_resnet,mini_lstm")
    ap.add_argument("--workers", default="4,8,16,32")
    ap.add_argument("--cf", type=float, default=1000.0, help="global CF: K = floor(d / cf)")
    ap.add_argument("--steps", type=int, default=15, help="recorded build-up steps per method and N (MiCRO, ExDyna: at least 2N)")
    ap.add_argument("--settle-cap", type=int, default=600, help="most unrecorded settling steps of MiCRO / ExDyna")
    ap.add_argument("--buildup-only", action="store_true", help="skip tracking and selection timing (their files stay)")
    ap.add_argument("--pool", type=int, default=48, help="real per-worker gradients per family")
    ap.add_argument("--warmup", type=int, default=10, help="dense SGD steps before the pool is drawn")
    ap.add_argument("--track-steps", type=int, default=800, help="as long as the mini runs")
    ap.add_argument("--track-workers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5, help="selection timing repeats")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/reference/exdyna")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ns = [int(n) for n in args.workers.split(",")]
    rows, tracking, timing = [], [], []
    for fam in args.families.split(","):
        t0 = time.perf_counter()
        numel, sizes, net, pool = gradient_pool(fam, args.pool, args.warmup, args.seed)

        def grads_at(t, n, pool=pool):
            return [pool[(t * n + r) % len(pool)] for r in range(n)]
        for n in ns:
            for m in METHODS:
                rows += [{"family": fam, **r} for r in run_method(m, grads_at, sizes, net, n, args.cf, args.steps,
                                                                    args.settle_cap)]
        if not args.buildup_only:
            tracking += track_and_time(fam, grads_at, pool, numel, sizes, net, ns, args, timing)
        print(f"{fam}: d={numel:,} K={target_k(numel, args.cf)} done in {time.perf_counter() - t0:.0f} s", flush=True)
        summary = save(rows, tracking, timing, out)      # after every family: a long run keeps what it did
    print_tables(summary, tracking, timing)


def track_and_time(fam, grads_at, pool, numel, sizes, net, ns, args, timing: list[dict]) -> list[dict]:
    """The tracking rows of family `fam`; appends its selection timings to `timing`."""
    tracking, thresholds = [], {}
    for m in ("micro", "exdyna"):
        rec, thresholds[m] = track(m, grads_at, sizes, net, args.track_workers, args.cf, args.track_steps)
        tracking += [{"family": fam, **r} for r in rec]
    k = target_k(numel, args.cf)
    for n in ns:
        times = time_selection(pool[0], n, k, thresholds["exdyna"], args.repeats)
        timing.append({"family": fam, "numel": numel, "workers": n, "k_global": k, **times,
                       "ours_K_over_threshold_partition": times["topk_ours_K"] / times["threshold_partition"],
                       "torch_K_over_threshold_partition": times["topk_torch_K"] / times["threshold_partition"],
                       "ours_K_over_threshold_full": times["topk_ours_K"] / times["threshold_full"]})
    return tracking


def save(rows, tracking, timing, out: Path) -> list[dict]:
    """Write the CSVs and figures of the families done so far (tracking and selection only when they
    were run, so --buildup-only leaves those files as they are); the summary rows."""
    summary = summarise(rows)
    write_csv(rows, out / "buildup.csv")
    write_csv(summary, out / "buildup_summary.csv")
    figure(summary, out)
    if tracking:
        write_csv(tracking, out / "tracking.csv")
        write_csv(timing, out / "selection.csv")
        tracking_figure(tracking, out)
    return summary


def print_tables(summary, tracking, timing) -> None:
    print("\nunion / K (mean, min-max over the recorded steps), union / sum of counts, bytes per worker per step, settling")
    print(f"{'family':12} {'method':12} {'N':>3} {'union/K':>8} {'min':>5} {'max':>5} {'u/sum':>6} {'sent B':>10} "
          f"{'recv B':>10} {'comm ms':>8} {'settle':>6} held")
    for r in summary:
        print(f"{r['family']:12} {r['method']:12} {r['workers']:>3} {r['union_over_k']:8.2f} {r['union_over_k_min']:5.2f} "
              f"{r['union_over_k_max']:5.2f} {r['union_over_selected']:6.3f} {r['wire_bytes']:10.0f} {r['recv_bytes']:10.0f} "
              f"{1e3 * r['comm_model_s']:8.3f} {r['settle_steps']:>6} {r['settled']}")
    for r in summary:
        if r["settled"] is False:
            print(f"NOT HELD: {r['family']} {r['method']} N={r['workers']}: mean union/K over the last 2N of "
                  f"{r['settle_steps']} settling steps {r['settle_window']:.2f}, outside [{HOLD_LO}, {HOLD_HI}]")
    if not tracking:
        return
    print("\ndensity tracking (last 50 steps: mean density / asked, mean imbalance)")
    for fam in sorted({r["family"] for r in tracking}):
        for m in ("micro", "exdyna"):
            sel = [r for r in tracking if r["family"] == fam and r["method"] == m][-50:]
            print(f"{fam:12} {m:8} density/asked {statistics.fmean(r['density'] for r in sel) / sel[0]['density_target']:.2f}"
                  f"  imbalance {statistics.fmean(r['imbalance'] for r in sel):.2f}")
    print("\nselection time, one worker (ms): threshold on d/N, threshold on d, our Top-k at K, torch.topk at K")
    for r in timing:
        print(f"{r['family']:12} N={r['workers']:>2} {1e3 * r['threshold_partition']:7.2f} {1e3 * r['threshold_full']:7.2f} "
              f"{1e3 * r['topk_ours_K']:7.2f} {1e3 * r['topk_torch_K']:7.2f}   ours/threshold(d/N) "
              f"{r['ours_K_over_threshold_partition']:.1f}x")


if __name__ == "__main__":
    main()
