"""Crash-safe files: paths that stay inside a run folder, files created anew, atomic writes, and
JSONL records read back past a torn last line. Every result file (runs, plots, benchmark CSVs)
is written through here. Part of gravac.core: imports nothing of the project.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os

from gravac.core.errors import UserError


def run_path(run_dir: str, *parts: str) -> str:
    """os.path.join(run_dir, *parts), after checking that no symbolic link on the way leads out of
    the run folder, so a link planted in it (`.lock` to another file, `checkpoint/` to another
    folder) never makes a write, rename or delete land outside. A UserError names the link."""
    path = os.path.join(run_dir, *parts)
    root = os.path.realpath(run_dir)
    if os.path.commonpath([root, os.path.realpath(path)]) == root:
        return path
    link = next(p for p in (os.path.join(run_dir, *parts[:i + 1]) for i in range(len(parts)))
                if os.path.commonpath([root, os.path.realpath(p)]) != root)
    raise UserError(f"{link} is a symbolic link out of the run folder (to {os.path.realpath(link)}): refusing to "
                    "write through it; remove the link, then run again")


def open_new(path: str):
    """`path` created anew for writing (binary), never through a symbolic link: a stale file or
    link of that name (a killed writer's temporary) is removed first."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        os.remove(path)   # removes a link itself, not what it points to
        fd = os.open(path, flags, 0o644)
    return os.fdopen(fd, "wb")


_TMP = ".tmp."


def atomic_write_target(name: str) -> str | None:
    """The file name whose atomic_write temporary `name` is (`<target>.tmp.<pid>`, left behind
    only by a process killed mid-write, where its cleanup cannot run), else None."""
    target, sep, pid = name.rpartition(_TMP)
    return target if sep and target and pid.isdigit() else None


def atomic_write(path: str, data: str | bytes) -> None:
    """Write `data` (text as UTF-8) to `path` so that readers never see a partial file, even
    after a crash: a synced temporary file in the same folder, renamed into place (the rename
    replaces a link at `path`, it does not write through it). Every result file (runs, plots,
    benchmark CSVs) is written through here."""
    tmp = f"{path}{_TMP}{os.getpid()}"
    try:
        with open_new(tmp) as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:   # a full disk or a kill: leave no half-written temporary behind
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def read_jsonl(path: str) -> tuple[list[dict], int]:
    """The JSON objects of a JSONL file (or of PATH.gz when only that exists) and the number of
    non-empty lines that did not parse."""
    out, bad = [], 0
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    bad += 1
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
                else:
                    bad += 1
    except (OSError, EOFError):  # EOFError: a truncated .gz; what was read so far is kept
        return out, bad + 1 if os.path.exists(path) else 0
    return out, bad
