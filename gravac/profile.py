"""The reproducible clock's inputs: a device profile and calibrated compression costs.

Modelled time must not change with the machine's load, so it is a function of what a run did
and of numbers measured once and kept on disk:

- `DeviceProfile`: forward time, backward time, when each parameter's gradient is ready during
  backward (offsets from its start, via `register_post_accumulate_grad_hook`), the backward order,
  and the optimizer step, for one model, batch and input shape. Measured in a calibration phase
  (one worker, warm-up, median of `repeats`), cached under the key (model config, batch, input
  shape, threads, torch version, device), or given by the user (`clock.compute_s`: e.g. a GPU's
  forward+backward time; the measured shape of backward is scaled to it).
- `OpCosts`: seconds of each compression operation a method performs (compensate, compress at a
  CF, recompress, norms, ...), measured the first time the operation is met (median of `repeats`
  on the real input, on rank 0, shared with every rank) and cached on disk, so that a later
  identical run reads the same numbers whatever the machine is doing. With
  `clock.compress=measured` each step's own measurement is used instead (not reproducible).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gravac.results import atomic_write


def profile_dir(cache_dir: str) -> Path:
    """Where profiles and cost tables are cached: clock.cache_dir, else $GRAVAC_CACHE_DIR/profiles,
    else ~/.cache/gravac-bench/profiles."""
    if cache_dir:
        return Path(os.path.expanduser(cache_dir))
    base = os.environ.get("GRAVAC_CACHE_DIR") or os.path.join("~", ".cache", "gravac-bench")
    return Path(os.path.expanduser(base)) / "profiles"


def machine_key(threads: int, device: str) -> str:
    """What a measurement depends on besides the work itself."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"torch {torch.__version__}, {device}, {threads} threads, {cpu or 'unknown cpu'}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class JsonCache:
    """A JSON object on disk that several processes may extend at once (locked merge on write).

    The first value stored under a key stays the reference: concurrent runs that both measure
    the same thing adopt the first writer's number, so every run using the cache agrees."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict = self._read()

    def _read(self) -> dict:
        try:
            with open(self.path) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    @contextlib.contextmanager
    def locked(self):
        """Hold the cache's lock (and re-read it): a run that finds a key missing can measure and
        store it before a concurrent run looks, which then reads it instead of measuring its own.
        An unusable lock (read-only cache) degrades to no lock."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(self.path.with_suffix(".lock"), "a+")
        except OSError:
            yield self
            return
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.data = self._read()
            yield self

    def update(self, new: dict) -> None:
        """Add `new` entries (existing ones win: the first measurement stays the reference)."""
        with self.locked():
            self.update_locked(new)

    def update_locked(self, new: dict) -> None:
        """`update` for a caller already inside `locked()` (flock is per open file, so the lock
        must not be taken twice)."""
        try:
            merged = {**new, **self._read()}
            atomic_write(str(self.path), json.dumps(merged, indent=1, sort_keys=True) + "\n")
            self.data = merged
        except OSError:  # an unwritable cache costs a re-measurement next time, nothing else
            self.data = {**new, **self.data}


@dataclass
class DeviceProfile:
    """Times of one worker's step on this device (seconds; see the module docstring)."""
    forward_s: float
    backward_s: float
    ready_s: list[float]            # per parameter (flat order): gradient ready, from backward start
    optimizer_s: float
    source: str                     # "calibrated", "cached" or "given"
    key: str = ""
    machine: str = ""
    repeats: int = 0

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def backward_order(self) -> list[int]:
        """Parameter indices in the order their gradients become ready."""
        return sorted(range(len(self.ready_s)), key=lambda i: (self.ready_s[i], -i))

    def scaled(self, compute_s: float) -> "DeviceProfile":
        """The same shape at a given forward+backward time (e.g. a GPU's): every time scales."""
        f = compute_s / self.compute_s if self.compute_s > 0 else 1.0
        return dataclasses.replace(self, forward_s=self.forward_s * f, backward_s=self.backward_s * f,
                                   ready_s=[r * f for r in self.ready_s], optimizer_s=self.optimizer_s * f,
                                   source="given")

    def describe(self) -> dict:
        """For summary.json: the numbers modelled time was computed from, and where they came from."""
        return {"source": self.source, "forward_s": self.forward_s, "backward_s": self.backward_s,
                "optimizer_s": self.optimizer_s, "parameters": len(self.ready_s), "repeats": self.repeats,
                "key": self.key, "machine": self.machine}


def measure_profile(step_fn, params: list[torch.nn.Parameter], optimizer_fn, repeats: int) -> dict:
    """Median forward, backward, per-parameter ready offsets and optimizer times of `repeats` calls
    (after one warm-up). `step_fn(mark)` runs forward, calls mark() when the loss is ready, then
    backward."""
    stamps: list[float] = [0.0] * len(params)
    handles = []
    for i, p in enumerate(params):
        handles.append(p.register_post_accumulate_grad_hook(
            lambda _p, i=i: stamps.__setitem__(i, time.perf_counter())))
    rows = []
    try:
        for r in range(repeats + 1):
            t = {}
            t0 = time.perf_counter()
            step_fn(lambda: t.__setitem__("fwd", time.perf_counter()))
            t_end = time.perf_counter()
            o0 = time.perf_counter()
            optimizer_fn()
            o1 = time.perf_counter()
            if r > 0:  # the first pass pays one-off allocation costs
                rows.append((t["fwd"] - t0, t_end - t["fwd"], [s - t["fwd"] for s in stamps], o1 - o0))
    finally:
        for h in handles:
            h.remove()
    med = statistics.median
    return {"forward_s": med(r[0] for r in rows), "backward_s": med(r[1] for r in rows),
            "ready_s": [med(r[2][i] for r in rows) for i in range(len(params))],
            "optimizer_s": med(r[3] for r in rows)}


def load_or_measure_profile(key_text: str, machine: str, cache: Path, measure, repeats: int) -> DeviceProfile:
    """The cached profile for `key_text` on this machine, or a fresh measurement (then cached).
    The lock is held while measuring, so runs started together (a parallel sweep) wait for one
    calibration and share it instead of each keeping its own, differently loaded, profile."""
    key = _digest(f"{key_text} | {machine}")
    store = JsonCache(cache / "devices.json")
    with store.locked():
        found = store.data.get(key)
        if found is not None:
            return DeviceProfile(**found, source="cached", key=key, machine=machine)
        prof = measure()
        store.update_locked({key: {**prof, "repeats": repeats}})
    return DeviceProfile(**prof, source="calibrated", key=key, machine=machine, repeats=repeats)


@dataclass
class OpCosts:
    """Seconds of compression operations: measured once per operation and kept (module docstring).

    `group` makes rank 0's measurement everyone's (all ranks meet the same operation at the same
    step, since their decisions agree). `mode` "measured" returns each call's own time instead.
    """
    group: object
    cache: Path | None
    machine: str
    repeats: int = 5
    mode: str = "profile"
    table: dict = field(default_factory=dict)
    measured_keys: int = 0          # operations this run measured (the rest came from the cache)
    spent_s: float = 0.0            # seconds spent calibrating (kept out of measured step times)

    def __post_init__(self):
        self.store = JsonCache(self.cache / "ops.json") if self.cache else None
        if self.store is not None:
            self.table = {k[len(self.prefix):]: v for k, v in self.store.data.items() if k.startswith(self.prefix)}

    @property
    def prefix(self) -> str:
        return _digest(self.machine) + ":"

    def cost(self, key: str, fn, measured: float) -> float:
        """Seconds of operation `key` on the clock; `fn` re-runs it for a first calibration and
        `measured` is the call just made (mode "measured": that is the answer)."""
        if self.mode == "measured":
            return measured
        if key not in self.table:
            self._calibrate(key, fn, measured)
        return self.table[key]

    def calibrates(self, key: str) -> bool:
        """Whether `cost(key, ...)` will re-run the operation (a first calibration)."""
        return self.mode != "measured" and key not in self.table

    def share(self) -> None:
        """Every rank starts from rank 0's table (a concurrent run may have extended the cache
        file between two ranks' reads, and all ranks must calibrate the same operations)."""
        self.table = self.group.broadcast_object(self.table)

    def _calibrate(self, key: str, fn, first: float) -> None:
        """Rank 0 times `fn` `repeats` more times (median with the first call); all ranks adopt it."""
        value = None
        t_start = time.perf_counter()
        if self.group.is_main:
            times = [first]
            for _ in range(self.repeats - 1):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            value = statistics.median(times)
            if self.store is not None:  # a concurrent run that stored it first wins (JsonCache)
                self.store.update({self.prefix + key: value})
                value = self.store.data.get(self.prefix + key, value)
        value = self.group.broadcast_object(value)
        self.spent_s += time.perf_counter() - t_start
        self.table[key] = value
        self.measured_keys += 1

    def describe(self) -> dict:
        return {"mode": self.mode, "operations": len(self.table), "measured_this_run": self.measured_keys,
                "repeats": self.repeats, "machine": self.machine,
                "cache": str(self.cache / "ops.json") if self.cache else None}
