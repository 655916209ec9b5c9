"""Checkpoints that survive a kill at any moment, and a clean stop on Ctrl-C / SIGTERM.

Layout inside a run folder: `checkpoint/step-NNNNNNNN/rank-R.pt` (one file per process, holding
its local workers' state), and `checkpoint/latest` naming the newest *complete* step folder.
`latest` is replaced atomically only after every process has written its file, so a kill during
a save leaves the previous checkpoint in force.
"""
from __future__ import annotations

import os
import shutil
import signal

import torch

from gravac.results import atomic_write


class Checkpointer:
    """Saves and loads this process's share of a run's state under `run_dir/checkpoint`."""

    def __init__(self, run_dir: str | None, group):
        self.group = group
        self.root = os.path.join(run_dir, "checkpoint") if run_dir else None
        self.rank = group.local_ranks[0]

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.root, f"step-{step:08d}")

    def save(self, step: int, state: dict) -> None:
        """Write this process's state for `step` (the next step to run), then publish it."""
        d = self._step_dir(step)
        os.makedirs(d, exist_ok=True)
        tmp = os.path.join(d, f".rank-{self.rank}.pt.tmp")
        torch.save(state, tmp)
        os.replace(tmp, os.path.join(d, f"rank-{self.rank}.pt"))
        self.group.barrier()  # every process has written before `latest` moves
        if self.group.is_main:
            atomic_write(os.path.join(self.root, "latest"), os.path.basename(d) + "\n")
            for old in os.listdir(self.root):
                if old.startswith("step-") and old != os.path.basename(d):
                    shutil.rmtree(os.path.join(self.root, old), ignore_errors=True)
        self.group.barrier()

    def latest_step(self) -> int | None:
        """The step the newest complete checkpoint resumes at, or None."""
        if not self.root:
            return None
        try:
            with open(os.path.join(self.root, "latest")) as f:
                return int(f.read().strip().split("-")[1])
        except (OSError, ValueError, IndexError):
            return None

    def load(self, step: int) -> dict:
        path = os.path.join(self._step_dir(step), f"rank-{self.rank}.pt")
        return torch.load(path, map_location="cpu", weights_only=False)


class StopFlag:
    """Turns SIGINT/SIGTERM into a request to stop at the next step boundary.

    Stopping mid-step would leave weights, residuals and records out of step with each other;
    the loop instead finishes the step, agrees with the other workers to stop, checkpoints and
    exits. A second signal restores the default behaviour (an immediate KeyboardInterrupt).
    """

    def __init__(self):
        self.requested = False
        self._old = {}

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

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
