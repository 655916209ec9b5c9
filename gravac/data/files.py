"""Where data is found and the decoded-array cache every dataset shares (crash- and race-safe).

`resolve_root` and `resolve_cache_dir` apply the config -> environment -> default order;
`cached_arrays` decodes a dataset once and memory-maps it on later starts.
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

try:
    import fcntl
except ImportError:  # Windows: no lock, the atomic rename alone keeps the cache consistent
    fcntl = None  # type: ignore[assignment]

from gravac.core.errors import UserError


class DataError(UserError, ValueError):
    """A user-fixable data problem (missing files, wrong layout, bad option): one clear line."""



def resolve_root(root: Optional[str]) -> Path:
    """The data root: `root` if given, else $GRAVAC_DATA_DIR, else ./data (absolute, ~ expanded)."""
    root = root or os.environ.get("GRAVAC_DATA_DIR") or "./data"
    return Path(os.path.expanduser(str(root))).resolve()


@contextlib.contextmanager
def undo_new_folders(path: Path):
    """Around a download into `path`: if it fails, the folders it created on the way (`path` and
    any missing parents, e.g. ./data) are removed again while still empty, so a missing-data
    error leaves nothing behind."""
    new = list(itertools.takewhile(lambda p: not p.exists(), (path, *path.parents)))
    try:
        yield
    except BaseException:
        for d in new:   # deepest first; one that holds something (a partial download) stays
            try:
                d.rmdir()
            except OSError:
                break
        raise


def resolve_cache_dir(cache_dir: Optional[str]) -> Path:
    """The decoded-array cache: `cache_dir`, else $GRAVAC_CACHE_DIR, else ~/.cache/gravac-bench."""
    d = cache_dir or os.environ.get("GRAVAC_CACHE_DIR") or os.path.join("~", ".cache", "gravac-bench")
    return Path(os.path.expanduser(str(d))).resolve()


def fingerprint(source: Path, files: Sequence[Path | tuple[str, int, int]], extra: str = "") -> str:
    """A short key for a source folder: its absolute path plus every file's name, size and mtime
    (Paths, or precomputed (relative name, size, mtime_ns) tuples), so that a changed, added or
    removed file gives a new key (and a fresh decode)."""
    h = hashlib.sha256()
    h.update(str(source.resolve()).encode())
    h.update(extra.encode())
    parts = []
    for f in files:
        if isinstance(f, tuple):
            parts.append("%s\0%d\0%d" % f)
        else:
            st = f.stat()
            parts.append("%s\0%d\0%d" % (f.relative_to(source), st.st_size, st.st_mtime_ns))
    h.update("\0".join(parts).encode())
    h.update(f"\0n={len(files)}".encode())
    return h.hexdigest()[:20]


def cached_arrays(cache_dir: Path, name: str, key: str,
                  build: Callable[[], dict[str, np.ndarray]], mmap: bool = True) -> dict[str, np.ndarray]:
    """Return the arrays stored under cache_dir/<name>-<key>/, building and storing them first if
    absent. The folder is written under a temporary name and renamed into place, so a killed or
    concurrent run never leaves (or reads) a half-written cache; a lock file makes concurrent
    starts (e.g. ddp ranks) wait for one builder instead of all decoding. An unwritable cache warns
    and builds in memory."""
    final = cache_dir / f"{name}-{key}"
    found = _read_cache(final, mmap)
    if found is not None:
        return found
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        lock = open(cache_dir / f".{name}-{key}.lock", "a+")
    except OSError as e:
        warnings.warn(f"could not write the data cache under {cache_dir} ({e}); set dataset.cache_dir= "
                      f"or GRAVAC_CACHE_DIR to a writable folder to avoid decoding on every start")
        return build()
    with lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        found = _read_cache(final, mmap)      # another process may have built it meanwhile
        if found is not None:
            return found
        arrays = build()
        try:
            _write_cache(cache_dir, final, arrays)
        except OSError as e:
            warnings.warn(f"could not write the data cache under {cache_dir} ({e}); set dataset.cache_dir= "
                          f"or GRAVAC_CACHE_DIR to a writable folder to avoid decoding on every start")
        return arrays


def _read_cache(final: Path, mmap: bool) -> Optional[dict[str, np.ndarray]]:
    meta = final / "arrays.json"
    if not meta.is_file():
        return None
    try:
        names = json.loads(meta.read_text())["arrays"]
        return {n: np.load(final / f"{n}.npy", mmap_mode="r" if mmap else None) for n in names}
    except (OSError, ValueError, KeyError) as e:  # unreadable: build again and replace it
        warnings.warn(f"ignoring unreadable cache {final} ({e}); decoding again")
        return None


def _write_cache(cache_dir: Path, final: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=cache_dir))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
        for n, a in arrays.items():
            np.save(tmp / f"{n}.npy", a)
        (tmp / "arrays.json").write_text(json.dumps({"arrays": list(arrays)}))
        if final.exists():  # a broken earlier cache (a complete one would have been read)
            shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
