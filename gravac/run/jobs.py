"""A sweep's jobs on this machine (hydra/launcher=joblib): `n_jobs` at a time, each in a fresh
process of its own process group; and what any job of a sweep came to (Outcome).

joblib's pool (loky) kills every worker when one dies, so one job killed by the OOM killer (or
kill -9) failed every job the pool held, queued ones included. Here a job that dies fails alone:
its run folder is made to say so (gravac.run.outcome.settle), and the other jobs go on. Only the
submitting process hears the terminal's Ctrl-C (the jobs are in their own process groups): a first
signal writes the sweep's stop file, which running jobs read at their next step; a second one
(`aborting()`) kills the running jobs, whose run folders then say where they stopped.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

_PIPE = None          # in a job's process: where it tells the sweep about its run folder


@dataclass
class Outcome:
    """What one job of a sweep came to, under any launcher: completed, failed, interrupted or not
    started (the sweep was stopped first); `message` is the error, or the stop hint with its resume
    command; `resume` the command that continues its run, when it left a checkpoint. (Here, not in
    gravac.run.sweep, so that a job's process can send it back without importing torch first.)"""
    status: str
    message: str = ""
    resume: str = ""


def tell_run_dir(run_dir: str) -> None:
    """Called by a job once its run folder exists: the sweep reads it there if the job dies."""
    _tell("run_dir", run_dir)


def _tell(kind: str, value) -> None:
    if _PIPE is not None:
        try:
            _PIPE.send((kind, value))
        except OSError:   # the sweep itself is gone (killed): the run goes on, and its folder tells
            pass


def _child(conn, work, num: int, overrides: list[str]) -> None:
    """A job's process: leave the terminal's process group (the sweep alone takes its signals),
    drop a signal that came while it started, run the job and send back its Outcome. Its work
    arrives on the pipe `work` as JSON (plain data: the sweep's config and Hydra's search path,
    rebuilt here by `_hydra_job`), so nothing that reaches a job is unpickled by this code."""
    import json
    global _PIPE
    os.setpgid(0, 0)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    threading.Thread(target=stop_if_orphaned, args=(os.getppid(),), daemon=True).start()
    _PIPE = conn
    try:
        data = work.recv_bytes()
        work.close()
        work = json.loads(data)
        out = _named(*work["entry"])(work, num, overrides)
    except BaseException as e:  # noqa: BLE001 - the sweep reports it; this process ends here
        out = Outcome("failed", f"crashed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    _tell("outcome", out)


def _hand_over(conn, data: bytes) -> None:
    """Send a job its work (from a thread: the job reads it only after its start-up imports)."""
    try:
        conn.send_bytes(data)
    except OSError:   # the job died first; the sweep reports that
        pass
    finally:
        conn.close()


def stop_if_orphaned(sweep: int, every_s: float = 1.0) -> None:
    """Once the sweep's process `sweep` is gone (killed: out of the terminal's process group, no
    signal reaches this job), ask the sweep's jobs to stop at their next step, as a Ctrl-C would."""
    while os.getppid() == sweep:
        time.sleep(every_s)
    from gravac.loop.checkpoint import request_stop
    request_stop()


@dataclass
class _Running:
    num: int
    proc: object
    conn: object
    run_dir: str | None = None
    outcome: Outcome | None = None

    def read(self) -> None:
        """Take what the job has sent so far."""
        try:
            while self.conn.poll():
                kind, value = self.conn.recv()
                if kind == "run_dir":
                    self.run_dir = value
                else:
                    self.outcome = value
        except (EOFError, OSError):   # the job died, maybe mid-message
            pass


class LocalJobs:
    """Runs jobs `n` at a time: each calls `work["entry"]` (a function named by [module, qualname],
    imported in the job) with `work`, its number and overrides; `work` is plain data (for a Hydra
    sweep `hydra_work`'s) and goes to each job as JSON on a pipe of its own,
    written by a thread: as an argument of the process, the sweep would wait for each job to
    import torch before starting the next."""

    def __init__(self, work: dict, n: int, aborting=lambda: False):
        import json
        self.work, self.n, self.aborting = json.dumps(work).encode(), max(1, n), aborting

    def run(self, jobs: list[tuple[int, list[str]]]) -> list[Outcome]:
        """Every job's Outcome, in order; after a stop, jobs not yet started do not start."""
        import multiprocessing
        from multiprocessing.connection import wait

        from gravac.loop.checkpoint import stop_requested
        ctx = multiprocessing.get_context("spawn")
        waiting, running, done = list(jobs), [], {}
        pace = Pace(len(jobs))
        while waiting or running:
            while waiting and len(running) < self.n and not (stop_requested() or self.aborting()):
                running.append(self._start(ctx, *waiting.pop(0)))
            if not running:
                break
            wait([j.proc.sentinel for j in running] + [j.conn for j in running], timeout=0.5)
            for job in list(running):
                job.read()
                if job.proc.exitcode is not None or self.aborting():
                    done[job.num] = self._end(job)
                    running.remove(job)
                    print(f"sweep: job #{job.num} {done[job.num].status}; {pace.line(len(done))}", flush=True)
        done.update((num, Outcome("not started")) for num, _ in waiting)
        return [done[num] for num, _ in jobs]

    def _start(self, ctx, num: int, overrides: list[str]) -> _Running:
        """Start a job and hand it its work; a Ctrl-C while it starts (before it leaves the
        terminal's process group) waits, blocked, and is dropped there."""
        recv, send = ctx.Pipe(duplex=False)
        work_recv, work_send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(send, work_recv, num, overrides), name=f"sweep-job-{num}")
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        send.close()
        work_recv.close()
        threading.Thread(target=_hand_over, args=(work_send, self.work), daemon=True).start()
        print(f"sweep: job #{num} started: {' '.join(overrides)}", flush=True)
        return _Running(num, proc, recv)

    def _end(self, job: _Running) -> Outcome:
        """The job's Outcome once its process is gone: what it sent, else what its run folder says
        after the sweep killed it (aborting) or something else did (the OOM killer, kill -9)."""
        job.read()
        aborted = job.proc.exitcode is None      # still running: the sweep is aborting
        if aborted or job.outcome is None:
            try:   # its whole process group: a ddp job's workers too
                os.killpg(job.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):   # it had not left the terminal's group
                job.proc.kill()
        job.proc.join()
        job.read()
        job.conn.close()
        if job.outcome is not None:
            return job.outcome
        if aborted:
            status, what = "interrupted", "aborted by a second signal to the sweep"
        else:
            status, what = "failed", died(job.proc.exitcode)
        if job.run_dir is None:   # it died before making its run folder
            return Outcome("not started") if aborted else Outcome("failed", f"{what} before its run started")
        from gravac.core.errors import Interrupted
        from gravac.run.outcome import settle
        status, message, resume = settle(job.run_dir, status, what)
        if status == "completed":
            return Outcome("completed")
        if status == "interrupted":
            return Outcome("interrupted", Interrupted(message, resume).hint(), resume)
        return Outcome("failed", message, resume)


class Pace:
    """How far a sweep is and about how long it has left, from its throughput so far (jobs done per
    second of the sweep, which counts jobs running side by side)."""

    def __init__(self, total: int, clock=time.monotonic):
        self.total, self.clock, self.t0 = total, clock, clock()

    def line(self, done: int) -> str:
        elapsed = self.clock() - self.t0
        text = f"{done}/{self.total} jobs done in {_duration(elapsed)}"
        left = self.total - done
        if not left or not done:
            return text
        return f"{text}, about {_duration(elapsed / done * left)} left"


def _duration(s: float) -> str:
    """Seconds as '45 s', '12 min' or '2 h 05 min'."""
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def died(code: int) -> str:
    """How a job's process ended, from its exit code."""
    if code == -signal.SIGKILL:
        return "its process was killed (SIGKILL: out of memory, or kill -9)"
    if code < 0:
        return f"its process was killed ({signal.Signals(-code).name})"
    return f"its process died (exit code {code})"


def hydra_work(launcher) -> dict:
    """What a job needs to be composed and run as the joblib launcher would, as plain data: the
    sweep's config (its interpolations unresolved) and Hydra's config search path. The job's
    process rebuilds Hydra's context from it (`_hydra_job`), where joblib would unpickle it; the
    task function travels by name (gravac.run.sweep.job under bench/run.py)."""
    from omegaconf import OmegaConf
    task = launcher.task_function
    path = launcher.hydra_context.config_loader.get_search_path()
    return {"entry": [__name__, "_hydra_job"],
            "config": OmegaConf.to_container(launcher.config, resolve=False, enum_to_str=True),
            "search_path": [[e.provider, e.path] for e in path.get_path()],
            "task": [task.__module__, task.__qualname__]}


def _hydra_job(work: dict, num: int, overrides: list[str]) -> Outcome:
    """Compose and run job `num` of the sweep from `hydra_work`'s data, as the joblib launcher's
    execute_job does, in a process that has Hydra's and the suite's registrations of its own."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.core.singleton import Singleton
    from hydra.types import HydraContext
    from hydra_plugins.hydra_joblib_launcher._core import execute_job
    from omegaconf import OmegaConf

    from hydra._internal.callbacks import Callbacks
    from hydra.core.plugins import Plugins
    from hydra.core.utils import setup_globals

    from gravac.config.compose import register_base

    task = _named(*work["task"])
    setup_globals()             # Hydra's resolvers (${now:...}), before anything reads the config
    Plugins.instance()          # Hydra's config sources (pkg://, file://) and launchers register here
    register_base()
    path = ConfigSearchPathImpl()
    for provider, where in work["search_path"]:
        path.append(provider, where)
    config = OmegaConf.create(work["config"])
    context = HydraContext(config_loader=ConfigLoaderImpl(config_search_path=path), callbacks=Callbacks(config))
    return execute_job(num, overrides, context, config, task, Singleton.get_state()).return_value


def _named(module: str, qualname: str):
    """The function `qualname` of `module`, imported: how a job finds its code by name."""
    import importlib
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
