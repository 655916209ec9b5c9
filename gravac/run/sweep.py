"""Runs and sweeps as Hydra starts them: the task function every job runs (in this process, in
a process of its own under hydra/launcher=joblib (gravac/run/jobs.py), or in a SLURM job), and the
submitting side of a sweep (`bench/run.py -m`), which the sweeper plug-in
`hydra_plugins/gravac_sweeper` drives whatever the launcher.

A sweep's jobs may run in other processes or on other machines, so nothing about the sweep is
kept in the job's memory: duplicate cells are dropped before launch, each job returns an Outcome,
and a stop request is a file in the sweep folder that every job looks at (GRAVAC_SWEEP_STOP).
Each sweep has a folder and a stop file of its own, so sweeps started together, or one started
after a stopped one in the same folder, never stop each other.
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from gravac.loop.checkpoint import STOP_ENV, request_stop, stop_requested
from gravac.config.compose import ConfigError, build_config, register_resolvers, same_run_line, sweep_key, unique_id
from gravac.core.errors import Interrupted, UserError
from gravac.cluster.host import cores
from gravac.run.jobs import Outcome, tell_run_dir

NOTHING_TO_RESUME = "interrupted before the first step; nothing to resume"

register_resolvers()   # a job's own process (joblib, SLURM) resolves its sweep folder too


# ---------------------------------------------------------------------------------------------
# the job: Hydra's task function

def job(cfg) -> Outcome | None:
    """One run (user errors exit with one line) or one job of a sweep (returns its Outcome)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    if hc.mode == RunMode.MULTIRUN:
        return sweep_job(cfg, overrides)
    try:
        run(build_config(cfg, overrides=overrides), overrides)
    except Interrupted as e:   # a stop the user asked for: a hint, not an error
        print(e.hint(), file=sys.stderr)
        sys.exit(130)
    except (ConfigError, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(NOTHING_TO_RESUME, file=sys.stderr)
        sys.exit(130)
    return None


def sweep_job(cfg, overrides: list[str]) -> Outcome:
    """Run one cell of a sweep unless the sweep was stopped; a stop here stops the sweep. Errors
    are printed where the job's output goes (the terminal, or SLURM's log) and returned."""
    if stop_requested():
        return Outcome("not started")
    with _signals_interrupt():
        try:
            run(build_config(cfg, overrides=overrides), overrides, started=tell_run_dir)
            return Outcome("completed")
        except Interrupted as e:
            request_stop()
            return Outcome("interrupted", e.hint(), e.resume)
        except (ConfigError, UserError) as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return Outcome("failed", str(e))
        except KeyboardInterrupt:
            request_stop()
            return Outcome("interrupted", NOTHING_TO_RESUME)
        except Exception as e:  # noqa: BLE001 - a crashed job fails, the sweep goes on
            traceback.print_exc()
            return Outcome("failed", f"crashed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


@contextmanager
def _signals_interrupt():
    """During a job, Ctrl-C and SIGTERM raise KeyboardInterrupt (the training loop turns them into
    a stop at the next step), in a job's own process too, which ignores them otherwise."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    try:
        old = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:   # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run(run_cfg, overrides: list[str], started=None) -> None:
    """Launch one run; inside a SLURM job step of several tasks each task is one ddp worker."""
    from gravac.run.launch import launch
    launch(slurm_task(run_cfg), overrides=overrides, started=started)


def slurm_task(run_cfg):
    """Under `srun` with several tasks (hydra/launcher=slurm with tasks_per_node x nodes > 1), give
    torch.distributed the rank, world and rendezvous torchrun would, from SLURM's variables; the
    port is MASTER_PORT when the job's environment has one, else derived from the job id."""
    tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1"))
    if tasks <= 1 or "SLURM_PROCID" not in os.environ or "RANK" in os.environ:
        return run_cfg
    if run_cfg.cluster.backend != "ddp":
        raise UserError(f"this SLURM job step has {tasks} tasks, but cluster=sim runs in one process: use "
                        "cluster=ddp (one task per worker) or hydra.launcher.tasks_per_node=1 hydra.launcher.nodes=1")
    nodes = int(os.environ.get("SLURM_STEP_NUM_NODES", os.environ.get("SLURM_NNODES", "1")))
    job_id = int(os.environ.get("SLURM_JOB_ID", "0"))
    os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=str(tasks),
                      LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"), LOCAL_WORLD_SIZE=str(max(1, tasks // nodes)),
                      MASTER_ADDR=_first_host(), MASTER_PORT=os.environ.get("MASTER_PORT") or str(20000 + job_id % 20000))
    threads = run_cfg.cluster.threads or (cores() if "SLURM_CPUS_PER_TASK" in os.environ else 0)
    return replace(run_cfg, cluster=replace(run_cfg.cluster, threads=threads))


def _first_host() -> str:
    """The first node of this job step: rank 0 listens there."""
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "localhost")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        out = []
    return out[0] if out else nodelist.split(",")[0]


# ---------------------------------------------------------------------------------------------
# the submitting side

@dataclass
class Report:
    """A sweep's jobs in grid order, (job number, overrides, Outcome), and how many cells it had
    and skipped as duplicates."""
    total: int = 0
    skipped: int = 0
    jobs: list = field(default_factory=list)


LAST: Report | None = None      # the sweep this process ran; bench/run.py turns it into its exit


class Plan:
    """Runs a sweep's batches through `launcher`: duplicates of earlier cells are said and dropped
    before launch, jobs sharing this machine's cores get a thread count, a Ctrl-C or SIGTERM here
    reaches jobs in other processes through the sweep's own stop file. `load(overrides)` composes
    a job. The joblib launcher's jobs run through gravac.run.jobs (one process each)."""

    def __init__(self, launcher, load, sweep_dir: str, total: int):
        self.launcher, self.load = launcher, load
        self.seen: dict[str, tuple[int, list[str]]] = {}
        self.report = Report(total=total)
        self.local = hasattr(launcher, "joblib")
        self.aborting = False      # a second signal: the local jobs are killed
        earlier = sorted(os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(sweep_dir), "stop*")))
        if earlier:
            print(f"sweep: {sweep_dir} holds the stop file of an earlier, stopped sweep ({', '.join(earlier)}); "
                  "this sweep starts clean (resume the earlier sweep's runs with the commands it printed)", flush=True)
        os.environ[STOP_ENV] = os.path.join(sweep_dir, f"stop-{unique_id()}")

    def run(self, batches: list[list[list[str]]]) -> Report:
        """Launch batch after batch until done or stopped; the report is also kept in LAST."""
        global LAST
        LAST = self.report
        first = 0
        with self._signals():
            for batch in batches:
                if stop_requested() or self.aborting:
                    self.report.jobs += [(num, list(o), Outcome("not started")) for num, o in enumerate(batch, first)]
                else:
                    jobs = self.jobs(batch, first)
                    outcomes = self._launch(jobs, first) if jobs else []
                    self.report.jobs += [(num, overrides, o) for (num, overrides, _), o in zip(jobs, outcomes)]
                first += len(batch)
        return self.report

    def _launch(self, jobs: list[tuple[int, list[str], list[str]]], first: int) -> list[Outcome]:
        """The jobs' outcomes; when the launcher itself fails (no sbatch, a SLURM job killed before
        it could answer), every job of the batch fails with the launcher's one line."""
        if self.local:
            return self._here([(num, launched) for num, _, launched in jobs])
        try:
            return [r.return_value for r in self.launcher.launch([o for _, _, o in jobs], initial_job_idx=first)]
        except Exception as e:  # noqa: BLE001
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            why = f"{type(self.launcher).__name__}: {type(e).__name__}: {text}"
            print(f"error: {why}", file=sys.stderr, flush=True)
            return [Outcome("failed", why)] * len(jobs)

    def _here(self, jobs: list[tuple[int, list[str]]]) -> list[Outcome]:
        """The joblib launcher's jobs (grid number, overrides), n_jobs at a time on this machine."""
        from gravac.run.jobs import LocalJobs, hydra_work
        runner = LocalJobs(hydra_work(self.launcher), parallel_jobs(self.launcher, len(jobs)), lambda: self.aborting)
        return runner.run(jobs)

    def jobs(self, batch: list[list[str]], first: int) -> list[tuple[int, list[str], list[str]]]:
        """(grid number, overrides, overrides to launch) of the batch's jobs that will run."""
        keep = []
        for num, overrides in enumerate(batch, first):
            cfg = self._config(overrides)
            if cfg is not None:
                key = sweep_key(cfg)
                if key in self.seen:
                    print(same_run_line(cfg, (num, list(overrides)), self.seen[key]), flush=True)
                    self.report.skipped += 1
                    continue
                self.seen[key] = (num, list(overrides))
            keep.append((num, list(overrides), cfg))
        return self._threads(keep)

    def _config(self, overrides: list[str]):
        """The job's checked RunConfig, or None when it does not build (the job then fails
        with its own message, as it would alone)."""
        from omegaconf import OmegaConf
        try:
            cfg = self.load(list(overrides))
            return build_config(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), overrides=list(overrides))
        except Exception:  # noqa: BLE001
            return None

    def _threads(self, keep: list) -> list[tuple[int, list[str], list[str]]]:
        """Jobs that run side by side here with cluster.threads=0 (the cores' share) get cores / (jobs
        at a time x their processes) threads each, as an override (so command.txt records it)."""
        share = parallel_jobs(self.launcher, len(keep))
        out, used = [], set()
        for num, overrides, cfg in keep:
            extra = []
            if share > 1 and cfg is not None and cfg.cluster.threads == 0:
                procs = cfg.cluster.workers if cfg.cluster.backend == "ddp" else 1
                threads = max(1, cores() // (share * procs))
                extra, _ = [f"cluster.threads={threads}"], used.add(threads)
            out.append((num, overrides, overrides + extra))
        if used:
            print(f"sweep: {share} jobs at a time on {cores()} cores; jobs with cluster.threads=0 run "
                  f"{'/'.join(map(str, sorted(used)))} thread(s) per process", flush=True)
        return out

    @contextmanager
    def _signals(self):
        """Jobs in other processes: a first Ctrl-C or SIGTERM here writes the stop file (running
        jobs checkpoint at their next step, the rest do not start); a second one aborts: local
        jobs are killed (their folders then say where they stopped), elsewhere this process stops
        waiting. Jobs in this process take the signals themselves."""
        if type(self.launcher).__name__ == "BasicLauncher":
            yield
            return
        asked = []

        def handler(signum, frame):
            if self.aborting:
                return
            if asked and not self.local:
                raise KeyboardInterrupt
            if asked:
                self.aborting = True
                print("sweep: aborting: the running jobs are killed; each run's summary.json says where it stopped",
                      file=sys.stderr, flush=True)
                return
            asked.append(signum)
            request_stop()
            print("sweep: stopping; running jobs checkpoint at their next step (signal again to abort)",
                  file=sys.stderr, flush=True)
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def parallel_jobs(launcher, n: int) -> int:
    """How many of `n` jobs the launcher runs at a time on this machine: joblib's n_jobs (-1:
    one per core), submitit's local executor all of them, otherwise one (sequential or SLURM)."""
    if hasattr(launcher, "joblib"):
        k = int(launcher.joblib.get("n_jobs") or 1)
        k = k if k > 0 else max(1, cores() + 1 + k)
        return max(1, min(k, n))
    if getattr(launcher, "_EXECUTOR", "") == "local":
        return max(1, n)
    return 1


def finish(report: Report | None) -> int:
    """Say what the sweep came to, once, in the submitting process: each stopped job's resume
    command, the command of each cell that did not start, the failures last; the exit code: 130
    when it was stopped, 2 when a job failed, else 0."""
    if report is None:
        return 0
    from gravac.run.launch import command_line
    stopped = [o for _, _, o in report.jobs if o.status == "interrupted"]
    failed = [(n, ov, o) for n, ov, o in report.jobs if o.status == "failed"]
    waiting = [(n, ov) for n, ov, o in report.jobs if o.status == "not started"]
    for o in stopped:
        print(o.message, file=sys.stderr)
    for n, _, o in failed:
        if o.resume:
            print(f"job #{n} failed but left a checkpoint. Resume with:\n  {o.resume}", file=sys.stderr)
    if stopped or waiting:
        print(f"sweep stopped: {len(stopped)} job(s) interrupted, {len(waiting)} not started"
              + ("; run each one not started with:" if waiting else ""), file=sys.stderr)
        for n, ov in waiting:
            print(f"  {command_line(ov)}   # job #{n}", file=sys.stderr)
    if failed:
        print(f"error: {len(failed)} job(s) of the sweep failed: "
              + "; ".join(f"#{n} {' '.join(ov)} ({o.message.splitlines()[0] if o.message else 'failed'})"
                          for n, ov, o in failed), file=sys.stderr)
    return 130 if stopped or waiting else 2 if failed else 0


ABORTED = ("sweep aborted; jobs running elsewhere (SLURM) stop at their next step (the stop file), and each run's "
           "summary.json says how it ended")
