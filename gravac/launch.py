"""Start a run: the simulated cluster in this process, spawned torch.distributed workers, or
the current process as one rank of a torchrun job. Rank 0 alone creates and writes the results.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import traceback
from datetime import timedelta

import torch

from gravac.comm import DistGroup, SimGroup
from gravac.errors import UserError, WorkerFailed
from gravac.netmodel import NetworkModel
from gravac.results import NullWriter, RunWriter, atomic_write, make_run_dir
from gravac.schema import RunConfig
from gravac.track import Tracker


def _tag(cfg: RunConfig) -> str:
    """Short human-readable part of a run folder name."""
    tag = f"{cfg.model.name}-{cfg.method.name}"
    if cfg.compressor.name != "none":
        tag += f"-{cfg.compressor.name}"
        if cfg.method.name == "static":
            tag += f"{cfg.compressor.cf:g}"
    return f"{tag}-n{cfg.cluster.workers}-s{cfg.train.seed}"


def _device(cfg: RunConfig, local_rank: int) -> torch.device:
    if cfg.cluster.device == "cuda":
        if not torch.cuda.is_available():
            raise UserError("cluster.device=cuda but no CUDA device is visible; use cluster.device=cpu")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _run(cfg: RunConfig, group, device, run_dir: str | None) -> dict:
    """Train with this process's workers; only the main process writes and prints."""
    from gravac.train import train
    config = dataclasses.asdict(cfg)
    writer = RunWriter(run_dir, config) if group.is_main else NullWriter()

    def tracker_factory(total, dir_):
        return Tracker(cfg.logger, total, config, dir_, enabled=group.is_main)

    say = print if group.is_main else (lambda *a, **k: None)
    if group.is_main:
        say(f"results: {run_dir}")
    try:
        summary = train(cfg, group, device, writer, tracker_factory, say=say)
    finally:
        writer.close()
    if group.is_main:
        _report(summary, run_dir)
    return summary


def _report(s: dict, run_dir: str) -> None:
    """A few closing lines: where the results are and the headline numbers."""
    fmt = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
    print(f"done: {s['steps']} steps, final {s['metric']} {fmt(s['final_metric'])} (best {fmt(s['best_metric'])}), "
          f"floats sent/worker {s['floats_sent']:.4g}, wire {s['wire_bytes'] / 1e6:.4g} MB/worker, "
          f"modelled {s['model_s']:.1f} s, wall {s['wall_s']:.1f} s")
    print(f"results: {run_dir}")


def launch(cfg: RunConfig) -> dict | None:
    """Run `cfg` on its backend; returns the summary in the process that wrote it."""
    net = NetworkModel.from_cfg(cfg.network)
    if cfg.cluster.backend == "sim":
        torch.set_num_threads(cfg.cluster.threads or os.cpu_count() or 1)
        run_dir = make_run_dir(cfg.experiment.results_root, cfg.experiment.name, cfg.experiment.run_id, _tag(cfg))
        return _run(cfg, SimGroup(cfg.cluster.workers, net), _device(cfg, 0), run_dir)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        return _torchrun_worker(cfg)
    return _spawn(cfg)


def _init_dist(cfg: RunConfig, init_method: str | None, rank: int | None, world: int | None) -> None:
    import torch.distributed as dist
    backend = cfg.cluster.dist_backend
    if backend == "auto":
        backend = "nccl" if cfg.cluster.device == "cuda" else "gloo"
    kwargs = {"timeout": timedelta(seconds=cfg.cluster.timeout_s)}
    if init_method is not None:
        kwargs.update(init_method=init_method, rank=rank, world_size=world)
    dist.init_process_group(backend, **kwargs)


def _torchrun_worker(cfg: RunConfig) -> dict | None:
    """This process is one rank of a torchrun job: rank 0 names the folder and tells the others."""
    import torch.distributed as dist
    _init_dist(cfg, None, None, None)
    world = dist.get_world_size()
    torch.set_num_threads(cfg.cluster.threads or max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, workers=world))
    run_dir = None
    if dist.get_rank() == 0:
        run_dir = make_run_dir(cfg.experiment.results_root, cfg.experiment.name, cfg.experiment.run_id, _tag(cfg))
    box = [run_dir]
    dist.broadcast_object_list(box, src=0)
    device = _device(cfg, int(os.environ.get("LOCAL_RANK", 0)))
    group = DistGroup(NetworkModel.from_cfg(cfg.network), device)
    try:
        return _run(cfg, group, device, box[0])
    finally:
        dist.destroy_process_group()


def worker_main(rank: int, cfg: RunConfig, init_method: str, run_dir: str) -> None:
    """Entry point of a spawned worker process (must live in an importable module)."""
    import torch.distributed as dist
    world = cfg.cluster.workers
    torch.set_num_threads(cfg.cluster.threads or max(1, (os.cpu_count() or 1) // world))
    try:
        _init_dist(cfg, init_method, rank, world)
        device = _device(cfg, rank)
        _run(cfg, DistGroup(NetworkModel.from_cfg(cfg.network), device), device, run_dir)
        dist.destroy_process_group()
    except UserError as e:
        print(f"error: worker rank {rank}: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:
        print(f"worker rank {rank} crashed:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        sys.exit(1)


def _spawn(cfg: RunConfig) -> None:
    """Start `cluster.workers` processes rendezvousing through a file (no port to collide on)."""
    import torch.multiprocessing as mp
    run_dir = make_run_dir(cfg.experiment.results_root, cfg.experiment.name, cfg.experiment.run_id, _tag(cfg))
    with tempfile.TemporaryDirectory(prefix="gravac-rdzv-") as tmp:
        init = f"file://{os.path.join(tmp, 'store')}"
        ctx = mp.start_processes(worker_main, args=(cfg, init, run_dir), nprocs=cfg.cluster.workers,
                                 join=False, start_method="spawn")
        try:
            while not ctx.join():
                pass
        except mp.ProcessExitedException as e:
            _mark_failed(run_dir, f"worker rank {e.error_index} exited with code {e.exit_code}")
            raise WorkerFailed(f"worker rank {e.error_index} failed (exit code {e.exit_code}); "
                               f"its message is above; results so far are in {run_dir}") from None
        except mp.ProcessRaisedException as e:  # pragma: no cover - workers catch their exceptions
            _mark_failed(run_dir, f"worker rank {e.error_index} raised")
            raise WorkerFailed(f"worker rank {e.error_index} raised: {str(e).strip().splitlines()[-1]}") from None


def _mark_failed(run_dir: str, reason: str) -> None:
    """Record in summary.json that a peer failed (rank 0 may have been killed mid-write)."""
    path = os.path.join(run_dir, "summary.json")
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, json.JSONDecodeError):
        summary = {}
    if summary.get("status") in (None, "running"):
        summary.update(status="failed", error=reason)
        atomic_write(path, json.dumps(summary, indent=2) + "\n")
