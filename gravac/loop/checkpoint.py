"""Checkpoints that survive a kill at any moment, and a clean stop on Ctrl-C / SIGTERM.

Layout inside a run folder: `checkpoint/step-NNNNNNNN/rank-R.pt` (one file per process, holding
its local workers' state), and `checkpoint/latest` naming the newest *complete* step folder.
`latest` is replaced atomically only after every process has written its file, so a kill during
a save leaves the previous checkpoint in force.

A checkpoint holds only tensors and plain values (dict, list, tuple, str, int, float, bool, None)
and is loaded with `torch.load(weights_only=True)`: a crafted file, even with a matching checksum,
cannot run code; a state that is not plain is refused when saved, not on resume.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pickle
import re
import shutil
import signal
from collections import OrderedDict

import torch

from gravac.core.errors import UserError
from gravac.core.io import atomic_write, open_new, run_path


class Checkpointer:
    """Saves and loads this process's share of a run's state under `run_dir/checkpoint`.

    Each rank file has a SHA-256 beside it and carries the run folder's name, so a truncated or
    garbled file, a file copied from another run or a `latest` naming nothing is detected on
    resume and stops the run in one line; it never silently restarts from step 0.
    """

    def __init__(self, run_dir: str | None, group=None):
        self.group = group      # None: only reads where the run stands (checkpoint_step)
        self.dir = run_dir
        self.root = run_path(run_dir, "checkpoint") if run_dir else None   # refused at once if it links out
        self.run = os.path.basename(os.path.normpath(run_dir)) if run_dir else ""
        self.rank = group.local_ranks[0] if group is not None else 0

    def _step_dir(self, step: int) -> str:
        return run_path(self.dir, "checkpoint", f"step-{step:08d}")

    def save(self, step: int, state: dict) -> None:
        """Write this process's state for `step` (the next step to run), then publish it."""
        check_plain(state)
        d = self._step_dir(step)
        os.makedirs(d, exist_ok=True)
        final = os.path.join(d, f"rank-{self.rank}.pt")
        tmp = os.path.join(d, f".rank-{self.rank}.pt.tmp")
        try:
            with open_new(tmp) as f:   # closed even when the write fails, so removing it frees the space
                torch.save({"run": self.run, "step": step, "state": state}, f)
            atomic_write(final + ".sha256", _sha256(tmp) + "\n")
            os.replace(tmp, final)
        except BaseException as e:   # e.g. a full disk: the previous checkpoint stays in force
            for junk in (tmp, final + ".sha256"):
                with contextlib.suppress(OSError):
                    os.remove(junk)
            if isinstance(e, RuntimeError):   # torch.save reports a short write as a RuntimeError
                st = os.statvfs(d)
                full = st.f_bavail * st.f_frsize < 1 << 20
                raise OSError(errno.ENOSPC if full else errno.EIO,
                              os.strerror(errno.ENOSPC) if full else str(e).splitlines()[0], final) from None
            raise
        self.group.barrier()  # every process has written before `latest` moves
        if self.group.is_main:
            atomic_write(run_path(self.dir, "checkpoint", "latest"), os.path.basename(d) + "\n")
            for old in os.listdir(run_path(self.dir, "checkpoint")):
                if old.startswith("step-") and old != os.path.basename(d):
                    shutil.rmtree(run_path(self.dir, "checkpoint", old), ignore_errors=True)
        self.group.barrier()

    def latest_step(self) -> int | None:
        """The step the newest complete checkpoint resumes at; None when there is none; a
        UserError when `latest` is damaged or names a missing folder."""
        if not self.root:
            return None
        path = os.path.join(self.root, "latest")
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            return None
        m = re.fullmatch(r"step-(\d{8})", text.strip())
        if not m:
            raise UserError(f"checkpoint pointer {path} is damaged (holds {text[:40]!r}, not step-NNNNNNNN): "
                            "the run cannot be resumed from it; start a new run")
        step = int(m.group(1))
        if not os.path.isdir(self._step_dir(step)):
            raise UserError(f"{path} names {m.group(0)}, but {self._step_dir(step)} is missing: the run "
                            "cannot be resumed; start a new run")
        return step

    def resumable_step(self) -> int | None:
        """latest_step(), or None when the pointer is damaged: what a stopped run can say."""
        try:
            return self.latest_step()
        except UserError:
            return None

    def load(self, step: int) -> dict:
        """This rank's state at `step`, after checking its checksum and that it is this run's."""
        path = os.path.join(self._step_dir(step), f"rank-{self.rank}.pt")
        try:
            with open(path + ".sha256") as f:
                expected = f.read().strip()
        except OSError:
            expected = None
        if not os.path.isfile(path):
            raise UserError(f"checkpoint file {path} is missing: the run cannot be resumed; start a new run")
        if expected is not None and _sha256(path) != expected:
            raise UserError(f"checkpoint file {path} is damaged (its SHA-256 differs from the one saved with it): "
                            "the run cannot be resumed; start a new run")
        try:
            box = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # truncated, not a checkpoint at all, or naming what no checkpoint holds
            found = re.search(r"GLOBAL ([\w.]+)", str(e)) if isinstance(e, pickle.UnpicklingError) else None
            if found:
                raise UserError(f"checkpoint file {path} holds {found.group(1)}, not only tensors and plain values: "
                                "refusing to load it (it could run code); start a new run") from None
            raise UserError(f"checkpoint file {path} cannot be read ({type(e).__name__}): the run cannot be "
                            "resumed; start a new run") from None
        if not isinstance(box, dict) or "state" not in box or box.get("step") != step:
            raise UserError(f"checkpoint file {path} is not a step-{step} checkpoint of this suite")
        if box.get("run") != self.run:
            raise UserError(f"checkpoint file {path} belongs to run {box.get('run')!r}, not {self.run!r}: "
                            "copy the whole run folder, or start a new run")
        return box["state"]


def checkpoint_step(run_dir: str) -> int | None:
    """The step the newest complete checkpoint in `run_dir` resumes at; None when it has none
    (or its pointer is damaged, or `checkpoint` links out of the folder): what a process
    reporting on a run it did not run can say."""
    try:
        return Checkpointer(run_dir).resumable_step()
    except UserError:
        return None


def stop_note(what: str, steps: int, checkpoint: int | None) -> str:
    """One line for a run that ended where it could not checkpoint (a second signal, a kill, a
    stop before the first step): what happened, at which step, and whether a checkpoint resumes it."""
    where = f"{what} at step {steps}" if steps else f"{what} before the first step"
    if checkpoint is not None:
        return f"{where}; the checkpoint at step {checkpoint} resumes it"
    return f"{where}; nothing to resume" + (" (no checkpoint: train.checkpoint_every=N saves one every N steps)"
                                            if steps else "")


PLAIN = (str, int, float, bool, type(None))


def check_plain(obj, where: str = "state") -> None:
    """Refuse (TypeError naming the entry) anything `torch.load(weights_only=True)` would not load
    back: a method or plug-in whose state holds e.g. a numpy scalar or its own class must convert
    it to tensors and plain values in its state_dict()."""
    if isinstance(obj, torch.Tensor) or type(obj) in PLAIN:
        return
    if type(obj) in (dict, OrderedDict):
        for k, v in obj.items():
            check_plain(k, f"{where} key")
            check_plain(v, f"{where}[{k!r}]")
    elif type(obj) in (list, tuple):
        for i, v in enumerate(obj):
            check_plain(v, f"{where}[{i}]")
    else:
        raise TypeError(f"checkpoint {where} is a {type(obj).__module__}.{type(obj).__qualname__}: a checkpoint "
                        "holds only tensors and plain values (dict, list, tuple, str, int, float, bool, None); "
                        "convert it in the state_dict() that returns it")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


STOP_ENV = "GRAVAC_SWEEP_STOP"      # a sweep's stop file (gravac.run.sweep), inherited by its jobs


def stop_requested() -> bool:
    """Whether this process's sweep was asked to stop (its stop file exists)."""
    path = os.environ.get(STOP_ENV)
    return bool(path) and os.path.exists(path)


def request_stop() -> None:
    """Ask every job of this process's sweep to stop: running ones checkpoint at their next step,
    later ones do not start."""
    path = os.environ.get(STOP_ENV)
    if path:
        try:
            open(path, "a").close()
        except OSError:   # the folder is gone or unwritable: signals still stop this job
            pass


class StopFlag:
    """Turns SIGINT/SIGTERM, or the sweep's stop file, into a request to stop at the next step
    boundary.

    Stopping mid-step would leave weights, residuals and records out of step with each other;
    the loop instead finishes the step, agrees with the other workers to stop, checkpoints and
    exits. A second signal aborts at once (a KeyboardInterrupt, and `aborted` says so, as torch
    reports a write it cut short as a failed write); later ones are ignored while the run records
    where it stopped. The stop file lets a sweep stop jobs it does not signal (its local jobs,
    SLURM jobs).
    """

    def __init__(self):
        self._requested = False
        self.aborted = False
        self._old = {}

    @property
    def requested(self) -> bool:
        """Read once a step: a signal came, or the sweep's stop file appeared."""
        self._requested = self._requested or stop_requested()
        return self._requested

    def _handler(self, signum, frame):
        if self.aborted:
            return
        if self._requested:
            self.aborted = True
            raise KeyboardInterrupt
        self._requested = True

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: signals stay as they are
                pass
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False
