"""Runs survive interruption: kill-and-resume equality, Ctrl-C, config mismatch, concurrent runs."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, ctrl_c_reaches, failure, run_cli, run_cli_many

ARGS = ["train.steps=24", "train.eval_every=8", "train.checkpoint_every=4", "logger.progress=false",
        "dataset.image_size=8", "dataset.train_size=512", "dataset.test_size=128", "model.width=4",
        "cluster.workers=2", "cluster.threads=1", "train.batch_size=8"]
# omega=0: GraVAC's settle rule compares measured throughputs (T_compression) within omega, so two
# separate runs may settle differently by timing alone; with omega 0 every decision follows the
# gains, which are deterministic, and an interrupted run can be compared exactly with an
# uninterrupted one.
GRAVAC = ["method=gravac", "compressor=topk", "method.window=3", "method.cf_min=4", "method.cf_max=64",
          "method.epsilon=0.3", "method.omega=0"]


def _records(run: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def _only_run(root: Path) -> Path:
    (run,) = [p for p in root.glob("*/*") if p.is_dir()]
    return run


def _popen(args: list[str], session: bool = False) -> subprocess.Popen:
    """`session`: its own process group, so os.killpg can send what a terminal's Ctrl-C sends."""
    return subprocess.Popen([sys.executable, str(ROOT / "bench" / "run.py"), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=session,
                            preexec_fn=ctrl_c_reaches)


def _wait_for_steps(root: Path, n: int, proc: subprocess.Popen, timeout: float = 240) -> Path:
    t0 = time.time()
    while time.time() - t0 < timeout:
        runs = [p for p in root.glob("*/*") if p.is_dir() and (p / "steps.jsonl").exists()]
        if runs and len((runs[0] / "steps.jsonl").read_text().splitlines()) >= n:
            return runs[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pytest.fail("run did not progress")


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    ref = run_cli([*ARGS, *GRAVAC, f"experiment.results_root={tmp_path / 'ref'}"])
    assert ref.returncode == 0, failure(ref)
    ref_run = _only_run(tmp_path / "ref")

    root = tmp_path / "killed"
    proc = _popen([*ARGS, *GRAVAC, f"experiment.results_root={root}"])
    run = _wait_for_steps(root, 14, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for name in ("steps.jsonl", "evals.jsonl"):   # every line written before the kill is valid
        _records(run, name)
    json.loads((run / "summary.json").read_text())

    res = run_cli([*ARGS, *GRAVAC, f"experiment.results_root={root}", f"experiment.resume={run}"])
    assert res.returncode == 0, failure(res)
    a, b = _records(ref_run, "steps.jsonl"), _records(run, "steps.jsonl")
    assert [r["step"] for r in b] == list(range(24))          # no duplicates, no gaps
    keys = ("loss", "cf", "floats_sent", "wire_bytes", "level", "cf_min", "cs", "delta_min", "delta_c")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    sa, sb = (json.loads((r / "summary.json").read_text()) for r in (ref_run, run))
    assert sa["floats_sent"] == sb["floats_sent"] and sb["status"] == "completed"
    assert [e["metric"] for e in _records(ref_run, "evals.jsonl")] == [e["metric"] for e in _records(run, "evals.jsonl")]
    wa, wb = torch.load(ref_run / "model.pt"), torch.load(run / "model.pt")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGTERM"])
def test_stop_signal_then_resume_equals_uninterrupted(tmp_path, sig):
    """A soft stop finishes the step whose batch was drawn and checkpoints the next boundary, so the
    resumed run is bit-identical to one never stopped (the stop once saved one batch ahead)."""
    args = [*ARGS, *GRAVAC, "train.checkpoint_every=0"]
    ref = run_cli([*args, f"experiment.results_root={tmp_path / 'ref'}"])
    assert ref.returncode == 0, failure(ref)
    root = tmp_path / "stopped"
    proc = _popen([*args, f"experiment.results_root={root}"])
    run = _wait_for_steps(root, 11, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    res = run_cli([*args, f"experiment.results_root={root}", f"experiment.resume={run}"])
    assert res.returncode == 0, failure(res)
    a, b = _records(_only_run(tmp_path / "ref"), "steps.jsonl"), _records(run, "steps.jsonl")
    assert [r["step"] for r in b] == list(range(24))
    keys = ("loss", "cf", "floats_sent", "wire_bytes", "level", "delta_min", "delta_c")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]


def test_sigint_checkpoints_and_says_how_to_resume(tmp_path):
    proc = _popen([*ARGS, "train.steps=400", "train.checkpoint_every=0", f"experiment.results_root={tmp_path}"])
    run = _wait_for_steps(tmp_path, 3, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "experiment.resume=" in err and "Traceback" not in err
    assert not [line for line in err.splitlines() if line.startswith("error:")], err   # a stop is no error
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["resume_command"] == f"{(run / 'command.txt').read_text().strip()} experiment.resume={run}"
    assert (run / "checkpoint" / "latest").exists()
    steps = _records(run, "steps.jsonl")
    assert len(steps) == summary["steps"]


def test_resume_refuses_a_different_config(tmp_path):
    r = run_cli([*ARGS, "train.steps=4", f"experiment.results_root={tmp_path}"])
    assert r.returncode == 0, failure(r)
    run = _only_run(tmp_path)
    r = run_cli([*ARGS, "train.steps=8", "train.lr=0.05", f"experiment.results_root={tmp_path}",
                 f"experiment.resume={run}"])
    assert r.returncode == 2
    assert "refusing to resume" in r.stderr and "train.lr" in r.stderr and "Traceback" not in r.stderr


def test_resume_without_checkpoint_is_explained(tmp_path):
    r = run_cli([*ARGS, "train.steps=2", "train.checkpoint_every=0", f"experiment.results_root={tmp_path}"])
    assert r.returncode == 0
    r = run_cli([*ARGS, "train.steps=2", "train.checkpoint_every=0", f"experiment.resume={_only_run(tmp_path)}"])
    assert r.returncode == 2 and "has no checkpoint" in r.stderr


@pytest.mark.slow   # 14-33 s: the default suite stays near 15 min; CI runs it with -m slow
def test_two_concurrent_runs_keep_separate_valid_results(tmp_path):
    args = [*ARGS, "train.steps=6", "cluster=ddp", f"experiment.results_root={tmp_path}"]
    procs = [_popen(args), _popen(args)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    runs = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    assert len(runs) == 2
    for run in runs:
        assert len(_records(run, "steps.jsonl")) == 6
        assert json.loads((run / "summary.json").read_text())["status"] == "completed"


# slow: ~85 s, the longest default test; CI runs it with the slow ones
@pytest.mark.slow
def test_lm_run_extended_from_its_final_checkpoint_equals_a_longer_run(tmp_path):
    """The LM's carried hidden states and dropout RNG are part of the checkpoint."""
    from conftest import data_dir
    data_dir("ptb")
    lm = ["model=lstm_mini", "model.embed_size=32", "model.hidden_size=32", "dataset.bptt=10", "train.eval_every=5",
          "train.checkpoint_every=5", "cluster.workers=2", "cluster.threads=1", "logger.progress=false",
          "method=gravac", "compressor=topk", "method.window=4", "method.epsilon=0.2",
          "method.omega=0"]  # decisions by gains only (see GRAVAC)
    ref = run_cli([*lm, "train.steps=16", f"experiment.results_root={tmp_path / 'ref'}"])
    assert ref.returncode == 0, failure(ref)
    short = run_cli([*lm, "train.steps=8", f"experiment.results_root={tmp_path / 'ext'}"])
    assert short.returncode == 0, failure(short)
    run = _only_run(tmp_path / "ext")
    ext = run_cli([*lm, "train.steps=16", f"experiment.results_root={tmp_path / 'ext'}", f"experiment.resume={run}"])
    assert ext.returncode == 0, failure(ext)
    a, b = _records(_only_run(tmp_path / "ref"), "steps.jsonl"), _records(run, "steps.jsonl")
    assert [(r["loss"], r["cf"]) for r in a] == [(r["loss"], r["cf"]) for r in b] and len(b) == 16


@pytest.mark.slow          # ~30 s idle; the resume of a finished run is also in the slow LM extension test
def test_extended_run_reports_its_new_total_and_a_shorter_resume_is_refused(tmp_path):
    """Resuming with more steps records the new total_steps; fewer steps than the checkpoint is a
    one-line error, not a silent no-op (issue 21 case 10)."""
    args = [*ARGS, "train.steps=8", f"experiment.results_root={tmp_path}"]
    r = run_cli(args)
    assert r.returncode == 0, failure(r)
    run = _only_run(tmp_path)
    short = run_cli([*ARGS, "train.steps=4", f"experiment.results_root={tmp_path}", f"experiment.resume={run}"])
    assert short.returncode == 2 and "checkpoint is at step 8, beyond this command's 4 steps" in short.stderr
    assert "Traceback" not in short.stderr
    longer = run_cli([*ARGS, "train.steps=12", f"experiment.results_root={tmp_path}", f"experiment.resume={run}"])
    assert longer.returncode == 0, failure(longer)
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["total_steps"], summary["status"]) == (12, 12, "completed")


def _damage(run: Path, other: Path, case: str) -> None:
    ck = run / "checkpoint"
    step = (ck / "latest").read_text().strip()
    pt = ck / step / "rank-0.pt"
    if case == "empty latest":
        (ck / "latest").write_text("")
    elif case == "garbled latest":
        (ck / "latest").write_bytes(b"\x00\xffstep-x")
    elif case == "latest names a missing step":
        (ck / "latest").write_text("step-00000099\n")
    elif case == "truncated file":
        pt.write_bytes(pt.read_bytes()[:100])
    elif case == "random bytes":
        pt.write_bytes(os.urandom(4096))
    elif case == "file of another run":   # with its own matching checksum
        src = other / "checkpoint" / step
        shutil.copy(src / "rank-0.pt", pt)
        shutil.copy(src / "rank-0.pt.sha256", ck / step / "rank-0.pt.sha256")


DAMAGE = {"empty latest": "is damaged (holds ''", "garbled latest": "is damaged",
          "latest names a missing step": "names step-00000099, but",
          "truncated file": "is damaged (its SHA-256 differs", "random bytes": "is damaged (its SHA-256 differs",
          "file of another run": "belongs to run"}


@pytest.fixture(scope="module")
def two_checkpointed_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ck")
    runs = []
    for name in ("a", "b"):
        r = run_cli([*ARGS, "train.steps=8", f"experiment.results_root={root / name}"])
        assert r.returncode == 0, failure(r)
        runs.append(_only_run(root / name))
    return runs


@pytest.fixture(scope="module")
def damaged_resumes(tmp_path_factory, two_checkpointed_runs):
    """Each DAMAGE case: a copy of run a, damaged, and the resume of it (two at a time);
    {case: (run folder, its files and steps.jsonl before the resume, the resume's result)}."""
    a, b = two_checkpointed_runs
    cases, jobs = {}, []
    for case in DAMAGE:
        root = tmp_path_factory.mktemp("damaged")
        run = root / a.name
        shutil.copytree(a, run)
        _damage(run, b, case)
        cases[case] = (run, sorted(p.relative_to(run) for p in run.rglob("*")), (run / "steps.jsonl").read_text())
        jobs.append(dict(args=[*ARGS, "train.steps=12", f"experiment.results_root={root}",
                               f"experiment.resume={run}"]))
    return {case: (*cases[case], r) for case, r in zip(DAMAGE, run_cli_many(jobs))}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_checkpoint_stops_in_one_line_and_deletes_nothing(damaged_resumes, case):
    """Issue 21 case 2: never a silent restart from step 0, never a traceback, the folder kept."""
    run, before, steps_before, r = damaged_resumes[case]
    assert r.returncode == 2, failure(r)
    assert DAMAGE[case] in r.stderr and "Traceback" not in r.stderr
    assert (run / "steps.jsonl").read_text() == steps_before
    assert set(before) <= {p.relative_to(run) for p in run.rglob("*")}


class _WritesAFile:
    """Unpickled, it opens (so creates) `path`: what a crafted checkpoint could do to torch.load."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(two_checkpointed_runs, tmp_path):
    """Issue 33 case 1: the checksum proves a file undamaged, not who wrote it. A rank file of the
    right run and step whose pickle runs code, with its matching .sha256, is refused in one line
    (checkpoints are loaded with weights_only=True) and the code never runs."""
    a, _ = two_checkpointed_runs
    run = tmp_path / a.name
    shutil.copytree(a, run)
    step = (run / "checkpoint" / "latest").read_text().strip()
    pt, marker = run / "checkpoint" / step / "rank-0.pt", tmp_path / "written-by-the-pickle"
    torch.save({"run": run.name, "step": int(step[len("step-"):]), "state": _WritesAFile(marker)}, pt)
    (pt.parent / "rank-0.pt.sha256").write_text(hashlib.sha256(pt.read_bytes()).hexdigest() + "\n")
    r = run_cli([*ARGS, "train.steps=12", f"experiment.results_root={tmp_path}", f"experiment.resume={run}"])
    assert not marker.exists()
    assert r.returncode == 2, failure(r)
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "refusing to load it (it could run code)" in errors[0], failure(r)


def test_a_state_that_is_not_plain_is_refused_when_saved(tmp_path):
    """A plug-in whose state_dict holds a numpy scalar would write a checkpoint no resume can load:
    the save says which entry, before anything is written."""
    import numpy as np

    from gravac.loop.checkpoint import check_plain
    check_plain({"model": {"w": torch.zeros(2)}, "t": (1, 2.0, None, "x", [True])})
    with pytest.raises(TypeError, match=r"checkpoint state\['method'\]\['ewma'\] is a numpy.float64"):
        check_plain({"method": {"ewma": np.float64(0.5)}})


def _link_out(run: Path, outside: Path, case: str) -> None:
    """Plant in `run` a symbolic link into the folder `outside` (made here, with something to lose)."""
    outside.mkdir()
    if case == ".lock to a file":            # the lock wrote its pid into the file
        (outside / "precious.txt").write_text("precious\n")
        (run / ".lock").unlink(missing_ok=True)
        (run / ".lock").symlink_to(outside / "precious.txt")
    elif case == "checkpoint/ to a folder":  # rotation deleted the folder's step-* folders
        shutil.move(run / "checkpoint", outside / "checkpoint")
        (outside / "checkpoint" / "step-00000099").mkdir()
        (outside / "checkpoint" / "step-00000099" / "precious.txt").write_text("precious\n")
        (run / "checkpoint").symlink_to(outside / "checkpoint", target_is_directory=True)
    elif case == "steps.jsonl to a new file":   # opening the records created it
        (run / "steps.jsonl").unlink()
        (run / "steps.jsonl").symlink_to(outside / "created.jsonl")


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


LINKS = [".lock to a file", "checkpoint/ to a folder", "steps.jsonl to a new file"]


@pytest.fixture(scope="module")
def linked_resumes(tmp_path_factory, two_checkpointed_runs):
    """Each LINKS case: a copy of run a with the link planted, resumed (two at a time);
    {case: (run folder, the outside folder, its contents before the resume, the resume's result)}."""
    a, _ = two_checkpointed_runs
    cases, jobs = {}, []
    for case in LINKS:
        root = tmp_path_factory.mktemp("linked")
        run, outside = root / a.name, root / "outside"
        shutil.copytree(a, run)
        _link_out(run, outside, case)
        cases[case] = (run, outside, _tree(outside))
        jobs.append(dict(args=[*ARGS, "train.steps=12", f"experiment.results_root={root}", f"experiment.resume={run}"]))
    return {case: (*cases[case], r) for case, r in zip(LINKS, run_cli_many(jobs))}


@pytest.mark.parametrize("case", LINKS)
def test_a_symlink_out_of_the_run_folder_is_never_written_through(linked_resumes, case):
    """Issue 33 case 2: a link planted in a run folder made the lock overwrite another file with
    its pid, checkpoint rotation delete another folder's contents, the records create a file
    elsewhere. Every write, rename and delete goes through gravac.loop.results.run_path: the run stops
    in one line naming the link, and nothing outside the folder changes."""
    run, outside, before, r = linked_resumes[case]
    assert _tree(outside) == before
    assert r.returncode == 2, failure(r)
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    link = run / case.split(" ")[0].rstrip("/")
    assert len(errors) == 1 and f"{link} is a symbolic link out of the run folder" in errors[0], failure(r)


def test_a_second_process_on_a_running_folder_is_refused_with_the_holder(tmp_path):
    """Issue 21 case 9: one run folder, one process; the other says who holds it."""
    proc = _popen([*ARGS, "train.steps=400", "train.checkpoint_every=2", f"experiment.results_root={tmp_path}"])
    run = _wait_for_steps(tmp_path, 4, proc)
    try:
        r = run_cli([*ARGS, "train.steps=400", "train.checkpoint_every=2", f"experiment.results_root={tmp_path}",
                     f"experiment.resume={run}"], timeout=120)
        assert r.returncode == 2, failure(r)
        assert f"is in use by process {proc.pid}" in r.stderr and "Traceback" not in r.stderr
        assert proc.poll() is None                # the first run goes on untouched
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    assert proc.returncode == 130


def _rdzv_folders() -> set[str]:
    import tempfile
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("gravac-rdzv-")}


@pytest.mark.slow          # ~35 s idle each; the default suite stops and resumes a sim run (SIGINT)
@pytest.mark.parametrize("how", ["SIGTERM to the launcher", "Ctrl-C to the process group"])
def test_ddp_stop_then_resume_equals_uninterrupted(tmp_path, how):
    """Issue 21 cases 1 and 5 on ddp: the launcher forwards SIGTERM (a terminal's Ctrl-C reaches
    every worker itself), waits for the workers' checkpoint, exits 130, removes its rendezvous
    folder; the resumed run equals an uninterrupted one. Issue 20: the resume hint is said once,
    not as an error, without torch's termination warning, and summary.json keeps the whole
    command, which resumes the run as written."""
    args = [*ARGS, *GRAVAC, "cluster=ddp", "train.checkpoint_every=0", "train.steps=16"]
    ref = run_cli([*args, f"experiment.results_root={tmp_path / 'ref'}"])
    assert ref.returncode == 0, failure(ref)
    before = _rdzv_folders()
    root = tmp_path / "stopped"
    proc = _popen([*args, f"experiment.results_root={root}"], session=True)
    run = _wait_for_steps(root, 6, proc)
    if how.startswith("SIGTERM"):
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    said = out + err
    assert said.count("Resume with:") == 1 and said.count("experiment.resume=") == 1, said[-2000:]
    assert not [line for line in said.splitlines() if line.startswith("error:")], said[-2000:]
    assert "Traceback" not in said and "Terminating process" not in said
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "Resume with" not in summary["error"]
    assert summary["resume_command"] in said
    assert summary["resume_command"].startswith((run / "command.txt").read_text().strip() + " ")
    assert not (_rdzv_folders() - before)
    res = subprocess.run(summary["resume_command"].replace("python", sys.executable, 1), shell=True, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, failure(res)
    a, b = _records(_only_run(tmp_path / "ref"), "steps.jsonl"), _records(run, "steps.jsonl")
    assert [r["step"] for r in b] == list(range(16))
    keys = ("loss", "cf", "floats_sent", "wire_bytes", "level")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]


@pytest.mark.parametrize("size", [pytest.param("120k", marks=pytest.mark.slow), "300k"])
def test_a_full_disk_mid_run_ends_in_one_line_with_status_failed_and_no_temporaries(tmp_path, size):
    """Issue 21 case 6: a results root on a tiny tmpfs fills up mid-run (records or checkpoint)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        r = run_cli([*ARGS, "train.steps=400", "train.eval_every=1000", "train.checkpoint_every=5",
                     f"experiment.results_root={mnt}"], timeout=300)
        assert r.returncode == 2, failure(r)
        err = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(err) == 1 and "No space left on device" in err[0] and "Traceback" not in r.stderr
        run = _only_run(mnt)
        assert not [p for p in run.rglob("*") if "tmp" in p.name]
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "failed" and "No space left on device" in summary["error"]
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


@pytest.mark.slow   # 14-33 s: the default suite stays near 15 min; CI runs it with -m slow
def test_a_hung_ddp_worker_is_named_and_the_run_ends_soon_after_the_timeout(tmp_path):
    """Issue 21 case 4: rank 1 hangs at step 6; rank 0 times out. The error names rank 1 (it was
    rank 0 before) and the launcher kills the hung worker at once instead of waiting 30 s."""
    t0 = time.monotonic()
    r = run_cli([*ARGS, "cluster=ddp", "cluster.timeout_s=5", "train.steps=20", f"experiment.results_root={tmp_path}"],
                env={"GRAVAC_FAULT": "1:6:hang"}, timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 2, failure(r)
    assert "error: worker rank 1 stopped answering at step 6" in r.stderr
    summary = json.loads((_only_run(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "failed" and "rank 1 stopped answering" in summary["error"]
    print(f"hung worker: run ended after {took:.0f} s (timeout 5 s + start-up)")


def test_when_rank_0_dies_the_summary_counts_the_steps_it_recorded_and_says_why(tmp_path):
    """Issue 21 case 10: the summary said steps 0 and error null while steps.jsonl held the steps."""
    r = run_cli([*ARGS, "cluster=ddp", "train.steps=20", "train.eval_every=100", f"experiment.results_root={tmp_path}"],
                env={"GRAVAC_FAULT": "0:9:exit"}, timeout=300)
    assert r.returncode == 2, failure(r)
    run = _only_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"]
    assert summary["steps"] == len(_records(run, "steps.jsonl")) == 9


# ---------------------------------------------------------------------------------------------
# issue 33: resume commands for any folder name, and stops before the first step or mid-abort

def test_the_resume_command_is_quoted_for_hydra_and_the_shell():
    """Issue 33, case 7: shell quoting alone left values Hydra's grammar refuses unquoted."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from gravac.run.launch import resume_command
    parse = OverridesParser.create().parse_override
    for run in ["results/runs/default/20250101-x", "/tmp/my res [1]/résumé-実験/run", "it's", 'say "a,b"', "a\\",
                "${oc.env:HOME}", "123", "glob(*)"]:
        argv = shlex.split(resume_command("python bench/run.py 'experiment.name=\"a b\"'", run))
        assert argv[:3] == ["python", "bench/run.py", 'experiment.name="a b"'] and len(argv) == 4
        value = parse(argv[3]).value()
        assert value == run.replace("${", "\\${"), (run, argv[3], value)     # \${: a literal ${ for OmegaConf
    assert resume_command("c", "results/runs/x") == "c experiment.resume=results/runs/x"   # plain stays plain


@pytest.mark.slow   # 14-33 s: the default suite stays near 15 min; CI runs it with -m slow
def test_the_printed_resume_command_pastes_into_a_shell_for_any_folder_name(tmp_path):
    """The resume line and command.txt are quoted for the shell (issue 21 case 10: a space in the
    path) and for Hydra's grammar (issue 33 case 7: `résumé-実験` or `my res [1]` gave
    LexerNoViableAltException when pasted): pasted into a shell as printed, they resume the run."""
    root = tmp_path / "my res [1]"
    args = [a for a in ARGS if not a.startswith("train.steps=")]
    proc = _popen([*args, "train.steps=30", "train.checkpoint_every=0", 'experiment.name="résumé-実験"',
                   f'experiment.results_root="{root}"'])
    run = _wait_for_steps(root, 2, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    printed = err.split("Resume with:\n", 1)[1].splitlines()[0].strip()
    assert printed == json.loads((run / "summary.json").read_text())["resume_command"]
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])   # `python` is this one
    r = subprocess.run(["bash", "-c", printed], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PATH": path})
    assert r.returncode == 0, failure(r)
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert [s["step"] for s in _records(run, "steps.jsonl")] == list(range(30))


def _in_process(overrides: list[str]):
    from conftest import compose

    from gravac.config.compose import build_config
    return build_config(compose(overrides), overrides=overrides)


@pytest.mark.parametrize("where,at", [("in a step", 5), ("in the stop's checkpoint", 6)])
def test_a_second_signal_aborts_saying_at_which_step_and_what_resumes_it(tmp_path, monkeypatch, where, at):
    """Issue 33: a second Ctrl-C at step 5 said "interrupted before the first step; nothing to
    resume"; one that cut the stop's checkpoint short (torch reports it as a failed write) said
    "cannot write ...; free space or fix permissions" with a free disk."""
    from gravac.loop import track
    from gravac.core.errors import Interrupted
    from gravac.run.launch import launch
    overrides = [*[a for a in ARGS if not a.startswith(("train.steps=", "train.checkpoint_every="))],
                 "train.steps=50", "train.checkpoint_every=4", f"experiment.results_root={tmp_path}"]
    armed, real_step, real_save = [], track.Tracker.step, torch.save

    def step(self, record, postfix):     # after step 4: a Ctrl-C, then another now or while the stop checkpoints
        real_step(self, record, postfix)
        if record["step"] == 4:
            os.kill(os.getpid(), signal.SIGINT)
            if where == "in a step":
                os.kill(os.getpid(), signal.SIGINT)
            armed.append(where != "in a step")

    def save(obj, f, *args, **kwargs):
        if not any(armed):
            return real_save(obj, f, *args, **kwargs)
        armed.clear()

        class Interrupting:           # the file the checkpoint is written to, and a Ctrl-C midway
            writes = 0

            def write(self, b):
                self.writes += 1
                if self.writes == 3:
                    os.kill(os.getpid(), signal.SIGINT)
                return f.write(b)

            def flush(self):
                f.flush()
        return real_save(obj, Interrupting(), *args, **kwargs)
    monkeypatch.setattr(track.Tracker, "step", step)
    monkeypatch.setattr(torch, "save", save)
    try:
        launch(_in_process(overrides), overrides)
        raised = None
    except BaseException as e:  # noqa: BLE001 - a bare KeyboardInterrupt would end the test session
        raised = e
    assert isinstance(raised, Interrupted), repr(raised)
    run = _only_run(tmp_path)
    why = f"aborted by a second signal at step {at}; the checkpoint at step 4 resumes it"
    resume = f"{(run / 'command.txt').read_text().strip()} experiment.resume={run}"
    assert (str(raised), raised.resume) == (why, resume)
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"], summary["steps"], summary["error"], summary["resume_command"]) == \
        ("interrupted", at, why, resume)
    assert (run / "checkpoint" / "latest").read_text().strip() == "step-00000004"
    assert not [p for p in run.rglob("*") if "tmp" in p.name]


@pytest.mark.parametrize("cluster", ["sim", pytest.param("ddp", marks=pytest.mark.slow)])
def test_ctrl_c_before_the_first_step_is_an_interruption_not_a_failure(tmp_path, cluster):
    """Issue 33: Ctrl-C during the device calibration (sim) or the workers' start-up (ddp, a Ctrl-C
    to the process group) recorded status failed, error KeyboardInterrupt."""
    root = tmp_path / "runs"
    proc = _popen([*ARGS, f"cluster={cluster}", "clock.repeats=1000000", f"clock.cache_dir={tmp_path / 'cache'}",
                   f"experiment.results_root={root}"], session=True)
    t0 = time.time()
    try:
        while not list(root.glob("*/*/command.txt")):       # the run has begun; calibration takes minutes
            assert proc.poll() is None and time.time() - t0 < 240, proc.communicate(timeout=60)
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:   # a run the signal did not stop would calibrate for hours beside the rest of the suite
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert (proc.returncode, err) == (130, "interrupted before the first step; nothing to resume\n")
    summary = json.loads((_only_run(root) / "summary.json").read_text())
    assert (summary["status"], summary["error"], summary["steps"]) == \
        ("interrupted", "interrupted before the first step; nothing to resume", 0)


def test_ctrl_c_while_the_config_is_checked_is_one_line(tmp_path):
    """Issue 33: a Ctrl-C before the run began (here: a plug-in module loading) printed a traceback."""
    (tmp_path / "slow_plugin.py").write_text("import time\nprint('plugin loading', flush=True)\ntime.sleep(300)\n")
    env = {**os.environ, "GRAVAC_PLUGINS": "slow_plugin",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "run.py"), "train.steps=1"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches)
    try:
        assert proc.stdout.readline().strip() == "plugin loading"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (130, "interrupted before the run started; nothing to resume\n")
