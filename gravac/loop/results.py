"""Run outputs: config, per-step and per-evaluation records, and a summary, all crash-safe.

Records are appended one JSON line at a time and flushed, so a killed run leaves every line but
possibly a torn last one (readers skip it); the config and summary are replaced atomically
(temp file + rename), so they are always either the old or the new complete version.

Every path written, renamed or deleted under a run folder comes from `run_path`, which refuses a
symbolic link leading out of the folder; temporary files are created new (O_EXCL, O_NOFOLLOW),
never opened through a link.
"""
from __future__ import annotations

import errno
import json
import math
import os
import secrets
import time
from typing import Any

import yaml

from gravac.core.errors import UserError
from gravac.core.io import atomic_write, open_new, read_jsonl, run_path


def _clean(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become null (JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def make_run_dir(root: str, experiment: str, run_id: str, tag: str) -> str:
    """Create a fresh run folder; concurrent runs get distinct names (time, pid, random)."""
    base = os.path.join(root, experiment)
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as e:   # a file on the way (/dev/null), no permission, a full or read-only disk
        if e.errno == errno.ENAMETOOLONG:   # a filesystem with shorter names than the config check knows
            raise UserError(f"cannot create results folder {base}: a name in it is too long for this "
                            "filesystem; shorten experiment.name (or experiment.results_root)") from None
        raise UserError(f"cannot create results folder {base}: {e.strerror}; set experiment.results_root "
                        "to a writable folder") from None
    for _ in range(100):
        name = run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{tag}-{os.getpid()}{secrets.token_hex(2)}"
        path = os.path.join(base, name)
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            if run_id:
                raise UserError(f"run folder {path} exists already: choose another experiment.run_id, or "
                                f"continue it with experiment.resume={path}") from None
        except OSError as e:
            raise UserError(f"cannot create run folder {path}: {e.strerror}") from None
    raise RuntimeError(f"could not create a unique run folder under {base}")


class RunLock:
    """An exclusive lock on a run folder for as long as one process runs it, so a second resume
    of the same folder stops in one line instead of racing on its checkpoint (flock: released by
    the OS when the holder dies, so a killed run never leaves a stale lock)."""

    def __init__(self, run_dir: str):
        import fcntl
        self.path = run_path(run_dir, ".lock")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(self.fd)
            raise UserError(f"run folder {run_dir} is in use by process {holder}: wait for it to finish or "
                            "stop it, then resume") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)   # closing drops the lock
            self.fd = None


class RunWriter:
    """Writes one run's files; only the process hosting rank 0 has one."""

    def __init__(self, run_dir: str, config: dict):
        self.dir = run_dir
        if not os.path.exists(os.path.join(run_dir, "config.yaml")):  # a resumed run keeps its own
            atomic_write(run_path(run_dir, "config.yaml"), yaml.safe_dump(config, sort_keys=False))
        self._steps, self._evals = self._append("steps.jsonl"), self._append("evals.jsonl")
        self._ready = None

    def _append(self, name: str):
        """The run's record file `name`, opened for appending one line at a time."""
        return open(run_path(self.dir, name), "a", buffering=1)

    def step(self, record: dict) -> None:
        self._steps.write(json.dumps(_clean(record)) + "\n")

    def ready(self, record: dict) -> None:
        """ready.jsonl: every worker's gradient-ready times of a step (clock.record_ready)."""
        if self._ready is None:
            self._ready = self._append("ready.jsonl")
        self._ready.write(json.dumps(_clean(record)) + "\n")

    def eval(self, record: dict) -> None:
        self._evals.write(json.dumps(_clean(record)) + "\n")
        self._evals.flush()

    def truncate(self, step: int) -> None:
        """Drop records a resumed run will write again: steps >= `step`, evals after `step`."""
        self.close()
        for name, keep in (("steps.jsonl", lambda r: r["step"] < step), ("evals.jsonl", lambda r: r["step"] <= step),
                           ("ready.jsonl", lambda r: r["step"] < step)):
            path = run_path(self.dir, name)
            kept = [r for r in read_jsonl(path)[0] if keep(r)] if os.path.exists(path) else []
            atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept))
        self._steps, self._evals = self._append("steps.jsonl"), self._append("evals.jsonl")

    def save_model(self, state: dict) -> None:
        """Final weights as model.pt (written to a temp file, then renamed)."""
        import torch
        tmp = run_path(self.dir, f".model.pt.tmp.{os.getpid()}")
        with open_new(tmp) as f:
            torch.save(state, f)
        os.replace(tmp, run_path(self.dir, "model.pt"))

    def records(self) -> list[dict]:
        """Every step record of the run so far (steps.jsonl), for the method's closing explanation."""
        self._steps.flush()
        return read_jsonl(os.path.join(self.dir, "steps.jsonl"))[0]

    def summary(self, summary: dict) -> None:
        atomic_write(run_path(self.dir, "summary.json"), json.dumps(_clean(summary), indent=2) + "\n")

    def close(self) -> None:
        self._steps.close()
        self._evals.close()
        if self._ready is not None:
            self._ready.close()
            self._ready = None


class NullWriter:
    """Stands in for RunWriter on ranks that do not write."""
    dir = None

    def step(self, record: dict) -> None: ...
    def ready(self, record: dict) -> None: ...
    def truncate(self, step: int) -> None: ...
    def records(self) -> list[dict]: return []
    def save_model(self, state: dict) -> None: ...
    def eval(self, record: dict) -> None: ...
    def summary(self, summary: dict) -> None: ...
    def close(self) -> None: ...
