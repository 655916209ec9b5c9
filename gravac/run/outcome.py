"""How a run ended and how to continue it: the resume check and command, and `settle`, which makes
summary.json say how a run ended when its own process could not record it (killed, stopped
before its first step). Used by the launcher (launch.py) and the sweep's jobs (jobs.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import stat

import yaml

from gravac.loop.checkpoint import checkpoint_step, stop_note
from gravac.core.errors import UserError
from gravac.core.io import atomic_write, atomic_write_target, read_jsonl, run_path
from gravac.core.schema import RunConfig


# keys a resumed run may change: bookkeeping, not what is being measured
RESUMABLE = ("experiment.resume", "experiment.run_id", "experiment.results_root", "logger.", "train.steps",
             "train.epochs", "cluster.timeout_s", "cluster.threads", "clock.extend_machine", "setting.")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_resume(cfg: RunConfig) -> str:
    """The folder to resume into, after checking it holds a checkpoint of the same config."""
    run_dir = cfg.experiment.resume
    saved_path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(saved_path):
        raise UserError(f"experiment.resume={run_dir}: no run folder there (config.yaml missing)")
    if not os.path.isfile(os.path.join(run_dir, "checkpoint", "latest")):
        raise UserError(f"experiment.resume={run_dir}: the run has no checkpoint; set train.checkpoint_every=N "
                        "to checkpoint periodically (a run stopped by Ctrl-C checkpoints itself)")
    with open(saved_path) as f:
        saved = _flatten(yaml.safe_load(f))
    now = _flatten(dataclasses.asdict(cfg))
    diffs = [k for k in sorted(set(saved) | set(now))
             if saved.get(k) != now.get(k) and not k.startswith(RESUMABLE)]
    if diffs:
        shown = "; ".join(f"{k}: run has {saved.get(k)!r}, this command {now.get(k)!r}" for k in diffs[:4])
        raise UserError(f"refusing to resume {run_dir}: its config differs ({shown}); rerun the original command "
                        f"(see {os.path.join(run_dir, 'command.txt')}) with experiment.resume=")
    return run_dir


def command_line(overrides: list[str]) -> str:
    """`python bench/run.py OVERRIDES`, shell-quoted (the overrides are already in Hydra's syntax,
    as given on a command line or written by Hydra's sweeper); without experiment.resume."""
    return shlex.join(["python", "bench/run.py", *[o for o in overrides if not o.startswith("experiment.resume=")]])


def hydra_value(text: str) -> str:
    """`text` as a value of a Hydra override: as it is when Hydra reads it back unchanged, else
    quoted (spaces, brackets, commas, non-ASCII letters, a leading digit, '${')."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Quote, QuotedString
    if "${" not in text:
        try:
            if OverridesParser.create().parse_override(f"k={text}").value() == text:
                return text
        except Exception:  # noqa: BLE001 - Hydra's grammar refuses it unquoted
            pass
    quote = Quote.single if '"' in text and "'" not in text else Quote.double   # double reads best in a shell
    return QuotedString(text=text.replace("${", "\\${"), quote=quote).with_quotes()


def resume_command(command: str, run_dir: str) -> str:
    """The command that continues the run in `run_dir`, quoted for Hydra's override grammar and
    for the shell, so that it can be pasted whatever the folder's name."""
    return f"{command} {shlex.quote('experiment.resume=' + hydra_value(run_dir))}"


def _summary_path(run_dir: str) -> str | None:
    """run_dir/summary.json, or None when a link out of the folder stands in the way (the run's
    own error says so)."""
    try:
        return run_path(run_dir, "summary.json")
    except UserError:
        return None


def _read_summary(run_dir: str) -> dict:
    path = _summary_path(run_dir)
    if path is None:
        return {}
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, json.JSONDecodeError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _recorded_steps(run_dir: str, summary: dict) -> int:
    """Steps the run recorded: rank 0 may have died long after its last summary write."""
    path = os.path.join(run_dir, "steps.jsonl")
    return max(summary.get("steps") or 0, len(read_jsonl(path)[0]) if os.path.exists(path) else 0)


def settle(run_dir: str, status: str, what: str) -> tuple[str, str, str]:
    """How the run in `run_dir` ended: (status, one line, resume command or ""). When its process
    could not record its end (killed; a stop before the first step), summary.json is made to say
    `status`, `what` happened at which step, and whether a checkpoint resumes it (and how)."""
    summary = _read_summary(run_dir)
    if summary.get("status") not in (None, "running"):
        return summary["status"], summary.get("error") or "", summary.get("resume_command") or ""
    saved = checkpoint_step(run_dir)
    try:
        with open(os.path.join(run_dir, "command.txt")) as f:
            command = f.read().strip()
    except OSError:
        command = ""
    resume = resume_command(command, run_dir) if saved is not None and command else ""
    message = stop_note(what, _recorded_steps(run_dir, summary), saved)
    _mark_failed(run_dir, message, status=status, resume=resume)
    return status, message, resume


# what every new run folder holds before its first step: the records are still empty
FRESH_FILES = frozenset({"config.yaml", "command.txt", "summary.json", ".lock", "steps.jsonl", "evals.jsonl",
                         "ready.jsonl"})


def _fresh(name: str) -> bool:
    """One of FRESH_FILES, or atomic_write's temporary copy of one, which a worker killed while
    writing it leaves behind (a peer's failure kills it mid-start)."""
    return name in FRESH_FILES or atomic_write_target(name) in FRESH_FILES


def discard_unstarted(run_dir: str) -> bool:
    """Delete the new run folder `run_dir` when its run failed before recording anything (a
    missing dataset, a cluster too big for memory): no step, evaluation or checkpoint, only the
    files every run starts with, so a failed start leaves no empty run for plots and sweeps to
    trip over. Never call it for a resumed run. True when the folder is gone."""
    try:
        names = set(os.listdir(run_dir))
        entries = {n: os.lstat(os.path.join(run_dir, n)) for n in names}
    except OSError:
        return False
    if not all(_fresh(n) for n in names) or any(not stat.S_ISREG(e.st_mode) for e in entries.values()):
        return False             # a checkpoint, model.pt, a tracker's files or a link: keep it all
    if any(entries[n].st_size for n in ("steps.jsonl", "evals.jsonl", "ready.jsonl") if n in entries):
        return False
    if _read_summary(run_dir).get("status") not in (None, "running", "failed"):
        return False             # diverged at its first step, or stopped: the folder says so
    try:
        for name in names:
            os.unlink(os.path.join(run_dir, name))
        os.rmdir(run_dir)
    except OSError:
        return False
    try:
        os.rmdir(os.path.dirname(run_dir))   # the experiment's folder, if this run was all it held
    except OSError:
        pass
    return True


def _mark_failed(run_dir: str, reason: str, diagnosis: bool = False, status: str = "failed", resume: str = "") -> None:
    """Record in summary.json that a peer failed (rank 0 may have been killed mid-write), or
    another end the run could not record itself (`status`, with its resume command)."""
    path = _summary_path(run_dir)
    if path is None:
        return
    summary = _read_summary(run_dir)
    if not os.path.isdir(run_dir):
        return
    if summary.get("status") in (None, "running") or (summary.get("status") == "failed"
                                                       and (diagnosis or not summary.get("error"))):
        # a diagnosis (which rank fell silent) goes first; what rank 0 saw stays beside it
        seen = summary.get("error") if diagnosis and summary.get("error") else None
        summary.update(status=status, error=reason + (f" [rank 0: {seen}]" if seen else ""),
                       resume_command=resume or None, steps=_recorded_steps(run_dir, summary))
        try:
            atomic_write(path, json.dumps(summary, indent=2) + "\n")
        except OSError:   # the disk is full or the folder unwritable: the printed error says so
            pass
