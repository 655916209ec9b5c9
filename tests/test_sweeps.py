"""Sweeps under Hydra's launchers (issue 19): the sweep rules in the submitting process (duplicates,
threads, stops, the closing report), joblib's parallel jobs, and a real one-node SLURM."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, ctrl_c_reaches, failure, run_cli

TINY = ["dataset=synthetic", "dataset.image_size=8", "dataset.train_size=256", "dataset.test_size=64", "model.width=4",
        "cluster.workers=2", "train.batch_size=8", "logger.progress=false"]


class FakeLauncher:
    """Records what a Plan launches; every job completes."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)
        self.launched: list[list[str]] = []

    def launch(self, jobs, initial_job_idx):
        from gravac.run.sweep import Outcome
        self.launched += [list(j) for j in jobs]
        return [SimpleNamespace(return_value=Outcome("completed")) for _ in jobs]


@pytest.fixture
def _jobs_here(monkeypatch):
    """Plans of a (fake) joblib launcher record the jobs they would run on this machine."""
    from gravac.run.sweep import Outcome, Plan

    def here(plan, jobs):
        plan.launcher.launched += [list(o) for _, o in jobs]
        return [Outcome("completed") for _ in jobs]
    monkeypatch.setattr(Plan, "_here", here)


@pytest.fixture
def _composer():
    """Compose jobs as the sweeper does, with Hydra initialised once for the test."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from gravac.config.compose import register_base
    register_base()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        yield lambda overrides: hydra_compose(config_name="config", overrides=overrides)


@pytest.fixture
def _plan(_composer, tmp_path):
    """A Plan over `launcher` for a grid of `total` cells, its sweep folder in tmp_path."""
    from gravac.run.sweep import Plan
    return lambda launcher, total: Plan(launcher, _composer, str(tmp_path), total=total)


def _unset_after_test(monkeypatch, *names: str) -> None:
    """Unset `names` now and again after the test, whatever the code under test sets (a bare
    delenv of an unset variable records nothing to undo)."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _own_stop_file(monkeypatch):
    """A Plan points GRAVAC_SWEEP_STOP at its sweep folder; keep that out of other tests (a
    later run would stop at its first step)."""
    _unset_after_test(monkeypatch, "GRAVAC_SWEEP_STOP")


def test_plan_skips_duplicates_before_launch_and_gives_parallel_jobs_their_threads(_plan, _jobs_here, capsys):
    batch = [["method=dense", "compressor=topk", "cluster.threads=0"], ["method=dense", "compressor=dgc", "cluster.threads=0"],
             ["method=static", "compressor=topk", "cluster.threads=2"],
             ["method=static", "compressor=topk", "cluster=ddp", "cluster.threads=0"]]
    launcher = FakeLauncher(joblib={"n_jobs": 2})
    report = _plan(launcher, total=4).run([batch])
    out = capsys.readouterr().out
    assert "skipped job #1 (compressor=dgc): identical to job #0 (compressor=topk); dense ignores compressor" in out
    from gravac.run.sweep import cores
    sim, ddp = max(1, cores() // 2), max(1, cores() // (2 * 2))    # 2 jobs at a time; ddp: 2 processes each
    assert launcher.launched == [batch[0] + [f"cluster.threads={sim}"], batch[2], batch[3] + [f"cluster.threads={ddp}"]]
    assert f"sweep: 2 jobs at a time on {cores()} cores" in out
    assert [(n, o) for n, o, _ in report.jobs] == [(0, batch[0]), (2, batch[2]), (3, batch[3])]  # grid numbers
    assert report.skipped == 1


def test_plan_leaves_threads_alone_when_jobs_run_one_at_a_time(_plan):
    launcher = FakeLauncher()                     # no joblib: sequential (or SLURM, with its own cores)
    _plan(launcher, total=2).run([[["method=dense"], ["method=static", "compressor=topk"]]])
    assert launcher.launched == [["method=dense"], ["method=static", "compressor=topk"]]


def test_parallel_jobs_follows_n_jobs_and_the_grid():
    from gravac.run.sweep import cores, parallel_jobs
    assert parallel_jobs(FakeLauncher(joblib={"n_jobs": 2}), 5) == 2
    assert parallel_jobs(FakeLauncher(joblib={"n_jobs": 4}), 3) == 3        # never more than the jobs
    assert parallel_jobs(FakeLauncher(joblib={"n_jobs": -1}), 64) == min(64, cores())
    assert parallel_jobs(FakeLauncher(_EXECUTOR="local"), 3) == 3
    assert parallel_jobs(FakeLauncher(_EXECUTOR="slurm"), 3) == 1
    assert parallel_jobs(FakeLauncher(), 3) == 1


def test_a_stopped_sweep_launches_nothing_more(_plan, tmp_path):
    launcher = FakeLauncher()
    plan = _plan(launcher, total=2)
    Path(os.environ["GRAVAC_SWEEP_STOP"]).touch()      # as a Ctrl-C, or an interrupted job, leaves it
    report = plan.run([[["method=dense"]], [["method=gravac", "compressor=topk"]]])
    assert launcher.launched == []
    assert [(n, o.status) for n, _, o in report.jobs] == [(0, "not started"), (1, "not started")]
    from gravac.run.sweep import finish
    assert finish(report) == 130


def test_a_launcher_that_fails_fails_its_jobs_in_one_line(_plan, capsys):
    class NoSbatch(FakeLauncher):
        def launch(self, jobs, initial_job_idx):
            raise FileNotFoundError("[Errno 2] No such file or directory: 'sbatch'")
    from gravac.run.sweep import finish
    report = _plan(NoSbatch(), total=1).run([[["method=dense"]]])
    assert finish(report) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == ("error: 1 job(s) of the sweep failed: #0 method=dense (NoSbatch: FileNotFoundError: "
                                    "[Errno 2] No such file or directory: 'sbatch')")


def test_finish_reports_failures_and_stops_once(capsys):
    from gravac.run.sweep import Outcome, Report, finish
    ok, bad = Outcome("completed"), Outcome("failed", "train.lr=-1.0 is out of range: must be > 0")
    assert finish(Report(total=2, jobs=[(0, ["a=1"], ok), (1, ["a=2"], ok)])) == 0
    assert finish(Report(total=3, skipped=1, jobs=[(0, ["a=1"], ok), (2, ["a=3"], bad)])) == 2
    assert capsys.readouterr().err == ("error: 1 job(s) of the sweep failed: #2 a=3 "
                                       "(train.lr=-1.0 is out of range: must be > 0)\n")
    hint = "interrupted at step 5; checkpoint saved. Resume with:\n  python bench/run.py a=1 experiment.resume=x"
    code = finish(Report(total=3, jobs=[(0, ["a=1"], Outcome("interrupted", hint)), (1, ["a=2"], Outcome("not started")),
                                        (2, ["a=3", "b=x y"], Outcome("not started"))]))
    assert code == 130
    assert capsys.readouterr().err == (f"{hint}\nsweep stopped: 1 job(s) interrupted, 2 not started; run each one not "
                                       "started with:\n  python bench/run.py a=2   # job #1\n"
                                       "  python bench/run.py a=3 'b=x y'   # job #2\n")
    assert finish(None) == 0                      # a single run


def test_sweeps_started_in_the_same_second_get_folders_of_their_own(_composer):
    """Issue 33, case 4: two sweeps of the same name and results root, started in the same second,
    shared .multirun/<time>/ (and with it the stop file and multirun.yaml)."""
    from omegaconf import OmegaConf
    from omegaconf.basecontainer import BaseContainer
    now = BaseContainer._resolvers["now"]
    OmegaConf.register_new_resolver("now", lambda pattern: "20250101-120000", replace=True)   # the same second
    try:
        dirs = [str(_composer_with_hydra(["method=dense"]).hydra.sweep.dir) for _ in range(2)]
    finally:
        BaseContainer._resolvers["now"] = now
    assert dirs[0] != dirs[1], dirs
    assert all(d.startswith("results/runs/default/.multirun/20250101-120000-") for d in dirs), dirs


def _composer_with_hydra(overrides):
    from hydra import compose as hydra_compose
    return hydra_compose(config_name="config", overrides=overrides, return_hydra_config=True)


def test_a_sweep_started_in_the_folder_of_a_stopped_one_starts_clean(_plan, tmp_path, capsys):
    """Issue 33, case 5: with a fixed hydra.sweep.dir, the stop file a stopped sweep left behind
    stopped every later sweep there before it ran anything. Each sweep has a stop file of its own,
    and says that it starts clean; the stopped sweep's runs are resumed with the commands it printed."""
    from gravac.loop.checkpoint import request_stop, stop_requested
    from gravac.run.sweep import finish
    _plan(FakeLauncher(), total=1)
    request_stop()                                   # the first sweep was stopped
    (tmp_path / "stop").touch()                      # as the sweeps before this fix left it
    launcher = FakeLauncher()
    plan = _plan(launcher, total=1)
    assert not stop_requested()
    report = plan.run([[["method=dense"]]])
    assert launcher.launched == [["method=dense"]] and finish(report) == 0
    out = capsys.readouterr().out
    assert f"sweep: {tmp_path} holds the stop file of an earlier, stopped sweep (stop, stop-" in out
    assert "this sweep starts clean" in out


def test_a_stopped_sweep_names_each_cell_it_did_not_start_and_its_command(_plan, capsys):
    """A stop in the first batch: the second batch's cells are named, each with its command."""
    from gravac.loop.checkpoint import request_stop
    from gravac.run.sweep import Outcome, finish

    class Stops(FakeLauncher):
        def launch(self, jobs, initial_job_idx):
            request_stop()
            return [SimpleNamespace(return_value=Outcome("interrupted", "interrupted at step 3; checkpoint saved. "
                                                          "Resume with:\n  python bench/run.py x"))]
    report = _plan(Stops(), total=3).run([[["method=dense"]], [["method=static", "experiment.name=\"a b\""],
                                                               ["method=gravac"]]])
    assert finish(report) == 130
    err = capsys.readouterr().err
    assert "sweep stopped: 1 job(s) interrupted, 2 not started; run each one not started with:\n" in err
    assert "  python bench/run.py method=static 'experiment.name=\"a b\"'   # job #1\n" in err
    assert "  python bench/run.py method=gravac   # job #2\n" in err


def _job_for_test(work: dict, num: int, overrides: list[str]):
    """A sweep job for LocalJobs, in a process of its own, as its overrides say. die=FOLDER: make a
    run folder 5 steps in, with a checkpoint at step 4, tell the sweep, and be SIGKILLed (as the
    OOM killer does); outlive=FILE: complete only once the process whose id FILE holds is gone."""
    from gravac.run.jobs import Outcome, tell_run_dir     # light: no torch in the job's process
    args = dict(o.split("=", 1) for o in overrides)
    if "die" in args:
        run = Path(args["die"])
        (run / "checkpoint" / "step-00000004").mkdir(parents=True)
        (run / "checkpoint" / "latest").write_text("step-00000004\n")
        (run / "command.txt").write_text("python bench/run.py a=1\n")
        (run / "summary.json").write_text(json.dumps({"status": "running", "steps": 0}))
        (run / "steps.jsonl").write_text("".join(json.dumps({"step": i}) + "\n" for i in range(5)))
        tell_run_dir(str(run))
        (run.parent / "pid.tmp").write_text(str(os.getpid()))
        (run.parent / "pid.tmp").rename(run.parent / "pid")
        os.kill(os.getpid(), signal.SIGKILL)
    if "outlive" in args:
        pid_file, t0 = Path(args["outlive"]), time.time()
        while not pid_file.exists() and time.time() - t0 < 120:
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        while _alive(pid) and time.time() - t0 < 120:
            time.sleep(0.05)
    return Outcome("completed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_job_killed_on_this_machine_fails_alone_and_says_so(tmp_path, capsys):
    """Issue 33, case 6: joblib's pool killed every job when one worker was killed. Here the
    killed job fails with its run folder telling the truth (killed, at step 5, resumable from its
    checkpoint), a job running beside it completes after it died, and a job still waiting runs."""
    from gravac.run.jobs import LocalJobs
    from gravac.run.sweep import Report, finish
    run = tmp_path / "run"
    outcomes = LocalJobs({"entry": [__name__, "_job_for_test"]}, 2).run([(0, [f"die={run}"]), (1, [f"outlive={tmp_path / 'pid'}"]),
                                                (2, ["c=1"])])
    assert [o.status for o in outcomes] == ["failed", "completed", "completed"], outcomes
    why = "its process was killed (SIGKILL: out of memory, or kill -9) at step 5; the checkpoint at step 4 resumes it"
    resume = f"python bench/run.py a=1 experiment.resume={run}"
    assert (outcomes[0].message, outcomes[0].resume) == (why, resume)
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"], summary["steps"], summary["error"], summary["resume_command"]) == \
        ("failed", 5, why, resume)
    assert finish(Report(total=3, jobs=[(n, [f"n={n}"], o) for n, o in enumerate(outcomes)])) == 2
    out, err = capsys.readouterr()
    ends = [line for line in out.splitlines() if " jobs done in " in line]
    assert [line.split(";")[0] for line in ends[-1:]] == ["sweep: job #2 completed"] and len(ends) == 3, out
    assert "3/3 jobs done in " in ends[-1] and "left" not in ends[-1] and "about" in ends[0], out
    assert f"job #0 failed but left a checkpoint. Resume with:\n  {resume}\n" in err
    assert err.splitlines()[-1] == f"error: 1 job(s) of the sweep failed: #0 n=0 ({why})"


def test_a_job_whose_sweep_died_stops_at_its_next_step(tmp_path, monkeypatch):
    """Jobs live in process groups of their own, so nothing reaches them when the sweep's process
    is killed: a job then writes the stop file itself (and checkpoints at its next step)."""
    from gravac.run.jobs import stop_if_orphaned
    monkeypatch.setenv("GRAVAC_SWEEP_STOP", str(tmp_path / "stop-x"))
    stop_if_orphaned(os.getppid() + 1, every_s=0.01)      # a parent that is not this process's
    assert (tmp_path / "stop-x").exists()


def test_the_stop_file_stops_a_training_loop(tmp_path, monkeypatch):
    from gravac.loop.checkpoint import StopFlag
    monkeypatch.setenv("GRAVAC_SWEEP_STOP", str(tmp_path / "stop"))
    with StopFlag() as stop:
        assert not stop.requested
        (tmp_path / "stop").touch()
        assert stop.requested


def test_a_slurm_task_becomes_a_ddp_rank(monkeypatch):
    from conftest import make_run

    from gravac.core.errors import UserError
    from gravac.run.sweep import slurm_task
    _unset_after_test(monkeypatch, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "nodeA")   # one node: no scontrol needed to read it
    for k, v in dict(SLURM_STEP_NUM_TASKS="4", SLURM_PROCID="3", SLURM_LOCALID="1", SLURM_STEP_NUM_NODES="2",
                     SLURM_JOB_ID="123", SLURM_CPUS_PER_TASK="3", SLURM_STEP_NODELIST="nodeA").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UserError, match="cluster=sim runs in one process"):
        slurm_task(make_run(cluster=dict(backend="sim")))
    cfg = slurm_task(make_run(cluster=dict(backend="ddp", threads=0)))
    assert cfg.cluster.threads == 3                     # the cores' share: the task's CPUs, not the node's
    assert {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == \
        dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="nodeA")
    assert os.environ["MASTER_PORT"] == "20123"          # from the job id: every task agrees on it
    monkeypatch.delenv("RANK")
    assert slurm_task(make_run(cluster=dict(backend="ddp"))).cluster.threads == 1    # the default, as anywhere
    assert slurm_task(make_run(cluster=dict(backend="sim"))).cluster.backend == "sim"   # RANK set: leave it


def test_the_slurm_launcher_config_composes_on_submitit():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from gravac.config.compose import register_base
    register_base()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                            return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher") and launcher.partition == "gpu"
    assert (launcher.nodes, launcher.tasks_per_node, launcher.cpus_per_task, launcher.timeout_min) == (1, 1, 2, 240)
    assert launcher.name == "gravac-default"               # the SLURM job name
    assert cfg.hydra.sweeper._target_.endswith("GravacSweeper")


def test_an_unknown_launcher_is_one_line_naming_the_launchers():
    from gravac.config.cli import check_composition
    from gravac.config.compose import ConfigError, register_base
    register_base()
    with pytest.raises(ConfigError) as e:
        check_composition(["hydra/launcher=nope", "method=dense"], str(ROOT / "conf"))
    assert "\n" not in str(e.value) and "choose one of: basic, joblib, slurm" in str(e.value)


# ---------------------------------------------------------------------------------------------
# joblib: real sweeps, two jobs at a time

def _runs(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("default/2*") if p.is_dir())


@pytest.mark.slow
def test_pace_says_jobs_done_and_the_time_left_from_the_sweeps_throughput():
    from gravac.run.jobs import Pace
    now = [100.0]
    pace = Pace(8, clock=lambda: now[0])
    now[0] = 100 + 600          # two jobs side by side finished after 10 min: 5 min a job
    assert pace.line(2) == "2/8 jobs done in 10 min, about 30 min left"
    now[0] = 100 + 2 * 3600 + 5 * 60
    assert pace.line(7) == "7/8 jobs done in 2 h 05 min, about 18 min left"
    assert pace.line(8) == "8/8 jobs done in 2 h 05 min"
    now[0] = 130
    assert Pace(3, clock=lambda: 100.0).line(0) == "0/3 jobs done in 0 s"


@pytest.mark.slow   # 14-33 s: the default suite stays near 15 min; CI runs it with -m slow
def test_joblib_sweep_runs_two_at_a_time_skips_duplicates_and_reports_failures(tmp_path):
    # the good cells first: each job is a fresh process, and these start, and run, side by side
    r = run_cli(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "train.lr=0.1,-1", "method=dense,gravac",
                 "compressor=topk,dgc", "train.steps=3", *TINY, f"experiment.results_root={tmp_path}"], timeout=900)
    assert r.returncode == 2, failure(r)
    assert "4 job(s) of the sweep failed" in r.stderr and "Traceback" not in r.stderr
    assert "skipped job #1 (compressor=dgc): identical to job #0 (compressor=topk); dense ignores compressor" in r.stdout
    runs = _runs(tmp_path)
    assert sorted(p.name.split("-", 2)[2].rsplit("-n2", 1)[0] for p in runs) == \
        ["resnet_mini-dense", "resnet_mini-gravac-dgc", "resnet_mini-gravac-topk"]
    spans = []
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["steps"] == 3
        assert len((run / "steps.jsonl").read_text().splitlines()) == 3
        assert summary["numerics"]["threads"] == 1     # as a single run's, by default
        spans.append(((run / "config.yaml").stat().st_mtime, (run / "summary.json").stat().st_mtime))
    spans.sort()
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans    # two runs overlapped in time


@pytest.mark.slow
def test_joblib_sweep_of_ddp_jobs_spawns_their_workers(tmp_path):
    """A job's process (gravac/run/jobs.py) spawns the ddp workers of its run."""
    r = run_cli(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "cluster=ddp", "method=dense,gravac",
                 "compressor=topk", "train.steps=3", *TINY, f"experiment.results_root={tmp_path}"], timeout=900)
    assert r.returncode == 0, failure(r)
    runs = _runs(tmp_path)
    assert len(runs) == 2
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["backend"] == "ddp" and summary["steps"] == 3, summary


def _popen_sweep(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "bench" / "run.py"), *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=ctrl_c_reaches)


@pytest.mark.slow
@pytest.mark.parametrize("how,methods", [("Ctrl-C to the process group", "dense,gravac,static"),
                                         ("SIGTERM to the sweep", "dense,gravac,static"),
                                         ("Ctrl-C to the process group", "dense")],   # a worker idles
                         ids=["Ctrl-C", "SIGTERM", "Ctrl-C, one job"])
def test_joblib_sweep_stop_checkpoints_the_running_jobs_and_starts_no_more(tmp_path, how, methods):
    """Two jobs run, a third waits; a stop checkpoints both and the third never starts. With one
    job the second worker idles: the Ctrl-C must not kill it (joblib would kill the pool)."""
    running = min(2, len(methods.split(",")))
    proc = _popen_sweep(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"method={methods}",
                         "compressor=topk", "train.steps=400", "train.checkpoint_every=0", *TINY,
                         f"experiment.results_root={tmp_path}"])
    try:
        t0 = time.time()
        while not (len(_runs(tmp_path)) == running and all((p / "steps.jsonl").exists() and
                                                            len((p / "steps.jsonl").read_text().splitlines()) >= 2
                                                            for p in _runs(tmp_path))):
            assert proc.poll() is None and time.time() - t0 < 400, proc.communicate()
            time.sleep(0.2)
        if how.startswith("Ctrl-C"):
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)      # the workers hear of it through the stop file
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    waiting = len(methods.split(",")) - running
    assert f"sweep stopped: {running} job(s) interrupted, {waiting} not started" in err, err[-3000:]
    assert "Traceback" not in err and err.count("Resume with:") == running, err[-3000:]
    runs = _runs(tmp_path)
    assert len(runs) == running                    # the third job never started
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "interrupted" and (run / "checkpoint" / "latest").exists()
        assert f"experiment.resume={run}" in err


@pytest.mark.slow
def test_joblib_sweep_a_killed_job_fails_alone_and_its_printed_resume_command_works(tmp_path):
    """Issue 33, case 6: one job's process dies at step 12 (GRAVAC_FAULT=1:12:exit, as a kill -9
    would: only jobs with 2 workers and more than 12 steps reach it). Before, joblib failed all 4
    jobs (2 never started), killed the job beside it and left both summaries at `running`, 0 steps.
    Now that job fails alone, saying where and with its resume command; the others complete."""
    tiny = [a for a in TINY if not a.startswith("cluster.workers=")]
    r = run_cli(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "train.steps=40,10", "cluster.workers=2,1",
                 "train.checkpoint_every=5", *tiny, f"experiment.results_root={tmp_path}"],
                env={"GRAVAC_FAULT": "1:12:exit"}, timeout=900)
    assert r.returncode == 2, failure(r)
    summaries = {run: json.loads((run / "summary.json").read_text()) for run in _runs(tmp_path)}
    assert sorted((s["workers"], s["total_steps"], s["status"]) for s in summaries.values()) == \
        [(1, 10, "completed"), (1, 40, "completed"), (2, 10, "completed"), (2, 40, "failed")]
    (killed, summary), = [(run, s) for run, s in summaries.items() if s["status"] == "failed"]
    why = "its process died (exit code 17) at step 12; the checkpoint at step 10 resumes it"
    assert (summary["steps"], summary["error"]) == (12, why) and len(_records(killed)) == 12
    # That a job running beside it outlives the death is proven without timing by
    # test_a_job_killed_on_this_machine_fails_alone_and_says_so: here which job shares the slot at
    # that moment depends on the host's speed (CI once finished the 1-worker job 29 ms before it).
    assert f"job #0 failed but left a checkpoint. Resume with:\n  {summary['resume_command']}\n" in r.stderr
    assert r.stderr.splitlines()[-1].startswith("error: 1 job(s) of the sweep failed: #0 train.steps=40 cluster.workers=2")
    assert r.stderr.splitlines()[-1].endswith(f"({why})") and "Traceback" not in r.stderr
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    resumed = subprocess.run(["bash", "-c", summary["resume_command"]], cwd=ROOT, capture_output=True, text=True,
                             timeout=600, env={**os.environ, "PATH": path})
    assert resumed.returncode == 0, failure(resumed)
    assert json.loads((killed / "summary.json").read_text())["status"] == "completed"
    assert [rec["step"] for rec in _records(killed)] == list(range(40))


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]


def _steps(run: Path) -> int:
    path = run / "steps.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_a_stop_of_one_sweep_leaves_another_sweep_in_the_same_folder_running(tmp_path):
    """Issue 33, cases 4 and 5: two sweeps sharing a folder (as two started in the same second
    shared .multirun/<time>/) shared its stop file: SIGTERM to one stopped the other."""
    sweeps = {name: _popen_sweep(["-m", "method=dense", "train.steps=2000", *TINY, f"hydra.sweep.dir={tmp_path / 'sweep'}",
                                  f"experiment.results_root={tmp_path / name}"]) for name in ("a", "b")}
    try:
        t0 = time.time()
        while not all(_runs(tmp_path / n) and _steps(_runs(tmp_path / n)[0]) >= 2 for n in sweeps):
            assert all(p.poll() is None for p in sweeps.values()) and time.time() - t0 < 400, \
                [p.communicate(timeout=60) for p in sweeps.values() if p.poll() is not None]
            time.sleep(0.2)
        sweeps["a"].send_signal(signal.SIGTERM)
        _, err = sweeps["a"].communicate(timeout=300)
        assert sweeps["a"].returncode == 130, err[-3000:]
        (b,) = _runs(tmp_path / "b")
        seen = _steps(b)
        while _steps(b) < seen + 5:                        # b goes on
            assert sweeps["b"].poll() is None and time.time() - t0 < 600, sweeps["b"].communicate(timeout=60)
            time.sleep(0.2)
        sweeps["b"].send_signal(signal.SIGTERM)
        _, err = sweeps["b"].communicate(timeout=300)
        assert sweeps["b"].returncode == 130, err[-3000:]
    finally:
        for p in sweeps.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for name in sweeps:
        summary = json.loads((_runs(tmp_path / name)[0] / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["resume_command"], summary


@pytest.mark.slow
def test_joblib_sweep_a_second_ctrl_c_kills_the_jobs_and_every_run_says_where_it_stopped(tmp_path):
    """Issue 33: a double Ctrl-C printed joblib's traceback. The jobs here are calibrating (a
    long clock calibration, before their first step, where the stop file is not read yet); the
    first Ctrl-C writes the stop file, the second kills them; their folders say so."""
    proc = _popen_sweep(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "method=dense,gravac,static",
                         "compressor=topk", "clock.repeats=1000000", f"clock.cache_dir={tmp_path / 'cache'}", *TINY,
                         f"experiment.results_root={tmp_path}"])
    try:
        t0 = time.time()
        while len(list(tmp_path.glob("default/2*/command.txt"))) < 2:
            assert proc.poll() is None and time.time() - t0 < 400, proc.communicate(timeout=60)
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        while not list(tmp_path.glob("default/.multirun/*/stop-*")):      # the first Ctrl-C is taken
            assert proc.poll() is None and time.time() - t0 < 400, proc.communicate(timeout=60)
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and err.count("sweep: aborting") == 1, err[-3000:]
    runs = _runs(tmp_path)
    assert len(runs) == 2                                     # the third never started
    why = "aborted by a second signal to the sweep before the first step; nothing to resume"
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert (summary["status"], summary["error"], summary["steps"]) == ("interrupted", why, 0), summary
    assert err.count(why) == 2
    assert "sweep stopped: 2 job(s) interrupted, 1 not started; run each one not started with:\n" in err
    assert "  python bench/run.py method=static compressor=topk " in err


# ---------------------------------------------------------------------------------------------
# a real SLURM: munged, slurmctld and slurmd on this machine, for one test

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_CONF = """ClusterName=gravactest
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
KillWait=5
NodeName=localhost NodeHostname={host} CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _slurm_missing() -> str | None:
    """Why this machine cannot start a test SLURM, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the SLURM test starts munged, slurmctld and slurmd as root; run it as root"
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch", "sinfo") if shutil.which(b) is None]
    if missing:
        return f"{', '.join(missing)} not found: apt-get install -y slurm-wlm munge to run the SLURM test"
    return None


def _kill_tree_of(marker: str) -> None:
    """SIGKILL what is left of the test cluster's jobs: processes whose environment names its
    slurm.conf (a path no other process has)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


@pytest.fixture
def slurm_cluster():
    """Environment for commands that talk to a one-node SLURM started here; every daemon, job and
    file of it is gone after the test, whatever happened."""
    why = _slurm_missing()
    if why:
        pytest.skip(why)
    d = Path(tempfile.mkdtemp(prefix="gravac-slurm-"))
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
    try:
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        (d / "munge.key").write_bytes(os.urandom(1024))
        os.chmod(d / "munge.key", 0o400)
        (d / "slurm.conf").write_text(SLURM_CONF.format(d=d, ctld_port=_free_port(), d_port=_free_port(),
                                                        host=socket.gethostname()))
        log = open(d / "daemons.log", "w")
        munge = ["munged", "-F", "--force", f"--socket={d}/munge.sock", f"--key-file={d}/munge.key",
                 f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed", f"--log-file={d}/munged.log"]
        for argv in (munge, ["slurmctld", "-D", "-i", "-f", str(d / "slurm.conf")],
                     ["slurmd", "-D", "-N", "localhost", "-f", str(d / "slurm.conf")]):
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
            time.sleep(1)
        _wait_idle(env, procs, d)
        yield env
    finally:
        if procs:
            subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True, timeout=30)
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        _kill_tree_of(str(d / "slurm.conf"))
        shutil.rmtree(d, ignore_errors=True)


def _wait_idle(env: dict, procs: list, d: Path, timeout: float = 60) -> None:
    """Wait until the node takes jobs; fail with the daemons' last lines when it never does."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        r = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=30)
        if r.stdout.strip() == "idle":
            return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.5)
    logs = "".join((d / n).read_text()[-1500:] for n in ("daemons.log", "slurmctld.log", "slurmd.log") if (d / n).exists())
    pytest.fail(f"the test SLURM did not come up:\n{logs}")


@pytest.mark.slow
def test_slurm_sweep_runs_each_cell_as_a_job_whose_tasks_are_the_ddp_workers(slurm_cluster, tmp_path):
    """Two cells, each a SLURM job of two tasks (srun starts them, ranks from SLURM): one results
    folder per cell, written by rank 0, completed."""
    r = run_cli(["-m", "hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2", "hydra.launcher.cpus_per_task=1",
                 "hydra.launcher.timeout_min=10", "arm=dense,topk10", "cluster=ddp", "train.steps=3", *TINY,
                 f"experiment.results_root={tmp_path}"], env={**slurm_cluster, "MASTER_PORT": str(_free_port())},
                timeout=900)   # the jobs run one after the other (2 tasks x 1 CPU fill the node): one port
    assert r.returncode == 0, (r.stdout[-3000:], failure(r))
    runs = _runs(tmp_path)
    assert len(runs) == 2, (runs, failure(r))
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["steps"] == 3 and summary["workers"] == 2, summary
        assert [json.loads(line)["step"] for line in (run / "steps.jsonl").read_text().splitlines()] == [0, 1, 2]
    logs = list(tmp_path.glob("default/.multirun/*/.submitit/*/*_log.out"))
    assert len(logs) == 4, logs                     # 2 jobs x 2 tasks, run by SLURM



def _job_listing_tmp(work: dict, num: int, overrides: list[str]):
    """A sweep job that reports what the temporary folder holds while it runs."""
    from gravac.run.jobs import Outcome
    return Outcome("completed", ",".join(sorted(os.listdir(os.environ["TMPDIR"]))))


def test_a_jobs_code_never_passes_through_a_file(tmp_path, monkeypatch):
    """A sweep's jobs get their work as plain data (JSON, their code named, never unpickled) on a
    pipe from the sweep's memory: no file exists that someone could replace to change every job
    (a work file in the temporary folder did before)."""
    import tempfile

    from gravac.run.jobs import LocalJobs
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)          # re-read TMPDIR in this process too
    import json
    jobs = LocalJobs({"entry": [__name__, "_job_listing_tmp"]}, 2)
    assert json.loads(jobs.work) == {"entry": [__name__, "_job_listing_tmp"]}     # data, not a pickle
    outcomes = jobs.run([(0, []), (1, [])])
    assert [(o.status, o.message) for o in outcomes] == [("completed", ""), ("completed", "")]


