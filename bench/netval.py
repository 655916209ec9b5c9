"""Hold the network model against a real rate-limited network (issues 13 and 37).

    python bench/netval.py            # full sweep: results/netval.csv + results/netval.png
    python bench/netval.py --quick    # two workers, one rate, a few sizes (~1 min)
    python bench/netval.py --fit      # fit the gloo-cpu collective profile to the CSV (no measuring)

N workers run in N network namespaces joined by veth pairs to a bridge (bench/netns.py), each link
shaped by `tc tbf` (and `netem delay` for the latency setting). Through the project's own
DistGroup (gloo) they time real all-reduces, all-gathers, padded sparse all-gathers (counts, then
values) and broadcasts from 4 KB up, real DDP steps, and whole training steps of a mini model with
cluster=ddp (dense, static Top-k 10x, GraVAC ε=0.7); each measurement sits beside what the ideal
alpha-beta model predicts for the same size, N, rate and latency, and what the fitted collective
profile predicts. `--fit` fits that profile (gravac/cluster/netmodel.py) and, so the check is not
self-fulfilling, also predicts every rate's rows from a fit to the other rates only (held out).
Without root or iproute2 it says what is missing in one line and exits 0 (nothing to do).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from netns import Netns, burst_bytes, has_netem, missing  # noqa: E402

PORT = 29500            # inside namespaces this script created: nothing else can listen there
BASE_LATENCY_US = 10.0  # the presets' per-message latency, added to netem's delay in predictions
FIELDS = ["kind", "workers", "shared_cores", "rate_mbit", "delay_ms", "bytes", "reps", "measured_s", "predicted_ideal_s",
          "ratio_ideal", "predicted_fitted_s", "ratio_fitted", "predicted_heldout_s", "ratio_heldout",
          "measured_min_s", "measured_max_s", "detail"]
#: The cores all of a measurement's workers share: they run on this one machine.
HOST_CORES = len(os.sched_getaffinity(0))
STEP_ARMS = {"dense": [], "topk10": ["arm=topk10"], "gravac07": ["arm=gravac07"]}


# --- inside a namespace: one rank of the collective benchmark ---------------------------------
COLLECTIVES = ("allreduce", "allgather", "sparse_allgather", "broadcast")


def worker(a) -> None:
    """Time each collective of the project's DistGroup at every size; rank 0 writes the rows as
    JSON (predictions are added on the host, where the profiles are fitted)."""
    import torch
    import torch.distributed as dist

    from compressors import Payload
    from gravac.cluster.comm import DistGroup
    from gravac.cluster.netmodel import NetworkModel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{PORT}", rank=a.rank, world_size=a.world)
    ideal = NetworkModel(alpha_s=(a.delay_ms * 1e3 + BASE_LATENCY_US) * 1e-6, beta_Bps=a.rate_mbit * 1e6 / 8)
    group = DistGroup(ideal, torch.device("cpu"))
    gen = torch.Generator().manual_seed(a.rank)
    refill_s = burst_bytes(a.rate_mbit) / (a.rate_mbit * 1e6 / 8)
    rows = []
    for kind in COLLECTIVES:
        for nbytes in a.sizes:
            if ideal.predict(kind, nbytes, a.world) > a.max_s:
                continue
            if kind == "allreduce":            # float32, as dense gradients
                x = torch.randn(max(1, nbytes // 4), generator=gen)
                call = lambda x=x: group._allreduce_sum([x])  # noqa: E731
            elif kind == "allgather":          # equal-sized byte buffers (packed payloads)
                buf = torch.randint(0, 255, (max(1, nbytes),), dtype=torch.uint8, generator=gen)
                call = lambda buf=buf: group._allgather_bytes([buf])  # noqa: E731
            elif kind == "sparse_allgather":   # counts, then float32 values + int32 indices padded
                n = max(1, nbytes // 8)
                p = Payload(torch.randn(n, generator=gen), torch.arange(n) * 2 + a.rank % 2, 2 * n)
                call = lambda p=p: group._allgather_sparse([p])  # noqa: E731
            else:                              # rank 0's float32 tensor to every rank
                t = torch.randn(max(1, nbytes // 4), generator=gen)
                call = lambda t=t: group.broadcast_tensors([t])  # noqa: E731
            call()                             # warm-up (connections, buffers)
            ideal_s = ideal.predict(kind, nbytes, a.world)   # small ones vary by milliseconds here: more of them
            reps = 5 * a.reps if ideal_s < 0.02 else a.reps if ideal_s < 1.0 else max(2, a.reps // 2)
            times = []
            for _ in range(reps):
                time.sleep(refill_s)           # tbf's bucket full again: every rep starts alike
                group.barrier()
                t0 = time.perf_counter()
                call()
                dt = time.perf_counter() - t0
                times.append(max(r[0] for r in group.bookkeeping([[dt]])))  # the slowest rank
            rows.append({"kind": kind, "bytes": nbytes, "reps": reps, "measured_s": statistics.median(times),
                         "measured_min_s": min(times), "measured_max_s": max(times),
                         "detail": "gloo via gravac.cluster.comm.DistGroup"})
    if a.rank == 0:
        Path(a.json).write_text(json.dumps(rows))
    group.barrier()
    dist.destroy_process_group()


# --- inside a namespace: one rank of real torch DDP (overlapping buckets) ------------------------
def ddp_worker(a) -> None:
    """Time real DDP steps of a mini model, and predict them with gravac.cluster.timeline from the same
    process's profile (measured without communication): serial and overlapped."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gravac.models.registry import MODELS, build_model
    from gravac.cluster.netmodel import NetworkModel
    from gravac.cluster.profile import measure_profile
    from gravac.cluster.timeline import Piece, buckets, schedule
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{PORT}", rank=a.rank, world_size=a.world)
    model = build_model(MODELS[a.model].config(name=a.model), 10, "classification")
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    loss_fn = torch.nn.functional.cross_entropy
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)

    def local_step(mark):
        out = model(x)
        loss = loss_fn(out, y)
        mark()
        loss.backward()
    prof = measure_profile(local_step, params, opt.step, a.reps)      # no communication at all
    ddp = DDP(model, bucket_cap_mb=25)
    times = []
    for i in range(a.reps + 3):       # DDP rebuilds its buckets in ready order after the first step
        dist.barrier()
        t0 = time.perf_counter()
        loss_fn(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    rows = [[statistics.median(times)]]
    net = NetworkModel(alpha_s=(a.delay_ms * 1e3 + BASE_LATENCY_US) * 1e-6, beta_Bps=a.rate_mbit * 1e6 / 8)
    order = sorted(range(len(params)), key=lambda i: (prof["ready_s"][i], -i))
    sizes = [p.numel() for p in params]
    pieces = [Piece(b, 0.0, [net.allreduce(4 * sum(sizes[i] for i in b), a.world)])
              for b in buckets(sizes, order, 4, 25.0, 1.0)]
    overlap = schedule(prof["forward_s"], prof["backward_s"], prof["ready_s"], prof["optimizer_s"], pieces)
    serial = prof["forward_s"] + prof["backward_s"] + prof["optimizer_s"] + sum(p.messages[0] for p in pieces)
    measured = max(r[0] for r in _gather(rows, a.world))
    if a.rank == 0:
        Path(a.json).write_text(json.dumps([{
            "kind": "ddp_step", "bytes": 4 * sum(sizes), "reps": a.reps, "measured_s": measured,
            "predicted_ideal_s": overlap.step_s, "ratio_ideal": measured / overlap.step_s, "measured_min_s": min(times),
            "measured_max_s": max(times),
            "detail": f"torch DDP {a.model}, {len(pieces)} buckets; serial prediction {serial:.4f} s "
                      f"(ratio {measured / serial:.3f}); compute {prof['forward_s'] + prof['backward_s']:.4f} s"}]))
    dist.barrier()
    dist.destroy_process_group()


def _gather(rows: list[list[float]], world: int) -> list[list[float]]:
    import torch
    import torch.distributed as dist
    t = torch.tensor(rows[0], dtype=torch.float64)
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


# --- the host side ----------------------------------------------------------------------------
def _wait(procs: list[subprocess.Popen], timeout_s: float, what: str) -> None:
    """Wait for every process; on a failure or timeout kill the rest and say which rank failed."""
    end = time.monotonic() + timeout_s
    for rank, p in enumerate(procs):
        try:
            rc = p.wait(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = None
        if rc != 0:
            for q in procs:
                q.kill()
            err = (p.stderr.read().decode(errors="replace")[-2000:] if p.stderr and rc is not None else "")
            raise SystemExit(f"error: {what}: rank {rank} " + (f"exited with {rc}:\n{err}" if rc is not None
                                                             else f"did not finish within {timeout_s:.0f} s"))


def _env(rank: int, world: int, master: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": master, "MASTER_PORT": str(PORT),
            "OMP_NUM_THREADS": "1"}


def collectives(n: int, rate: float, delay: float, args, mode: str = "_worker") -> list[dict]:
    """Rows of the collective benchmark (or, mode `_ddp`, of real DDP steps) on a fresh shaped
    network of n hosts; collective rows get the ideal model's prediction."""
    with Netns(n, rate, delay) as net, tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        argv = [sys.executable, str(Path(__file__).resolve()), mode, "--model", args.ddp_model, "--world", str(n), "--master", net.addr(0),
                "--rate-mbit", str(rate), "--delay-ms", str(delay), "--reps", str(args.reps),
                "--max-s", str(args.max_s), "--json", out, "--sizes", *map(str, args.sizes)]
        procs = [net.popen(i, [*argv, "--rank", str(i)], env=_env(i, n, net.addr(0)), stderr=subprocess.PIPE)
                 for i in range(n)]
        _wait(procs, args.timeout_s, f"{mode[1:]}, {n} workers at {rate:g} Mbit/s")
        rows = json.loads(Path(out).read_text())
    rows = [{**r, "workers": n, "shared_cores": HOST_CORES, "rate_mbit": rate, "delay_ms": delay} for r in rows]
    if mode == "_worker":
        prof = _committed(args.profile)
        for r in rows:
            b = sent_bytes(r["kind"], r["bytes"])
            r["predicted_ideal_s"] = _model(r, None).predict(r["kind"], b, n)
            r["ratio_ideal"] = r["measured_s"] / r["predicted_ideal_s"]
            if prof is not None:
                r["predicted_fitted_s"] = _model(r, prof).predict(r["kind"], b, n)
                r["ratio_fitted"] = r["measured_s"] / r["predicted_fitted_s"]
    return rows


def _committed(path: str):
    """The profile at `path` (what --fit last wrote), or None before the first fit."""
    from gravac.cluster.netmodel import load_profile
    return load_profile(str(path)) if Path(path).is_file() else None


def sent_bytes(kind: str, nbytes: int) -> int:
    """The bytes the worker really puts in: float32 tensors (all-reduce, broadcast) and 8-byte
    sparse entries (float32 value + int32 index) round `nbytes` down to whole elements."""
    unit = {"allreduce": 4, "broadcast": 4, "sparse_allgather": 8}.get(kind, 1)
    return max(1, int(nbytes) // unit) * unit


def _cores(row: dict) -> int:
    """The cores the row's workers shared (rows written before the column: this machine's)."""
    return int(row.get("shared_cores") or HOST_CORES)


def _model(row: dict, profile):
    """The network model of a row's setting: its rate, the presets' latency plus any delay, the
    link's tbf bucket (bytes that pass at once) and the cores the workers shared (the last two
    count only with a profile: the ideal model ignores them)."""
    from gravac.cluster.netmodel import NetworkModel
    return NetworkModel(alpha_s=(float(row["delay_ms"]) * 1e3 + BASE_LATENCY_US) * 1e-6,
                        beta_Bps=float(row["rate_mbit"]) * 1e6 / 8, profile=profile,
                        burst_bytes=burst_bytes(float(row["rate_mbit"])), shared_cores=_cores(row))


def steps(n: int, rate: float, delay: float, args) -> list[dict]:
    """Rows of whole training steps (one per arm): measured step wall time against the serial
    prediction from the same step's measured compute/compression/optimizer + modelled comm. Each
    arm runs under the ideal model and, once --fit has written a profile, again under it (the
    runs do the same work; the model only changes what is predicted)."""
    rows = []
    prof = Path(args.profile)
    models = ["ideal"] + ([str(prof)] if prof.is_file() else [])
    for arm in args.step_arms:
        recs = {model: step_records(n, rate, delay, [f"experiment={args.step_experiment}", *STEP_ARMS[arm]], model,
                                    args.steps, args.timeout_s, what=arm)
                for model in models}
        rows.append(_step_row(recs, arm, n, rate, delay))
    return rows


def step_records(n: int, rate: float, delay: float, overrides: list[str], model: str, steps: int, timeout_s: float,
                 skip: int = 3, latency_us: float | None = None, what: str = "") -> list[dict]:
    """steps.jsonl's records of one real cluster=ddp run of bench/run.py with `overrides` (the
    experiment, the method), n workers in namespaces over tbf links at `rate` Mbit/s, collectives
    modelled by `model`; the first `skip` records (warm-up, calibration) dropped. Also used by
    `bench/utility.py --validate`."""
    latency_us = delay * 1e3 + BASE_LATENCY_US if latency_us is None else latency_us
    with Netns(n, rate, delay) as net, tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, str(ROOT / "bench" / "run.py"), *overrides, "cluster=ddp", f"cluster.workers={n}",
                "cluster.threads=1", f"train.steps={steps}", "train.eval_every=100000", "logger.progress=false",
                "experiment.name=netval", f"experiment.results_root={tmp}", "network.name=netval",
                f"network.bandwidth_gbps={rate / 1000}", f"network.latency_us={latency_us}",
                "network.overlap=false", f"network.collectives={model}", f"network.shared_cores={HOST_CORES}"]
        procs = [net.popen(i, argv, env=_env(i, n, net.addr(0)), stderr=subprocess.PIPE,
                           stdout=subprocess.DEVNULL) for i in range(n)]
        _wait(procs, timeout_s, f"{what or ' '.join(overrides)} steps, {n} workers at {rate:g} Mbit/s, "
                                f"collectives {model}")
        (run_dir,) = list(Path(tmp, "netval").glob("*-*"))
        return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()][skip:]


def _step_row(recs: dict, arm: str, n: int, rate: float, delay: float) -> dict:
    """Medians over steps (the first three dropped: warm-up, calibration): measured wall time (over
    every run) against the prediction of each model's run."""
    every = [r for rs in recs.values() for r in rs]
    wall = [r["step_wall_s"] for r in every]
    med = statistics.median(wall)
    row = {"kind": f"step_{arm}", "workers": n, "rate_mbit": rate, "delay_ms": delay,
           "bytes": round(statistics.median(r["wire_bytes"] for r in every)), "reps": len(every),
           "measured_s": med, "measured_min_s": min(wall), "measured_max_s": max(wall)}
    detail = []
    for model, rs in recs.items():
        pred = statistics.median(r["compute_s"] + r["compress_s"] + r["optimizer_s"] + r["comm_model_s"] for r in rs)
        col = "ideal" if model == "ideal" else "fitted"
        row[f"predicted_{col}_s"], row[f"ratio_{col}"] = pred, med / pred
        detail.append(f"{col}: comm measured {statistics.median(r['comm_s'] for r in rs):.4f} s vs modelled "
                      f"{statistics.median(r['comm_model_s'] for r in rs):.4f} s, step {statistics.median(r['step_wall_s'] for r in rs):.4f} s")
    row["detail"] = "; ".join(detail) + f"; mean CF {statistics.mean(r['cf'] for r in every):.1f}"
    return row


# --- fitting a collective profile (--fit) ----------------------------------------------------
PROFILE = ROOT / "results" / "reference" / "collectives" / "gloo-cpu.json"


def _measurements(rows: list[dict]):
    from gravac.cluster.netmodel import COLLECTIVES, Measurement
    out = []
    for r in rows:
        if r["kind"] in COLLECTIVES and float(r["delay_ms"]) == 0:
            m = _model(r, None)
            out.append(Measurement(r["kind"], sent_bytes(r["kind"], r["bytes"]), int(r["workers"]), m.alpha_s,
                                   m.beta_Bps, float(r["measured_s"]), burst_bytes(float(r["rate_mbit"])), _cores(r)))
    return out


def fit(rows: list[dict], profile_path: Path) -> list[dict]:
    """Fit the gloo profile to every collective row and write it; then, for each rate, fit again
    without that rate's rows and predict them (held out). Returns the rows with the fitted and
    held-out predictions filled in."""
    from gravac.cluster.netmodel import COLLECTIVES, fit_profile
    from gravac.core.io import atomic_write
    mine = [r for r in rows if r["kind"] in COLLECTIVES and float(r["delay_ms"]) == 0]
    if not mine:
        raise SystemExit(f"error: --fit: no collective rows to fit in {profile_path}: run the collectives first")
    rates = sorted({float(r["rate_mbit"]) for r in mine})
    workers = sorted({int(r["workers"]) for r in mine})
    note = (f"gloo (torch {_torch_version()}) on CPU over veth + bridge shaped by tc tbf, fitted by "
            f"`python bench/netval.py --fit` to {len(mine)} medians: N = {', '.join(map(str, workers))}, "
            f"{', '.join(f'{r:g}' for r in rates)} Mbit/s, {min(int(r['bytes']) for r in mine)} to "
            f"{max(int(r['bytes']) for r in mine)} bytes; the workers shared this machine's {HOST_CORES} cores "
            f"(crowd_step_s: see docs/DEFINITIONS.md), each rep after tbf's bucket refilled; load average "
            f"{os.getloadavg()[0]:.2f} at the fit")
    prof = fit_profile(_measurements(mine), "gloo-cpu", note=note)
    atomic_write(profile_path, json.dumps(prof.to_json(), indent=1) + "\n")
    held = {rate: fit_profile(_measurements([r for r in mine if float(r["rate_mbit"]) != rate]), "heldout")
            for rate in rates} if len(rates) > 1 else {}
    for r in mine:
        b, n = sent_bytes(r["kind"], r["bytes"]), int(r["workers"])
        r["predicted_fitted_s"] = _model(r, prof).predict(r["kind"], b, n)
        r["ratio_fitted"] = float(r["measured_s"]) / r["predicted_fitted_s"]
        if held:
            r["predicted_heldout_s"] = _model(r, held[float(r["rate_mbit"])]).predict(r["kind"], b, n)
            r["ratio_heldout"] = float(r["measured_s"]) / r["predicted_heldout_s"]
    return rows


def _torch_version() -> str:
    import torch
    return torch.__version__


def report(rows: list[dict]) -> str:
    """Held-out error per collective, N and rate: MB-sized messages in percent, small ones in
    percent and milliseconds (the targets: 15%; 30% or 1 ms)."""
    from gravac.cluster.netmodel import COLLECTIVES
    lines = ["held-out (each rate predicted by the profile fitted to the other rates): measured / predicted"]
    for kind in COLLECTIVES:
        for n in sorted({int(r["workers"]) for r in rows if r["kind"] == kind}):
            for rate in sorted({float(r["rate_mbit"]) for r in rows if r["kind"] == kind}):
                pts = [r for r in rows if r["kind"] == kind and int(r["workers"]) == n
                       and float(r["rate_mbit"]) == rate and r.get("ratio_heldout") not in (None, "")]
                if not pts:
                    continue
                cells = []
                for r in sorted(pts, key=lambda r: int(r["bytes"])):
                    ratio = float(r["ratio_heldout"])
                    err_ms = (float(r["measured_s"]) - float(r["predicted_heldout_s"])) * 1e3
                    cells.append(f"{_size(int(r['bytes']))} {ratio:.2f}" + ("" if int(r["bytes"]) >= 1 << 20 else
                                                                            f" ({err_ms:+.1f} ms)"))
                lines.append(f"  {kind:16s} N={n} {rate:5g} Mbit/s: " + ", ".join(cells))
    done = [r for r in rows if r.get("ratio_heldout") not in (None, "")]
    for col in ("heldout", "ideal"):
        big = [r for r in done if int(r["bytes"]) >= 1 << 20]
        small = [r for r in done if int(r["bytes"]) < 1 << 20]
        pred = lambda r: float(r[f"predicted_{col}_s"])  # noqa: E731
        ok_big = sum(abs(float(r["measured_s"]) / pred(r) - 1) <= 0.15 for r in big)
        ok_small = sum(abs(float(r["measured_s"]) / pred(r) - 1) <= 0.30 or abs(float(r["measured_s"]) - pred(r)) <= 1e-3
                       for r in small)
        lines.append(f"{'held out' if col == 'heldout' else 'ideal model'}: {ok_big} of {len(big)} collectives >= 1 MB "
                     f"within 15%, {ok_small} of {len(small)} smaller ones within 30% or 1 ms")
    return "\n".join(lines)


def _size(b: int) -> str:
    return f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB"


PARTS = ("collectives", "latency", "ddp", "steps")


def part_of(row: dict) -> str:
    kind = str(row["kind"])
    if kind.startswith("step_"):
        return "steps"
    if kind == "ddp_step":
        return "ddp"
    return "latency" if float(row["delay_ms"]) > 0 else "collectives"


def settings(args) -> list[tuple[str, int, float, float]]:
    """(part, workers, Mbit/s, delay ms) to run, in order."""
    if args.quick:
        return [("collectives", 2, 100.0, 0.0)]
    out = [("collectives", n, r, 0.0) for r in args.rates for n in args.workers]
    if args.delay_ms > 0:
        if has_netem():
            out.append(("latency", 4, args.rates[0], args.delay_ms))
        else:
            print("netval: latency setting skipped: this kernel has no netem qdisc (tc: 'Specified qdisc "
                  "kind is unknown')", flush=True)
    out += [("ddp", 2, r, 0.0) for r in args.rates]
    out += [("steps", n, args.rates[0], 0.0) for n in args.step_workers]
    return [s for s in out if s[0] in args.parts]


def kept_rows(args, out: Path, rerun: list[tuple] = ()) -> list[dict]:
    """Rows of an existing CSV that this sweep does not measure again: those of other parts, and of
    a rerun part those of other settings (workers, rate, delay; for steps, other arms), so that
    `--parts steps --step-workers 4` keeps the N = 2 steps measured before."""
    if args.quick or set(args.parts) == set(PARTS) or not out.is_file():
        return []
    again = {(what, n, float(rate), float(delay)) for what, n, rate, delay in rerun}

    def replaced(r: dict) -> bool:
        key = (part_of(r), int(r["workers"]), float(r["rate_mbit"]), float(r["delay_ms"]))
        return key in again and (key[0] != "steps" or r["kind"].removeprefix("step_") in args.step_arms)
    with open(out) as f:
        rows = [r for r in csv.DictReader(f) if part_of(r) not in args.parts or not replaced(r)]
    for r in rows:            # a CSV written before the fitted profiles named the ideal columns so
        for old, new in (("predicted_s", "predicted_ideal_s"), ("ratio", "ratio_ideal")):
            if old in r:
                r[new] = r.pop(old)
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    import io

    from gravac.core.io import atomic_write
    buf = io.StringIO()
    w = csv.DictWriter(buf, FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r.get(k, "")) for k in FIELDS})
    atomic_write(path, buf.getvalue())


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="run", choices=["run", "_worker", "_ddp"], help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="2 workers, 100 Mbit/s, sizes up to 4 MB, no steps")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS,
                   help="what to run; rows of the other parts already in --out are kept")
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--rates", type=float, nargs="+", default=[100.0, 300.0, 1000.0], help="Mbit/s")
    p.add_argument("--delay-ms", type=float, default=2.0, help="one-way delay of the latency setting")
    p.add_argument("--sizes", type=int, nargs="+",
                   default=[4096, 65536, 262144, 1 << 20, 4 << 20, 16 << 20], help="bytes")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--max-s", type=float, default=20.0, help="skip sizes predicted to take longer")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--step-experiment", default="mini_vgg")
    p.add_argument("--step-arms", nargs="+", default=list(STEP_ARMS), choices=list(STEP_ARMS))
    p.add_argument("--step-workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--ddp-model", default="vgg_mini", help="model of the real-DDP overlap check")
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--out", default=str(ROOT / "results" / "netval.csv"))
    p.add_argument("--figure", default=None, help="default: the CSV's path with .png")
    p.add_argument("--fit", action="store_true",
                   help="measure nothing: fit the collective profile to --out's collective rows, write it to "
                        "--profile, and add the fitted and held-out predictions to --out")
    p.add_argument("--profile", default=str(PROFILE), help="where --fit writes the profile")
    # worker-only
    for name, typ in (("--rank", int), ("--world", int), ("--master", str), ("--rate-mbit", float), ("--json", str), ("--model", str)):
        p.add_argument(name, type=typ, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.sizes = [s for s in a.sizes if s <= 4 << 20]
    return a


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    a = parse(argv)
    if a.mode != "run":
        (worker if a.mode == "_worker" else ddp_worker)(a)
        return 0
    if a.fit:
        out = Path(a.out)
        if not out.is_file():
            print(f"error: --fit: {out} not found: run `python bench/netval.py` first", file=sys.stderr)
            return 2
        rows = fit(kept_rows(argparse.Namespace(quick=False, parts=[]), out), Path(a.profile))
        write_csv(rows, out)
        print(report(rows))
        from plots.netval import draw
        draw(rows, Path(a.figure) if a.figure else out.with_suffix(".png"))
        print(f"wrote {a.profile} and {out}")
        return 0
    why = missing()
    if why:
        print(f"netval: skipped: {why}")
        return 0
    signal.signal(signal.SIGTERM, _interrupt)  # namespaces are deleted by the context managers
    out, t0 = Path(a.out), time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    todo = settings(a)
    rows = kept_rows(a, out, todo)
    try:
        for what, n, rate, delay in todo:
            t = time.monotonic()
            if what == "steps":
                rows += steps(n, rate, delay, a)
            else:
                rows += collectives(n, rate, delay, a, "_ddp" if what == "ddp" else "_worker")
            write_csv(rows, out)      # after every setting: an interrupted sweep keeps what it measured
            print(f"{what}: {n} workers, {rate:g} Mbit/s, delay {delay:g} ms: {time.monotonic() - t:.0f} s", flush=True)
    except KeyboardInterrupt:
        print(f"netval: interrupted; namespaces deleted; {out} holds the {len(rows)} rows of the finished settings",
              file=sys.stderr)
        return 130
    from plots.netval import draw
    fig = Path(a.figure) if a.figure else out.with_suffix(".png")
    draw(rows, fig)
    print(f"wrote {out} and {fig} ({len(rows)} rows, {time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
