"""Alpha-beta network model: the cluster time of the collectives a step performs.

Ring all-reduce of B bytes over N workers: 2(N-1)·α + 2(N-1)/N · B/β.
Ring all-gather of b bytes per worker:    (N-1)·α + (N-1) · b/β.
α is the per-message latency, β the link bandwidth in bytes per second. This machine's compute
is far slower than the paper's GPUs, so `comm_ratio` can instead choose β such that one dense
all-reduce costs a given multiple of the measured compute time of a step.
"""
from __future__ import annotations

from dataclasses import dataclass

from gravac.core.schema import NetworkCfg


@dataclass
class NetworkModel:
    """Costs of ring collectives under latency `alpha_s` (s) and bandwidth `beta_Bps` (bytes/s)."""
    alpha_s: float
    beta_Bps: float
    enabled: bool = True
    name: str = ""

    @classmethod
    def from_cfg(cls, cfg: NetworkCfg) -> "NetworkModel":
        """Build from config; a comm_ratio network is recalibrated later by `calibrate`."""
        return cls(alpha_s=cfg.latency_us * 1e-6, beta_Bps=cfg.bandwidth_gbps * 1e9 / 8,
                   enabled=cfg.enabled, name=cfg.name)

    def allreduce(self, nbytes: float, workers: int) -> float:
        """Seconds for a ring all-reduce of `nbytes` over `workers` (0 for one worker)."""
        if not self.enabled or workers <= 1:
            return 0.0
        n = workers
        return 2 * (n - 1) * self.alpha_s + 2 * (n - 1) / n * nbytes / self.beta_Bps

    def allgather(self, nbytes_per_worker: float, workers: int) -> float:
        """Seconds for a ring all-gather where every worker contributes `nbytes_per_worker`."""
        if not self.enabled or workers <= 1:
            return 0.0
        n = workers
        return (n - 1) * self.alpha_s + (n - 1) * nbytes_per_worker / self.beta_Bps

    def calibrate(self, dense_bytes: float, workers: int, compute_s: float, ratio: float) -> None:
        """Set β so that a dense all-reduce of `dense_bytes` costs `ratio` × `compute_s`."""
        if workers <= 1:
            return
        n = workers
        budget = ratio * compute_s - 2 * (n - 1) * self.alpha_s
        if budget <= 0:  # latency alone exceeds the budget: fall back to a bandwidth-only model
            budget = ratio * compute_s
        self.beta_Bps = 2 * (n - 1) / n * dense_bytes / budget

    def describe(self) -> dict:
        """Parameters for summary.json, so every modelled time states its model."""
        return {"name": self.name, "enabled": self.enabled, "model": "alpha-beta ring collectives",
                "latency_us": self.alpha_s * 1e6, "bandwidth_gbps": self.beta_Bps * 8 / 1e9,
                "allreduce": "2(N-1)a + 2(N-1)/N B/b", "allgather": "(N-1)a + (N-1) b_w/b"}
