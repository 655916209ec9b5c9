"""Collective cost model: the cluster time of the collectives a step performs.

`network.collectives=ideal` (the default) is the alpha-beta ring model, an assumption for clusters
we do not have. With α the per-message latency and β the link bandwidth in bytes per second:

    ring all-reduce of B bytes over N workers:  2(N-1)·α + 2(N-1)/N · B/β
    ring all-gather of b bytes per worker:      (N-1)·α + (N-1) · b/β
    sparse all-gather (counts, then padded):    the all-gather of the 8-byte count + that of b
    binomial-tree broadcast of B bytes:         ⌈log2 N⌉ · (α + B/β)

A measured profile (`network.collectives=gloo-cpu` or a file; `bench/netval.py --fit`) keeps each
algorithm's steps and wire bytes and gives every collective its own terms, fitted to a real
backend (docs/DEFINITIONS.md, "Collective profiles"):

    t = call_s + steps(N)·(α + step_s + crowd(N)·crowd_step_s)
          + wire(N, b)·((link_factor + [N = 2]·pair_factor)/β + host_s_per_byte)

crowd(N) = max(0, N/C − 1) when the N workers share C cores (`network.shared_cores`, as on the
one machine bench/netval.py measures on), else 0: a message then also waits for its receiver to
be scheduled.

steps and wire follow gloo's algorithms (its ring all-gather and all-reduce, the same as ideal;
its broadcast tree, whose nodes send to all their children at once).

This machine's compute is far slower than the paper's GPUs, so `comm_ratio` can instead choose β
such that one dense all-reduce costs a given multiple of the measured compute time of a step.
"""
from __future__ import annotations

from dataclasses import dataclass

from compressors import COUNT_BYTES  # the int64 count every worker sends before a sparse all-gather
from gravac.core.collectives import COLLECTIVES, TERMS, ProfileError, read_profile
from gravac.core.errors import UserError
from gravac.core.schema import NetworkCfg

__all__ = ["COLLECTIVES", "TERMS", "CollectiveCost", "CollectiveProfile", "Measurement", "NetworkModel",
           "crowd", "fit_profile", "load_profile", "steps", "wire"]


def _tree(workers: int) -> tuple[int, int]:
    """(hops, wire units) to gloo's last broadcast receiver: virtual rank v, once it holds the data,
    posts its sends to v + 2^i (every 2^i > v) at once, so they share its link and all arrive after
    as many tensor-times as it has children (gloo/broadcast.cc). N = 4: root to 1 and 2 (2 units),
    then 1 to 3 (1 more): 3 units over 2 hops."""
    done, hops = {0: 0}, {0: 0}
    for v in range(workers):
        kids = [v + (1 << i) for i in range(max(1, workers).bit_length()) if (1 << i) > v and v + (1 << i) < workers]
        for c in kids:
            done[c], hops[c] = done[v] + len(kids), hops[v] + 1
    last = max(done, key=lambda v: (done[v], hops[v]))
    return hops[last], done[last]


def steps(kind: str, workers: int) -> int:
    """Messages on the critical path: ring steps (gloo's all-gather forwards one rank's segment per
    step; its all-reduce is a reduce-scatter then an all-gather), tree hops for broadcast."""
    n = workers
    if kind == "broadcast":
        return _tree(n)[0]
    return {"allreduce": 2 * (n - 1), "allgather": n - 1, "sparse_allgather": 2 * (n - 1)}[kind]


def wire(kind: str, nbytes: float, workers: int) -> float:
    """Bytes on the critical path's links: `nbytes` is the tensor (all-reduce, broadcast) or what
    one worker contributes (all-gathers; the sparse one's count comes on top)."""
    n = workers
    if kind == "allreduce":
        return 2 * (n - 1) / n * nbytes
    if kind == "allgather":
        return (n - 1) * nbytes
    if kind == "sparse_allgather":
        return (n - 1) * (COUNT_BYTES + nbytes)
    return _tree(n)[1] * nbytes


@dataclass(frozen=True)
class CollectiveCost:
    """One collective's fitted terms: `call_s` once per call (software: Python, torch, gloo's setup),
    `step_s` per message on the critical path on top of the network's α, `link_factor` × the wire
    time at β (1: the link's full rate), `pair_factor` × the wire time more with two workers (a
    ring's send and receive peer are then one rank: both directions share one connection), and
    `host_s_per_byte` per wire byte whatever the link's rate (the host's copies and TCP stack), and
    `crowd_step_s` per message and per extra worker sharing a core (crowd(N) = N/C − 1 when N
    workers share C cores: the receiver waits to be scheduled; 0 on a cluster of machines)."""
    call_s: float
    step_s: float
    link_factor: float
    pair_factor: float
    host_s_per_byte: float
    crowd_step_s: float = 0.0

    def link(self, workers: int) -> float:
        """How many times the link's rate a wire byte takes with `workers` workers."""
        return self.link_factor + (self.pair_factor if workers == 2 else 0.0)

    def step(self, workers: int, alpha_s: float, shared_cores: int = 0) -> float:
        """Seconds of one critical-path message beyond its bytes."""
        return alpha_s + self.step_s + crowd(workers, shared_cores) * self.crowd_step_s

    def seconds(self, kind: str, nbytes: float, workers: int, alpha_s: float, beta_Bps: float,
                burst_bytes: float = 0.0, shared_cores: int = 0) -> float:
        """The collective's time; `burst_bytes` of its wire bytes pass the link at once (a shaped
        test link's token bucket, 0 on a real one); `shared_cores`: the cores all workers share
        (0: each its own machine)."""
        w = wire(kind, nbytes, workers)
        return (self.call_s + steps(kind, workers) * self.step(workers, alpha_s, shared_cores)
                + max(0.0, w - burst_bytes) * self.link(workers) / beta_Bps + w * self.host_s_per_byte)


def crowd(workers: int, shared_cores: int) -> float:
    """Extra workers per core when `workers` processes share `shared_cores` cores (0: not shared)."""
    return max(0.0, workers / shared_cores - 1.0) if shared_cores > 0 else 0.0


@dataclass(frozen=True)
class CollectiveProfile:
    """A backend's measured collective costs, one CollectiveCost per collective (data, like the
    device profile: results/reference/collectives/NAME.json)."""
    name: str
    costs: dict
    source: str = ""
    note: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "note": self.note,
                "collectives": {k: {t: getattr(self.costs[k], t) for t in TERMS} for k in COLLECTIVES}}

    @classmethod
    def from_json(cls, data: dict, source: str) -> "CollectiveProfile":
        """From gravac.core.collectives.read_profile's checked content of profile `source`."""
        return cls(name=data["name"], costs={k: CollectiveCost(**v) for k, v in data["collectives"].items()},
                   source=source, note=data["note"])


@dataclass(frozen=True)
class Measurement:
    """One timed collective: `kind`, `nbytes` as the model takes it, `workers`, the link's
    `alpha_s`, `beta_Bps` and `burst_bytes` (CollectiveCost.seconds), and the measured `seconds`
    (median over repetitions, slowest rank); `shared_cores`: the cores its workers shared (0: none)."""
    kind: str
    nbytes: float
    workers: int
    alpha_s: float
    beta_Bps: float
    seconds: float
    burst_bytes: float = 0.0
    shared_cores: int = 0


def _design_row(m: Measurement) -> list[float]:
    """The coefficients of TERMS in the model's time for `m`: it is linear in them (the network's
    α adds steps × α, known, not fitted)."""
    n, w = m.workers, wire(m.kind, m.nbytes, m.workers)
    at_rate = max(0.0, w - m.burst_bytes) / m.beta_Bps
    k = steps(m.kind, n)
    return [1.0, k, at_rate, (at_rate if n == 2 else 0.0), w, k * crowd(n, m.shared_cores)]


def fit_profile(measurements: list[Measurement], name: str, floor_s: float = 0.01, note: str = "") -> CollectiveProfile:
    """The profile that best predicts `measurements`, each collective on its own: non-negative
    least squares (scipy's lsq_linear) on errors relative to max(measured, `floor_s`), so MB-sized
    messages are fitted in percent and small ones to about a millisecond, the accuracy asked of
    the model. link_factor is at least 1: no collective moves data faster than the link's rate.
    A collective without measurements keeps the ideal terms."""
    import numpy as np
    from scipy.optimize import lsq_linear

    ideal = CollectiveCost(0.0, 0.0, 1.0, 0.0, 0.0, 0.0)
    costs = {}
    for kind in COLLECTIVES:
        mine = [m for m in measurements if m.kind == kind and m.workers > 1]
        if not mine:
            costs[kind] = ideal
            continue
        a = np.array([_design_row(m) for m in mine])
        known = np.array([steps(kind, m.workers) * m.alpha_s for m in mine])
        t = np.array([m.seconds for m in mine])
        scale = 1.0 / np.maximum(t, floor_s)
        col = np.abs(a).max(axis=0)
        col[col == 0] = 1.0                      # a term no measurement exercises stays 0
        lower = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0]) * col    # no collective beats the link's rate
        res = lsq_linear(a * scale[:, None] / col, (t - known) * scale, bounds=(lower, np.inf))
        costs[kind] = CollectiveCost(*map(float, res.x / col))
    return CollectiveProfile(name=name, costs=costs, source=name, note=note)


def load_profile(spec: str) -> CollectiveProfile | None:
    """The profile `network.collectives` names: None for `ideal`, else a committed profile's name
    (results/reference/collectives/NAME.json) or a path to a JSON file. The config check has
    refused a bad one already; one broken since is a UserError (one line)."""
    if spec == "ideal":
        return None
    try:
        return CollectiveProfile.from_json(read_profile(spec), spec)
    except ProfileError as e:
        raise UserError(f"network.collectives={spec}: {e}") from None


@dataclass
class NetworkModel:
    """Costs of collectives under latency `alpha_s` (s) and bandwidth `beta_Bps` (bytes/s): the
    alpha-beta ring model, or a measured backend's `profile`."""
    alpha_s: float
    beta_Bps: float
    enabled: bool = True
    name: str = ""
    profile: CollectiveProfile | None = None
    burst_bytes: float = 0.0   # with a profile: bytes the link passes at once (tc tbf's bucket, bench/netval.py)
    shared_cores: int = 0      # with a profile: the cores all workers share (one machine), 0: one machine each

    @classmethod
    def from_cfg(cls, cfg: NetworkCfg) -> "NetworkModel":
        """Build from config; a comm_ratio network is recalibrated later by `calibrate`."""
        return cls(alpha_s=cfg.latency_us * 1e-6, beta_Bps=cfg.bandwidth_gbps * 1e9 / 8,
                   enabled=cfg.enabled, name=cfg.name, profile=load_profile(cfg.collectives),
                   shared_cores=cfg.shared_cores)

    def _fitted(self, kind: str, nbytes: float, workers: int) -> float:
        return self.profile.costs[kind].seconds(kind, nbytes, workers, self.alpha_s, self.beta_Bps, self.burst_bytes,
                                                self.shared_cores)

    def allreduce(self, nbytes: float, workers: int) -> float:
        """Seconds for an all-reduce of `nbytes` over `workers` (0 for one worker)."""
        if not self.enabled or workers <= 1:
            return 0.0
        if self.profile is not None:
            return self._fitted("allreduce", nbytes, workers)
        n = workers
        return 2 * (n - 1) * self.alpha_s + 2 * (n - 1) / n * nbytes / self.beta_Bps

    def allgather(self, nbytes_per_worker: float, workers: int) -> float:
        """Seconds for an all-gather where every worker contributes `nbytes_per_worker`."""
        if not self.enabled or workers <= 1:
            return 0.0
        if self.profile is not None:
            return self._fitted("allgather", nbytes_per_worker, workers)
        n = workers
        return (n - 1) * self.alpha_s + (n - 1) * nbytes_per_worker / self.beta_Bps

    def sparse_allgather(self, nbytes_per_worker: float, workers: int) -> list[float]:
        """Seconds of the two messages of a sparse all-gather as the suite's comm sends it: the
        8-byte counts, then every worker's payload padded to `nbytes_per_worker`. A profile's
        call cost goes with the first; ideal is two alpha-beta all-gathers."""
        if self.profile is None or not self.enabled or workers <= 1:
            return [self.allgather(COUNT_BYTES, workers), self.allgather(nbytes_per_worker, workers)]
        c, n = self.profile.costs["sparse_allgather"], workers
        total = c.seconds("sparse_allgather", nbytes_per_worker, n, self.alpha_s, self.beta_Bps, self.burst_bytes,
                          self.shared_cores)
        counts = c.call_s + (n - 1) * c.step(n, self.alpha_s, self.shared_cores) \
            + (n - 1) * COUNT_BYTES * (c.link(n) / self.beta_Bps + c.host_s_per_byte)
        return [counts, total - counts]

    def broadcast(self, nbytes: float, workers: int) -> float:
        """Seconds for a broadcast of `nbytes` from one rank (gloo: a binomial tree)."""
        if not self.enabled or workers <= 1:
            return 0.0
        if self.profile is not None:
            return self._fitted("broadcast", nbytes, workers)
        return steps("broadcast", workers) * (self.alpha_s + nbytes / self.beta_Bps)

    def predict(self, kind: str, nbytes: float, workers: int) -> float:
        """Total seconds of collective `kind` (one of COLLECTIVES), as bench/netval.py compares them."""
        if kind == "sparse_allgather":
            return sum(self.sparse_allgather(nbytes, workers))
        return getattr(self, kind)(nbytes, workers)

    def calibrate(self, dense_bytes: float, workers: int, compute_s: float, ratio: float) -> None:
        """Set β so that a dense all-reduce of `dense_bytes` costs `ratio` × `compute_s`."""
        if workers <= 1:
            return
        n = workers
        if self.profile is not None:
            c = self.profile.costs["allreduce"]
            w = wire("allreduce", dense_bytes, n)
            budget = ratio * compute_s - c.call_s - steps("allreduce", n) * c.step(n, self.alpha_s, self.shared_cores) \
                - w * c.host_s_per_byte
            if budget <= 0:   # fixed costs alone exceed the budget: the link term takes all of it
                budget = ratio * compute_s
            self.beta_Bps = c.link(n) * w / budget
            return
        budget = ratio * compute_s - 2 * (n - 1) * self.alpha_s
        if budget <= 0:  # latency alone exceeds the budget: fall back to a bandwidth-only model
            budget = ratio * compute_s
        self.beta_Bps = 2 * (n - 1) / n * dense_bytes / budget

    def describe(self) -> dict:
        """Parameters for summary.json, so every modelled time states its model."""
        out = {"name": self.name, "enabled": self.enabled, "model": "alpha-beta ring collectives",
               "latency_us": self.alpha_s * 1e6, "bandwidth_gbps": self.beta_Bps * 8 / 1e9,
               "allreduce": "2(N-1)a + 2(N-1)/N B/b", "allgather": "(N-1)a + (N-1) b_w/b"}
        if self.profile is None:
            return {**out, "collectives": "ideal"}
        return {**out, "model": f"collective profile {self.profile.name}",
                "collectives": self.profile.source,
                "formula": "call_s + steps(N)(a + step_s + crowd(N) crowd_step_s) + wire(N, bytes)((link_factor + [N=2] pair_factor)/b + host_s_per_byte)",
                "shared_cores": self.shared_cores,
                "allreduce": "steps 2(N-1), wire 2(N-1)/N B", "allgather": "steps N-1, wire (N-1) b_w",
                "sparse_allgather": "steps 2(N-1), wire (N-1)(8 + b_w)", "broadcast": "gloo's tree: steps its hops, wire its link-sharing (N=4: 2 hops, 3B)",
                "profile": self.profile.to_json()["collectives"]}
