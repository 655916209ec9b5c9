"""Overhead of our training loop, measured side by side in one run.

1. ddp: our dense loop (bench/run.py cluster=ddp, 2 processes) against a minimal hand-written
   loop using torch's DistributedDataParallel with the same model, data, batch and backend.
2. sim: our simulated cluster with N virtual workers against N x the step of one worker.
3. hooks (`--part hooks`): DistributedDataParallel with this project's comm hooks (gravac/hooks/hooks.py:
   Top-k 100x with error feedback, GraVAC) against torch's `allreduce_hook` and PowerSGD hook
   (rank 1, compressing from the 3rd step), 2 gloo processes, one model and data; the hooks take
   turns round by round in the same processes, so machine noise hits all alike. The whole model
   is one DDP bucket (`--hook-bucket-mb`): torch's PowerSGD hook issues collectives from Future
   callbacks, and with two buckets on gloo they were issued in different orders on the two ranks
   here (gloo aborted: "Received data size doesn't match expected size").

Step time = median of the wall-clock differences between consecutive steps (evaluation steps
excluded), after a warm-up. Prints the ratios; the goals are ddp <= 1.05 and sim <= 1.10.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _common(args) -> list[str]:
    return [f"model={args.model}", f"train.batch_size={args.batch}", "dataset=synthetic",
            f"dataset.image_size={args.image_size}", "train.eval_every=100000", "logger.progress=false"]


def _our_step_time(args, extra: list[str], steps: int) -> float:
    """Median step time of a real run of bench/run.py."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(ROOT / "bench" / "run.py"), *_common(args), f"train.steps={steps}",
               f"experiment.results_root={tmp}", *extra]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        (steps_file,) = Path(tmp).glob("*/*/steps.jsonl")
        t = [json.loads(line)["time_s"] for line in steps_file.read_text().splitlines()]
    diffs = [b - a for a, b in zip(t, t[1:])][args.warmup:]
    return statistics.median(diffs)


def _ddp_setup(rank: int, world: int, init: str, args):
    """Join the gloo group and build the benchmark's synthetic dataset config: (cfg, dataset)."""
    import torch
    import torch.distributed as dist

    from gravac.config.compose import base_node, build_config
    from gravac.data import load_dataset

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    node = base_node()
    node["dataset"].update(name="synthetic", image_size=args.image_size, root="./data")
    node["model"].update(name=args.model)
    cfg = build_config(node)
    return cfg, load_dataset(cfg.dataset)


def _train_steps(ddp, opt, loader, steps: int, after=None) -> list[float]:
    """`steps` plain DDP training steps; the clock after each (and after(), when given)."""
    import torch.nn.functional as F
    times = []
    for _ in range(steps):
        x, y = loader.next_batch()
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        times.append(time.perf_counter())
        if after:
            after()
    return times


def _spawn2(worker, args, name: str):
    """Run worker(rank, 2, init, args, out) in 2 spawned gloo processes; what rank 0 wrote to `out`."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, name)
        mp.start_processes(worker, args=(2, f"file://{tmp}/store", args, out), nprocs=2, start_method="spawn")
        return json.loads(Path(out).read_text())


def _ddp_worker(rank: int, world: int, init: str, args, out: str) -> None:
    """A minimal DDP loop: the reference our ddp backend is compared with."""
    import torch
    import torch.distributed as dist

    from gravac.models import build_model

    cfg, ds = _ddp_setup(rank, world, init, args)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(build_model(cfg.model, ds.num_classes, ds.task))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    times = _train_steps(ddp, opt, ds.train_loader(rank, world, args.batch, 0), args.steps)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def _ddp_step_time(args) -> float:
    t = _spawn2(_ddp_worker, args, "times.json")
    diffs = [b - a for a, b in zip(t, t[1:])][args.warmup:]
    return statistics.median(diffs)


HOOKS = ("allreduce", "powersgd", "topk100", "gravac")


def _make_hook(name: str, args):
    """(state, hook) of one compared hook (None: DDP's default process group)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    from gravac.hooks import GraVACState, SparseState, gravac_hook, sparse_hook
    if name == "allreduce":
        return None, default_hooks.allreduce_hook
    if name == "powersgd":
        return powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2), \
            powerSGD_hook.powerSGD_hook
    if name == "topk100":
        return SparseState(None, compressor="topk", cf=100), sparse_hook
    return GraVACState(None, compressor="topk", batch_size=args.batch, window=10), gravac_hook


def _hooks_worker(rank: int, world: int, init: str, args, out: str) -> None:
    """Every hook in turn on a fresh DDP model (same weights, same batches), `rounds` times."""
    import torch
    import torch.distributed as dist

    from gravac.models import build_model

    cfg, ds = _ddp_setup(rank, world, init, args)
    res = {name: {"times": [], "cf": []} for name in HOOKS}
    for _ in range(args.rounds):
        for name in HOOKS:
            torch.manual_seed(0)
            ddp = torch.nn.parallel.DistributedDataParallel(build_model(cfg.model, ds.num_classes, ds.task),
                                                            bucket_cap_mb=args.hook_bucket_mb)
            state, hook = _make_hook(name, args)
            ddp.register_comm_hook(state, hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
            cfs = res[name]["cf"]
            t = _train_steps(ddp, opt, ds.train_loader(rank, world, args.batch, 0), args.steps,
                             after=(lambda st=state, c=cfs: c.append(st.last["cf"])) if hasattr(state, "last") else None)
            res[name]["times"].append(statistics.median([b - a for a, b in zip(t, t[1:])][args.warmup:]))
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def hooks_comparison(args) -> list[str]:
    """Per-step times of DDP with each hook, and their ratios to allreduce_hook."""
    res = _spawn2(_hooks_worker, args, "hooks.json")
    base = min(res["allreduce"]["times"])
    lines = [f"hooks, DDP, 2 gloo processes, {args.model}, batch {args.batch}, buckets of {args.hook_bucket_mb:g} MB, "
             f"{args.steps} steps x {args.rounds} rounds (best round's median step):"]
    for name in HOOKS:
        t = min(res[name]["times"])
        cf = res[name]["cf"]
        what = f", mean CF {statistics.mean(cf):.1f}x" if cf else ""
        lines.append(f"  {name:10s} {t * 1e3:8.1f} ms/step, ratio to allreduce_hook {t / base:.3f}{what}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet_mini")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--sim-workers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2, help="alternate the compared loops this many times")
    p.add_argument("--part", choices=("all", "loop", "hooks"), default="all",
                   help="loop: our loop vs DDP and sim; hooks: DDP comm hooks; all: both")
    p.add_argument("--hook-bucket-mb", type=float, default=100.0,
                   help="DDP bucket size of the hooks part (default: the whole model in one bucket)")
    args = p.parse_args(argv)
    if args.part in ("all", "hooks"):
        print("\n".join(hooks_comparison(args)))
    if args.part == "hooks":
        return 0

    ours, ref = [], []
    for _ in range(args.rounds):  # alternate, so machine noise hits both sides alike
        ref.append(_ddp_step_time(args))
        ours.append(_our_step_time(args, ["cluster=ddp", "cluster.workers=2"], args.steps))
    o, r = min(ours), min(ref)
    print(f"ddp, 2 processes, {args.model}, batch {args.batch}: ours {o * 1e3:.1f} ms/step, "
          f"torch DDP {r * 1e3:.1f} ms/step, ratio {o / r:.3f} (goal <= 1.05)")

    n = args.sim_workers
    one = min(_our_step_time(args, ["cluster=sim", "cluster.workers=1"], args.steps) for _ in range(args.rounds))
    many = min(_our_step_time(args, ["cluster=sim", f"cluster.workers={n}"], args.steps) for _ in range(args.rounds))
    print(f"sim: 1 worker {one * 1e3:.1f} ms/step, {n} workers {many * 1e3:.1f} ms/step, "
          f"ratio to {n} x one {many / (n * one):.3f} (goal <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
