"""Calibrated compression costs (`OpCosts`): seconds of each compression operation a method
performs, measured the first time it is met and cached on disk next to the device profile (see
gravac/cluster/profile.py, whose cache file helpers it shares).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path


from gravac.core.errors import UserError
from gravac.cluster.profile import JsonCache, _damaged, _digest, _number_problem, _unreadable


@dataclass
class OpCosts:
    """Seconds of compression operations: measured once per operation and kept (module docstring).

    `group` makes rank 0's measurement everyone's (all ranks meet the same operation at the same
    step, since their decisions agree). `mode` "measured" returns each call's own time instead.
    A `named` device's table is read-only unless `extend`: an operation it lacks is refused.
    """
    group: object
    cache: Path | None
    machine: str
    repeats: int = 5
    mode: str = "profile"
    named: bool = False             # clock.machine: a stated device (read-only unless extend)
    extend: bool = False            # clock.extend_machine: measure what the device lacks here, add it
    borrow: bool = False            # clock.machine=auto: what the device lacks is measured here, for this run only
    host: str = ""                  # this host (machine_key), named in what it adds to a device
    say: object = print
    table: dict = field(default_factory=dict)
    measured: list = field(default_factory=list)   # operations this run measured (the rest came from the cache)
    spent_s: float = 0.0            # seconds spent calibrating (kept out of measured step times)

    def __post_init__(self):
        self.store = JsonCache(self.cache / "ops.json", keep_damaged=self.named) if self.cache else None
        self.problem: str | None = None       # why a named device's table is unusable (share() raises it)
        self.damaged: set[str] = set()        # this host's entries found damaged: replaced when re-measured
        self._unsaved = False
        if self.store is not None:
            self._load()

    @property
    def prefix(self) -> str:
        return _digest(self.machine) + ":"

    def _load(self) -> None:
        """This machine's entries of the cache file, each checked (a finite cost >= 0). On this
        host's cache a damaged one is left out (measured again when met); on a named device it
        is refused."""
        path = self.store.path
        if self.store.problem:
            if self.named:
                self.problem = _unreadable(self.store, self.machine)
                return
            self.say(f"ignoring {path}: it {self.store.problem}; it is rewritten with this run's costs")
        for k, v in self.store.data.items():
            if not k.startswith(self.prefix):
                continue
            why = _number_problem(v, positive=False)
            if why is None:
                self.table[k[len(self.prefix):]] = v
            elif self.named:
                self.problem = self.problem or _damaged(path, k, v, self.machine, why)
            else:
                self.damaged.add(k)
                self.say(f"cached cost {k} in {path} {why}: it is measured again when met")

    def cost(self, key: str, fn, measured: float) -> float:
        """Seconds of operation `key` on the clock; `fn` re-runs it for a first calibration and
        `measured` is the call just made (mode "measured": that is the answer)."""
        if self.mode == "measured":
            return measured
        if key not in self.table:
            if self.borrow:
                if not self.measured:   # once: summary.json's clock.measured_here lists them all
                    self.say(f"compression costs device '{self.machine}' lacks are measured on this host ({self.host}) "
                             f"for this run only, first {key}; summary.json's clock.measured_here lists them")
                self._calibrate(key, fn, measured, keep=False)
                return self.table[key]
            if self.named and not self.extend:   # every rank has the same table: all stop here together
                where = self.store.path if self.store is not None else "its cost table"
                raise UserError(f"device '{self.machine}' has no cost for compression operation {key} in {where}; "
                                "measure it on this host and add it with clock.extend_machine=true (or drop "
                                "clock.machine to cost this host in its own cache)")
            self._calibrate(key, fn, measured)
        return self.table[key]

    def calibrates(self, key: str) -> bool:
        """Whether `cost(key, ...)` will re-run the operation (a first calibration)."""
        return self.mode != "measured" and key not in self.table

    def share(self) -> None:
        """Every rank starts from rank 0's table (a concurrent run may have extended the cache
        file between two ranks' reads, and all ranks must calibrate the same operations); a named
        device's unusable table stops every rank with rank 0's one line."""
        self.table, problem = self.group.broadcast_object((self.table, self.problem))
        if problem:
            raise UserError(problem)

    def _calibrate(self, key: str, fn, first: float, keep: bool = True) -> None:
        """Rank 0 times `fn` `repeats` more times (median with the first call); all ranks adopt it,
        and it is stored in the cache file unless not `keep`."""
        value = None
        t_start = time.perf_counter()
        if self.group.is_main:
            times = [first]
            for _ in range(self.repeats - 1):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            value = statistics.median(times)
            if self.store is not None and keep:  # a concurrent run that stored it first wins (JsonCache)
                value = self._store(key, value)
        value = self.group.broadcast_object(value)
        self.spent_s += time.perf_counter() - t_start
        self.table[key] = value
        self.measured.append(key)

    def _store(self, key: str, value: float) -> float:
        """Add a measured cost to the cache file (saying so when it goes into a named device, or
        once when this host's cache cannot keep it); the value stored first wins."""
        k = self.prefix + key
        failed = self.store.update({k: value}, replace={k} & self.damaged)
        value = self.store.data.get(k, value)
        if self.named:
            self.say(f"compression cost {key} measured on this host ({self.host}): {value * 1e3:.4g} ms; "
                     + (f"NOT added to device '{self.machine}' ({failed})" if failed else
                        f"added to device '{self.machine}' in {self.store.path}"))
        elif failed and not self._unsaved:
            self._unsaved = True
            self.say(f"compression costs are measured but not cached: {failed} (later runs measure them again)")
        return value

    def describe(self) -> dict:
        return {"mode": self.mode, "operations": len(self.table), "measured_this_run": len(self.measured),
                "repeats": self.repeats, "machine": self.machine,
                "cache": str(self.cache / "ops.json") if self.cache else None}
