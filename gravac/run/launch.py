"""Start a run: the simulated cluster in this process, spawned torch.distributed workers, or
the current process as one rank of a torchrun job. Rank 0 alone creates and writes the results.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from datetime import timedelta

import torch

from gravac.cluster.comm import DistGroup, SimGroup
from gravac.config.compose import saved_config
from gravac.core.errors import Interrupted, UserError, WorkerFailed
from gravac.loop.heartbeat import silent_rank
from gravac.cluster.netmodel import NetworkModel
from gravac.core.io import atomic_write, run_path
from gravac.loop.results import NullWriter, RunLock, RunWriter, make_run_dir
from gravac.core.schema import RunConfig
from gravac.cluster import numerics
from gravac.loop.track import Tracker
from gravac.run.outcome import (_mark_failed, check_resume, command_line, discard_unstarted,  # noqa: F401
                                 resume_command, settle)


def _tag(cfg: RunConfig) -> str:
    """Short human-readable part of a run folder name."""
    tag = f"{cfg.model.name}-{cfg.method.name}"
    if cfg.compressor.name != "none":
        tag += f"-{cfg.compressor.name}"
        if "compressor.cf" not in saved_config(cfg)["setting"]["ignores"]:
            tag += f"{cfg.compressor.cf:g}"
    return f"{tag}-n{cfg.cluster.workers}-s{cfg.train.seed}"


def _device(cfg: RunConfig, local_rank: int) -> torch.device:
    if cfg.cluster.device == "cuda":
        if not torch.cuda.is_available():
            raise UserError("cluster.device=cuda but no CUDA device is visible; use cluster.device=cpu")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _run(cfg: RunConfig, group, device, run_dir: str | None, command: str = "") -> dict:
    """Train with this process's workers; only the main process writes and prints."""
    from gravac.loop.checkpoint import Checkpointer
    from gravac.loop.train import train
    config = saved_config(cfg)
    writer = RunWriter(run_dir, config) if group.is_main else NullWriter()

    def tracker_factory(total, dir_):
        return Tracker(cfg.logger, total, config, dir_, enabled=group.is_main)

    say = print if group.is_main else (lambda *a, **k: None)
    try:
        if group.is_main and not cfg.experiment.resume:
            atomic_write(run_path(run_dir, "command.txt"), command + "\n")
        resume_cmd = resume_command(command, run_dir)
        say(f"results: {run_dir}")
        summary = train(cfg, group, device, writer, tracker_factory, say=say,
                        ckpt=Checkpointer(run_dir, group), resume_cmd=resume_cmd)
    except KeyboardInterrupt:   # Ctrl-C before the first step (calibration, start-up): a stop, not a failure
        if not group.is_main:
            raise
        _, message, resume = settle(run_dir, "interrupted", "interrupted")
        raise Interrupted(message, resume) from None
    except BaseException as e:
        if group.is_main:  # failed before training started: say so in the folder, too
            _mark_failed(run_dir, str(e).splitlines()[0] if str(e) else type(e).__name__)
        raise
    finally:
        writer.close()
    if group.is_main:
        _report(summary, run_dir)
    return summary


def _modelled(s: dict) -> str:
    """The modelled time the tables use (overlapped with backward, unless network.overlap=false),
    then the other one in brackets when they differ."""
    over, serial = s.get("overlap_model_s"), s["model_s"]
    if over is None or f"{over:.1f}" == f"{serial:.1f}":
        return f"{serial:.1f} s"
    if (s.get("clock") or {}).get("overlap", True):
        return f"{over:.1f} s (serial {serial:.1f} s)"
    return f"{serial:.1f} s (overlapped {over:.1f} s)"


def _report(s: dict, run_dir: str) -> None:
    """A few closing lines: where the results are and the headline numbers."""
    fmt = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
    print(f"done: {s['steps']} steps, final {s['metric']} {fmt(s['final_metric'])} (best {fmt(s['best_metric'])}), "
          f"floats sent/worker {s['floats_sent']:.4g}, wire {s['wire_bytes'] / 1e6:.4g} MB/worker, "
          f"modelled {_modelled(s)}, wall {s['wall_s']:.1f} s")
    if s.get("explanation"):
        print(s["explanation"])
    print(f"results: {run_dir}")


def _new_run_dir(cfg: RunConfig, started=None) -> str:
    """The run's folder (made, or the one to resume); `started(folder)` is told of it."""
    if cfg.experiment.resume:
        run_dir = check_resume(cfg)
    else:
        run_dir = make_run_dir(cfg.experiment.results_root, cfg.experiment.name, cfg.experiment.run_id, _tag(cfg))
    if started is not None:
        started(run_dir)
    return run_dir


def _discard_if_unstarted(cfg: RunConfig, run_dir: str, err: Exception) -> bool:
    """After a failure, delete a new run's folder if the run recorded nothing in it
    (outcome.discard_unstarted); a resumed run's folder and a stopped run's are always kept."""
    if cfg.experiment.resume or isinstance(err, Interrupted):
        return False
    return discard_unstarted(run_dir)


def launch(cfg: RunConfig, overrides: list[str] | None = None, started=None) -> dict | None:
    """Run `cfg` on its backend; returns the summary in the process that wrote it.

    `overrides` are the command-line overrides that produced `cfg`; they make up the resume
    command a stopped run prints. `started(run folder)` is called once the folder exists (a
    sweep's job tells the sweep where to look if its process dies).
    """
    import gravac.loop.faults  # noqa: F401  (a malformed GRAVAC_FAULT is refused before any folder is made)
    command = command_line(overrides or [])
    net = NetworkModel.from_cfg(cfg.network)
    if cfg.cluster.backend == "sim":
        numerics.apply(cfg.cluster.numerics, cfg.cluster.threads)
        run_dir = _new_run_dir(cfg, started)
        lock = RunLock(run_dir)
        try:
            return _run(cfg, SimGroup(cfg.cluster.workers, net), _device(cfg, 0), run_dir, command)
        except Exception as e:
            _discard_if_unstarted(cfg, run_dir, e)
            raise
        finally:
            lock.release()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        return _torchrun_worker(cfg, command, started)
    check_process_count(cfg.cluster.workers)
    return _spawn(cfg, command, started)


PROCESS_GIB = 0.75   # measured: one cluster=ddp worker of mini_vgg on CIFAR-10 held 0.72 GiB resident


def check_process_count(n: int) -> None:
    """Refuse, before spawning, more worker processes than this machine's memory can hold."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    limit = max(1, int(0.8 * ram / PROCESS_GIB))
    if n > limit:
        raise UserError(f"cluster=ddp with {n} workers would start {n} processes here, about {n * PROCESS_GIB:.0f} "
                        f"GiB at {PROCESS_GIB} GiB each; this machine holds at most {limit} (80% of {ram:.0f} GiB "
                        "RAM): use fewer workers, cluster=sim, or torchrun across machines")


def _init_dist(cfg: RunConfig, init_method: str | None, rank: int | None, world: int | None) -> None:
    import torch.distributed as dist
    backend = cfg.cluster.dist_backend
    if backend == "auto":
        backend = "nccl" if cfg.cluster.device == "cuda" else "gloo"
    kwargs = {"timeout": timedelta(seconds=cfg.cluster.timeout_s)}
    if init_method is not None:
        kwargs.update(init_method=init_method, rank=rank, world_size=world)
    dist.init_process_group(backend, **kwargs)


def _torchrun_worker(cfg: RunConfig, command: str, started=None) -> dict | None:
    """This process is one rank of a torchrun job: rank 0 names the folder and tells the others."""
    import torch.distributed as dist
    _init_dist(cfg, None, None, None)
    world = dist.get_world_size()
    numerics.apply(cfg.cluster.numerics, cfg.cluster.threads, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, workers=world))
    run_dir, lock, problem = None, None, None
    if dist.get_rank() == 0:
        try:
            run_dir = _new_run_dir(cfg, started)
            lock = RunLock(run_dir)
        except UserError as e:
            problem = str(e)
    box = [run_dir, problem]
    dist.broadcast_object_list(box, src=0)
    if box[1]:       # every rank stops with rank 0's one line, none waits for a timeout
        _shutdown(dist)
        raise UserError(box[1])
    device = _device(cfg, int(os.environ.get("LOCAL_RANK", 0)))
    group = DistGroup(NetworkModel.from_cfg(cfg.network), device)
    try:
        summary = _run(cfg, group, device, box[0], command)
    except Exception as e:
        if run_dir is not None:
            _discard_if_unstarted(cfg, run_dir, e)
        raise
    finally:
        if lock is not None:
            lock.release()
    _shutdown(dist)
    return summary


def _shutdown(dist) -> None:
    """Leave the process group together: a rank tearing gloo down while a peer is still inside it
    has aborted the process ("terminate called without an active exception")."""
    dist.barrier()
    dist.destroy_process_group()


def loopback_interface() -> str:
    """This machine's loopback interface: `lo` on Linux, `lo0` on macOS and the BSDs."""
    names = {name for _, name in socket.if_nameindex()}
    return next((n for n in ("lo", "lo0") if n in names), "lo")


def worker_main(rank: int, cfg: RunConfig, init_method: str, run_dir: str, command: str) -> None:
    """Entry point of a spawned worker process (must live in an importable module). The workers
    of a one-machine run talk over loopback only: left to itself, gloo (and NCCL's bootstrap)
    listens on the address the host name resolves to, which may be reachable from the network."""
    import torch.distributed as dist
    os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = loopback_interface()
    world = cfg.cluster.workers
    stops = _note_stops()
    try:
        numerics.apply(cfg.cluster.numerics, cfg.cluster.threads, world)
        _init_dist(cfg, init_method, rank, world)
        device = _device(cfg, rank)
        _run(cfg, DistGroup(NetworkModel.from_cfg(cfg.network), device), device, run_dir, command)
        _shutdown(dist)
        code = 0
    except Interrupted:   # the launcher says so, once, from what rank 0 left in the summary
        code = 130
    except UserError as e:
        print(f"error: worker rank {rank}: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    except Exception as e:
        if stops:   # a Ctrl-C stops every rank; a peer that left first broke this rank's collective
            code = 130
        elif (where := _collective_call(e)) is not None:   # usually a peer died or hung: the launcher names it
            first = (str(e).strip().splitlines() or [""])[0]
            print(f"worker rank {rank}: a collective failed at {where} ({type(e).__name__}: {first})",
                  file=sys.stderr)
            code = PEER_LOST
        else:
            print(f"worker rank {rank} crashed:", file=sys.stderr)
            traceback.print_exc()
            code = 1
    _leave(code)


# A worker's exit code when its own collective failed (a peer closed the connection or timed out):
# a symptom, so the launcher names a peer that failed on its own account before such a rank.
PEER_LOST = 3
_DIST_DIR = os.path.join("torch", "distributed", "")


def _collective_call(e: BaseException) -> str | None:
    """Where the worker called the collective an exception surfaced in ("file:line in function",
    the last frame outside torch.distributed), or None when it was not raised inside
    torch.distributed (a gloo read error or timeout) but by the worker's own code. The one line a
    failed collective prints keeps this, so a misuse of the collective still shows its caller."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames or _DIST_DIR not in frames[-1].filename:
        return None
    own = [f for f in frames if _DIST_DIR not in f.filename]
    f = own[-1] if own else frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


def _note_stops() -> list:
    """Record SIGINT/SIGTERM (raised as KeyboardInterrupt, as by default) in the returned list, so
    a collective that fails because a peer already stopped for the same signal counts as the stop."""
    stops = []

    def handler(signum, frame):
        stops.append(signum)
        raise KeyboardInterrupt
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    return stops


def _leave(code: int) -> None:
    """Exit a worker without interpreter teardown, on every path: gloo's threads destroyed there
    abort the process ("terminate called without an active exception", exit -6), which a run that
    completed (rarely) and a Ctrl-C during start-up (often, with the store half built) both hit."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _spawn(cfg: RunConfig, command: str, started=None) -> None:
    """Start `cluster.workers` processes rendezvousing through a file (no port to collide on)."""
    run_dir = _new_run_dir(cfg, started)
    lock = RunLock(run_dir)
    try:
        _spawn_into(cfg, command, run_dir)
    except WorkerFailed as e:
        if not _discard_if_unstarted(cfg, run_dir, e):
            raise
        # the workers printed why; the folder this line pointed to is gone
        raise WorkerFailed(f"{e.why}; the run failed before its first step, so no run folder was kept") from None
    finally:
        lock.release()


def _spawn_into(cfg: RunConfig, command: str, run_dir: str) -> None:
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="gravac-rdzv-") as tmp:
        init = f"file://{os.path.join(tmp, 'store')}"
        os.environ["GRAVAC_HEARTBEAT_DIR"] = tmp      # inherited by the workers (gravac/loop/heartbeat.py)
        try:
            ctx = mp.start_processes(worker_main, args=(cfg, init, run_dir, command), nprocs=cfg.cluster.workers,
                                     join=False, start_method="spawn")
        finally:
            os.environ.pop("GRAVAC_HEARTBEAT_DIR", None)

        def forward(signum, frame):   # a SIGTERM to the launcher stops the workers at a step boundary
            for p in ctx.processes:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGTERM)
        old = signal.signal(signal.SIGTERM, forward)
        try:
            failed = _join(ctx)
        finally:
            signal.signal(signal.SIGTERM, old)
        if failed is None:
            return
        rank, code, others = failed
        if code == 130:
            raise _interrupted(run_dir)
        silent = silent_rank(tmp, cfg.cluster.workers, rank)
        if silent is not None:
            why = (f"worker rank {silent[0]} stopped answering at step {max(0, silent[1]) // 2} (rank {rank} gave up "
                   f"waiting for it after cluster.timeout_s={cfg.cluster.timeout_s:g} s)")
        else:
            why = (f"worker rank {rank} was {_exit_text(code)} before it could say why" if code < 0 else
                   f"worker rank {rank} failed ({_exit_text(code)}); its message is above")
        if others:   # a peer that stopped as well (which of two went first is a guess from the poll order)
            why += "; also stopped: " + ", ".join(f"rank {i} ({_exit_text(c)})" for i, c in sorted(others.items()))
        # rank 0 writes the summary, and when a peer failed it holds only rank 0's broken collective
        _mark_failed(run_dir, why, diagnosis=silent is not None or rank != 0 or code < 0)
        raise WorkerFailed(f"{why}; results so far are in {run_dir}", why)


def _exit_text(code: int) -> str:
    """A worker's exit code in words: a negative one is the signal that killed it."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code == PEER_LOST:
        return f"exit code {code}: its collective failed"
    return "interrupted" if code == 130 else f"exit code {code}"


def _interrupted(run_dir: str) -> Interrupted:
    """The stop the workers agreed on, as rank 0 recorded it (step and resume command), or, when
    rank 0 stopped before it could say (start-up), where the run stands."""
    _, message, resume = settle(run_dir, "interrupted", "interrupted")
    return Interrupted(message or "interrupted", resume)


_PEER_GRACE_S = 2.0


def _join(ctx) -> tuple[int, int, dict[int, int]] | None:
    """Wait for the workers: None when all succeeded, else (rank, exit code) of the one to blame
    and {rank: exit code} of the others that had already stopped with an error, after killing the
    rest (torch's join would give a hung worker 30 s). Workers that stop with 130 (interrupted) are
    waited for: the others are checkpointing at the boundary. A rank whose collective failed
    (PEER_LOST) gets `_PEER_GRACE_S` for the peer that broke it to exit and be named instead."""
    procs = ctx.processes
    lost_since = None
    while True:
        try:
            codes = [p.exitcode for p in procs]
            if all(c == 0 for c in codes):
                return None
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if bad and all(c == PEER_LOST for _, c in bad) and None in codes:
                if lost_since is None:
                    lost_since = time.monotonic()
                if time.monotonic() - lost_since < _PEER_GRACE_S:
                    time.sleep(0.1)
                    continue
            if bad and (any(c != 130 for _, c in bad) or all(c is not None for c in codes)):
                # blame order: killed by a signal (it said nothing), failed on its own account,
                # failed in a collective (a symptom), interrupted; then the lowest rank
                first = min(bad, key=lambda ic: (ic[1] >= 0, ic[1] == 130, ic[1] == PEER_LOST, ic[0]))
                for p in procs:
                    if p.is_alive():
                        p.kill()
                for p in procs:
                    p.join(5)
                return first[0], first[1], {i: c for i, c in bad if i != first[0]}
            time.sleep(0.1)
        except KeyboardInterrupt:
            continue  # the workers got the signal too and stop together; their exit code tells
