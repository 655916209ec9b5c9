"""The reproducible clock's inputs: a device profile and calibrated compression costs.

Modelled time must not change with the machine's load, so it is a function of what a run did
and of numbers measured once and kept on disk:

- `DeviceProfile`: forward time, backward time, when each parameter's gradient is ready during
  backward (offsets from its start, via `register_post_accumulate_grad_hook`), the backward order,
  and the optimizer step, for one model, batch and input shape. Measured in a calibration phase
  (one worker, warm-up, median of `repeats`), cached under the key (model config, batch, input
  shape, the model's structure: every parameter's shape and dtype in order, and the machine:
  threads, torch version, device, or a named device), or given by the user (`clock.compute_s`:
  e.g. a GPU's forward+backward time; the measured shape of backward is scaled to it).
- `OpCosts` (gravac/cluster/opcosts.py): seconds of each compression operation a method performs (compensate, compress at a
  CF, recompress, norms, ...), measured the first time the operation is met (median of `repeats`
  on the real input, on rank 0, shared with every rank) and cached on disk, so that a later
  identical run reads the same numbers whatever the machine is doing. With
  `clock.compress=measured` each step's own measurement is used instead (not reproducible).

Every cached entry is checked before use (its fields, finite and non-negative numbers, one ready
offset per parameter). This host's own cache re-measures what is missing or damaged; a named
device (`clock.machine`) is read-only: what it lacks or holds damaged is refused in one line,
unless `clock.extend_machine` asks to measure what it lacks on this host and add it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gravac.core.errors import UserError
from gravac.core.io import atomic_write


def profile_dir(cache_dir: str) -> Path:
    """Where profiles and cost tables are cached: clock.cache_dir, else $GRAVAC_CACHE_DIR/profiles,
    else ~/.cache/gravac-bench/profiles."""
    if cache_dir:
        return Path(os.path.expanduser(cache_dir))
    base = os.environ.get("GRAVAC_CACHE_DIR") or os.path.join("~", ".cache", "gravac-bench")
    return Path(os.path.expanduser(base)) / "profiles"


def machine_key(threads: int, device: str, numerics: str = "native") -> str:
    """What a measurement depends on besides the work itself (portable numerics run other kernels)."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    portable = ", portable numerics" if numerics == "portable" else ""
    return f"torch {torch.__version__}, {device}, {threads} threads{portable}, {cpu or 'unknown cpu'}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class JsonCache:
    """A JSON object on disk that several processes may extend at once (locked merge on write).

    The first value stored under a key stays the reference: concurrent runs that both measure
    the same thing adopt the first writer's number, so every run using the cache agrees.
    `problem` says why an existing file could not be used (None: read, or absent); such a file is
    rewritten with what is stored unless `keep_damaged` (a named device's: restored, not lost)."""

    def __init__(self, path: Path, keep_damaged: bool = False):
        self.path, self.keep_damaged = path, keep_damaged
        self.problem: str | None = None
        self.data: dict = self._read()

    def _read(self) -> dict:
        self.problem = None
        try:
            with open(self.path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except ValueError as e:
            self.problem = f"is not valid JSON ({e})"
            return {}
        except OSError as e:
            self.problem = f"cannot be read ({e.strerror or e})"
            return {}
        if not isinstance(data, dict):
            self.problem = f"holds a JSON {type(data).__name__}, not an object of entries"
            return {}
        return data

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

    def update(self, new: dict, replace=frozenset()) -> str | None:
        """Add `new` entries (existing ones win: the first measurement stays the reference, except
        under the keys in `replace`, found damaged). None when stored, else why not."""
        with self.locked():
            return self.update_locked(new, replace)

    def update_locked(self, new: dict, replace=frozenset()) -> str | None:
        """`update` for a caller already inside `locked()` (flock is per open file, so the lock
        must not be taken twice)."""
        old = {k: v for k, v in self._read().items() if k not in replace}
        if self.problem and self.keep_damaged:
            self.data = {**new, **self.data}
            return f"{self.path} {self.problem}, left as it is"
        try:
            merged = {**new, **old}
            atomic_write(str(self.path), json.dumps(merged, indent=1, sort_keys=True) + "\n")
            self.data = merged
            return None
        except OSError as e:  # an unwritable cache costs a re-measurement next time, nothing else
            self.data = {**new, **self.data}
            return f"cannot write {self.path}: {e.strerror or e}"


def _number_problem(v, positive: bool) -> str | None:
    """Why `v` is not a usable time in seconds (None: it is)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"is {json.dumps(v)}, not a number"
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        return f"is {v}, not a finite number {'> 0' if positive else '>= 0'}"
    return None


PROFILE_TIMES = {"forward_s": True, "backward_s": True, "optimizer_s": False}   # name: must be > 0
PROFILE_NOTES = {"repeats", "machine", "host", "model", "config"}                 # optional fields


def profile_problem(entry, parameters: int) -> str | None:
    """What makes a cached device profile unusable (None: nothing): a missing, unknown or
    non-numeric field, a time that is not finite and positive (the optimizer's may be 0), or not
    one non-negative ready offset per parameter."""
    if not isinstance(entry, dict):
        return f"is {json.dumps(entry)[:40]}, not an object"
    missing = [k for k in (*PROFILE_TIMES, "ready_s") if k not in entry]
    unknown = sorted(set(entry) - set(PROFILE_TIMES) - PROFILE_NOTES - {"ready_s"})
    if missing or unknown:
        return "; ".join(([f"lacks {', '.join(missing)}"] if missing else []) +
                         ([f"has unknown field(s) {', '.join(unknown)}"] if unknown else []))
    for name, positive in PROFILE_TIMES.items():
        if (why := _number_problem(entry[name], positive)) is not None:
            return f"{name} {why}"
    ready = entry["ready_s"]
    if not isinstance(ready, list):
        return f"ready_s is {json.dumps(ready)[:40]}, not a list"
    if len(ready) != parameters:
        return f"ready_s has {len(ready)} offsets for a model of {parameters} parameter tensors"
    for i, r in enumerate(ready):
        if (why := _number_problem(r, False)) is not None:
            return f"ready_s[{i}] {why}"
    repeats = entry.get("repeats", 0)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 0:
        return f"repeats is {json.dumps(repeats)}, not a whole number >= 0"
    bad = [k for k in sorted(PROFILE_NOTES - {"repeats"}) if not isinstance(entry.get(k, ""), str)]
    return f"{bad[0]} is not text" if bad else None


REFERENCE_DEVICE = "reference-cpu"   # the study device, committed (results/reference/device/README.md)
REFERENCE_DIR = Path(__file__).resolve().parents[2] / "results" / "reference" / "device"


def reference_holds(key_text: str, parameters: int) -> bool:
    """Whether the committed study device holds a usable profile for `key_text` (a checkout has
    it; an installed package without results/ does not)."""
    entry = JsonCache(REFERENCE_DIR / "devices.json", keep_damaged=True).data.get(
        _digest(f"{key_text} | {REFERENCE_DEVICE}"))
    return entry is not None and profile_problem(entry, parameters) is None


def device_models(data: dict, machine: str) -> list[str]:
    """The models a named device holds profiles of (their labels), from devices.json's data."""
    return sorted(str(e.get("model") or "(unlabelled)") for e in data.values()
                  if isinstance(e, dict) and e.get("machine") == machine)


def device_names(data: dict) -> list[str]:
    """The named devices devices.json's data holds profiles of."""
    return sorted({e["machine"] for e in data.values() if isinstance(e, dict) and isinstance(e.get("machine"), str)})


def fingerprint(params) -> str:
    """The model's structure as the clock sees it: every parameter's shape and dtype, in order. Part
    of a profile's key, so a model that changes under the same config gets its own profile."""
    return _digest(repr([(tuple(p.shape), str(p.dtype)) for p in params]))


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
    stamps: list[float | None] = [None] * len(params)
    handles = []
    for i, p in enumerate(params):
        handles.append(p.register_post_accumulate_grad_hook(
            lambda _p, i=i: stamps.__setitem__(i, time.perf_counter())))
    rows = []
    try:
        for r in range(repeats + 1):
            t = {}
            stamps[:] = [None] * len(params)
            t0 = time.perf_counter()
            step_fn(lambda: t.__setitem__("fwd", time.perf_counter()))
            t_end = time.perf_counter()
            o0 = time.perf_counter()
            optimizer_fn()
            o1 = time.perf_counter()
            if r > 0:  # the first pass pays one-off allocation costs
                # a parameter backward never reaches (unused this step) is ready when backward ends
                ready = [(t_end if s is None else s) - t["fwd"] for s in stamps]
                rows.append((t["fwd"] - t0, t_end - t["fwd"], ready, o1 - o0))
    finally:
        for h in handles:
            h.remove()
    med = statistics.median
    return {"forward_s": med(r[0] for r in rows), "backward_s": med(r[1] for r in rows),
            "ready_s": [med(r[2][i] for r in rows) for i in range(len(params))],
            "optimizer_s": med(r[3] for r in rows)}


def load_or_measure_profile(key_text: str, machine: str, cache: Path, measure, repeats: int, *, parameters: int,
                            label: str = "", named: bool = False, extend: bool = False, host: str = "",
                            say=print) -> DeviceProfile:
    """The cached profile for `key_text` on `machine`, or a fresh measurement (then cached).
    The lock is held while measuring, so runs started together (a parallel sweep) wait for one
    calibration and share it instead of each keeping its own, differently loaded, profile.
    A `named` device is only read (nothing locked or written) unless `extend` (module docstring)."""
    key = _digest(f"{key_text} | {machine}")
    store = JsonCache(cache / "devices.json", keep_damaged=named)
    if named:
        _check_named(store, key, machine, label, parameters, extend, host, say)
        if not extend or key in store.data:
            return _cached(store.data[key], key, machine)
    with store.locked():
        found = store.data.get(key)
        if found is not None:
            problem = profile_problem(found, parameters)
            if problem is None:
                return _cached(found, key, machine)
            if named:       # damaged since _check_named read it: the named device's rule still holds
                raise UserError(_damaged(store.path, key, found, machine, problem))
            say(f"cached device profile {key} in {store.path} {problem}: measuring it again")
        elif store.problem and not named:
            say(f"ignoring {store.path}: it {store.problem}; it is rewritten with this run's profile")
        prof = measure()
        entry = {**prof, "repeats": repeats, "model": label, "config": key_text, "host": host}
        failed = store.update_locked({key: {**entry, "machine": machine} if named else entry},
                                     replace={key} if found is not None else frozenset())
    times = (f"forward {prof['forward_s'] * 1e3:.1f} ms, backward {prof['backward_s'] * 1e3:.1f} ms, "
             f"optimizer {prof['optimizer_s'] * 1e3:.1f} ms")
    if named:
        say(f"device profile measured on this host ({host}): {times}; "
            + (f"NOT added to device '{machine}' ({failed})" if failed else
               f"added to device '{machine}' as {label} in {store.path}"))
    else:
        say(f"device profile measured: {times} " + (f"(not cached: {failed})" if failed else f"(cached in {cache})"))
    return DeviceProfile(**prof, source="calibrated", key=key, machine=machine, repeats=repeats)


def _cached(entry: dict, key: str, machine: str) -> DeviceProfile:
    """A checked devices.json entry as the run's profile."""
    return DeviceProfile(forward_s=entry["forward_s"], backward_s=entry["backward_s"], ready_s=list(entry["ready_s"]),
                         optimizer_s=entry["optimizer_s"], repeats=entry.get("repeats", 0), source="cached", key=key,
                         machine=machine)


def _check_named(store: JsonCache, key: str, machine: str, label: str, parameters: int, extend: bool, host: str,
                 say) -> None:
    """Refuse, in one line, a named device's file that cannot be read, a device name it does not
    hold, a profile it lacks (all three fine when `extend`: measured here and added) or holds
    damaged (never fine: its numbers are what earlier runs were timed with)."""
    path = store.path
    if store.problem:
        raise UserError(_unreadable(store, machine))
    names = device_names(store.data)
    if machine not in names and not extend:
        raise UserError(f"clock.machine={machine}: {path.parent} holds no device of that name (known: "
                        f"{', '.join(names) or 'none'}); check clock.machine and clock.cache_dir, or start a new "
                        "device measured on this host with clock.extend_machine=true")
    if machine not in names:
        say(f"device '{machine}' is new in {path.parent}: what it needs is measured on this host ({host}) and added")
    found = store.data.get(key)
    if found is None and not extend:
        known = device_models(store.data, machine)
        same = " (a profile of the same model with another config is there: compare the entries' config)" \
            if label in known else ""
        raise UserError(f"device '{machine}' has no profile for {label}{same} in {path}; known: {'; '.join(known)}; "
                        "measure one on this host and add it with clock.extend_machine=true (or drop clock.machine "
                        "to profile this host in its own cache)")
    if found is not None and (problem := profile_problem(found, parameters)) is not None:
        raise UserError(_damaged(path, key, found, machine, problem))


def _unreadable(store: JsonCache, machine: str) -> str:
    """The one line refusing a named device's file that cannot be used."""
    return f"device '{machine}': {store.path} {store.problem}; restore it (e.g. git checkout {store.path})"


def _damaged(path: Path, key: str, entry, machine: str, problem: str) -> str:
    """The one line refusing a named device's damaged entry."""
    name = f" ({entry['model']})" if isinstance(entry, dict) and isinstance(entry.get("model"), str) else ""
    return (f"{path}: entry {key}{name} of device '{machine}' {problem}; restore the file (e.g. git checkout {path}) "
            "or delete the entry and measure it again with clock.extend_machine=true")
