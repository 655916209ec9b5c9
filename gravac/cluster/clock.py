"""The run's clock: each step's measured seconds and its modelled seconds, serial and overlapped.

Modelled time is a deterministic function of the run's trajectory (what was sent, step by step),
the device profile and the compression cost table (gravac/cluster/profile.py), and the network model:
- `step_model_s`: compute + compression + communication + optimizer, in series;
- `step_overlap_model_s`: the same work scheduled as DDP overlaps it (gravac/cluster/timeline.py): DDP-
  style buckets (dense) or a method's pieces are sent while backward still runs.
`network.overlap` says which of the two is "the" modelled time (time-to-target, GraVAC's
T_system); measured wall time (`step_wall_s`) is recorded beside both. `clock.compute` and
`clock.compress` = measured use each step's own measurements instead (not reproducible).
"""
from __future__ import annotations

import dataclasses

import torch

from gravac.core.errors import UserError
from gravac.cluster.profile import (
    REFERENCE_DEVICE,
    REFERENCE_DIR,
    DeviceProfile,
    fingerprint,
    load_or_measure_profile,
    machine_key,
    profile_dir,
    reference_holds,
)
from gravac.cluster.opcosts import OpCosts
from gravac.cluster.timeline import Piece, buckets, schedule


def _auto_device(cfg, threads: int, key: str, parameters: int, group, cache, say) -> tuple[str, object, bool]:
    """clock.machine=auto: the committed study device when it holds this run's profile and the run
    computes as it was measured (CPU, one thread, native numerics), so that modelled times do not
    depend on the host; else this host ("" and its own cache). Returns (machine, cache, borrow)."""
    fits = cfg.cluster.device == "cpu" and threads == 1 and cfg.cluster.numerics == "native"
    found = group.broadcast_object(fits and group.is_main and reference_holds(key, parameters))
    if not found:
        return "", cache, False
    say(f"clock: modelled times from the study device '{REFERENCE_DEVICE}' ({REFERENCE_DIR}), the same on every "
        "host; clock.machine=\"\" profiles this host instead")
    return REFERENCE_DEVICE, REFERENCE_DIR, True


class Clock:
    """Times of every step of one run (see the module docstring)."""

    def __init__(self, cfg, profile: DeviceProfile, costs: OpCosts, bucket_list: list[list[int]], group,
                 measured_profile: str | None = None):
        self.cfg, self.profile, self.costs, self.buckets, self.group = cfg, profile, costs, bucket_list, group
        self.measured_profile = measured_profile    # the profile's cache key when this run measured it
        net = cfg.network
        self.modelled = net.enabled and net.time_source != "wall"
        self.overlap = net.overlap
        self.optimizer_s = 0.0          # measured by the loop each step

    @classmethod
    def build(cls, cfg, workers, group, say=print) -> "Clock":
        """The device profile (cached, or measured now on rank 0 and shared), the cost table and
        the DDP-style buckets of this run. A named device (clock.machine) is read-only unless
        clock.extend_machine (gravac/cluster/profile.py)."""
        c = cfg.clock
        threads = torch.get_num_threads()
        host = machine_key(threads, cfg.cluster.device, cfg.cluster.numerics)
        key = (f"model={dataclasses.asdict(cfg.model)} dataset={cfg.dataset.name} input={workers.input_shape()} "
               f"momentum={cfg.train.momentum} weight_decay={cfg.train.weight_decay} "
               f"params={fingerprint(workers.params)}")
        label = (f"{cfg.model.name} on {cfg.dataset.name} (input {workers.input_shape()}, "
                 f"{len(workers.params)} parameter tensors)")
        machine, cache, borrow = c.machine, profile_dir(c.cache_dir), False
        if machine == "auto":
            machine, cache, borrow = _auto_device(cfg, threads, key, len(workers.params), group, cache, say)
        named = dict(named=bool(machine), extend=c.extend_machine, host=host, say=say)
        machine = machine or host
        prof, problem = None, None
        if group.is_main:
            try:
                prof = load_or_measure_profile(key, machine, cache, lambda: workers.measure_profile(c.repeats),
                                               c.repeats, parameters=len(workers.params), label=label, **named)
            except UserError as e:      # every rank stops with rank 0's line, none waits in the broadcast
                problem = str(e)
        prof, problem = group.broadcast_object((prof, problem))
        if problem:
            raise UserError(problem)
        if c.compute_s > 0:
            prof = prof.scaled(c.compute_s)       # keeps the key of the profile it scales
        costs = OpCosts(group, cache, machine, repeats=c.repeats, mode=c.compress, borrow=borrow, **named)
        costs.share()
        net = cfg.network
        element = 4
        cap = net.bucket_cap_mb
        if net.buckets > 0:
            cap = workers.numel * element / net.buckets / 2**20
        first = min(net.first_bucket_mb, cap)
        bucket_list = buckets(workers.sizes, prof.backward_order, element, cap, first)
        return cls(cfg, prof, costs, bucket_list, group, prof.key if prof.source == "calibrated" else None)

    # --- per step -----------------------------------------------------------------------------
    @property
    def decision_key(self) -> str:
        """The record field GraVAC's T_system reads: the modelled time the run reports, or wall."""
        if not self.modelled:
            return "step_wall_s"
        return "step_overlap_model_s" if self.overlap else "step_model_s"

    def compute_s(self, comp) -> float:
        """Forward + backward seconds of this step on the clock."""
        return self.profile.compute_s if self.cfg.clock.compute == "profile" else comp.compute_s

    def record(self, ctx, comp, res, spe: int, wall_s: float, optimizer_s: float) -> dict:
        """The step's record: loss, CF, floats, bytes, and its times measured and modelled."""
        compress_s, compress_model = self.group.slowest(res.compress_s, _model(res))
        prof = self.profile
        measured_compute = self.cfg.clock.compute != "profile"
        if measured_compute:                 # the slowest worker's own times this step
            w = max(range(len(comp.forward_s)), key=lambda i: comp.forward_s[i] + comp.backward_s[i])
            fwd, bwd, ready, opt = comp.forward_s[w], comp.backward_s[w], comp.ready_s[w], optimizer_s
        else:
            fwd, bwd, ready, opt = prof.forward_s, prof.backward_s, prof.ready_s, prof.optimizer_s
        pieces = res.pieces if res.pieces is not None else [Piece(None, compress_model, list(res.comm.messages))]
        plan = schedule(fwd, bwd, ready, opt, pieces)
        compute_model = fwd + bwd
        return {"step": ctx.step, "epoch": round(ctx.step / spe, 6), "loss": comp.loss, "lr": ctx.lr, "cf": res.cf,
                "floats_sent": res.floats_sent, "wire_bytes": res.comm.wire_bytes,
                "compute_s": comp.compute_s, "compress_s": compress_s, "comm_s": res.comm.measured_s,
                "optimizer_s": optimizer_s,
                "compute_model_s": compute_model, "compress_model_s": compress_model,
                "comm_model_s": res.comm.modelled_s,
                "step_model_s": compute_model + compress_model + res.comm.modelled_s + opt,
                "step_overlap_model_s": plan.step_s, "exposed_comm_model_s": plan.exposed_comm_s,
                "step_wall_s": comp.compute_s + compress_s + res.comm.measured_s + optimizer_s,
                "time_s": wall_s, **res.extra}

    def ready_record(self, step: int, comp) -> dict:
        """ready.jsonl's line: every worker's forward, backward and gradient-ready times (ms)."""
        ms = lambda v: round(v * 1e3, 4)  # noqa: E731
        return {"step": step, "forward_ms": [ms(v) for v in comp.forward_s],
                "backward_ms": [ms(v) for v in comp.backward_s],
                "ready_ms": [[ms(v) for v in w] for w in comp.ready_s]}

    def state_dict(self) -> dict:
        """The profile and cost table a resumed run continues with (exact even without the cache)."""
        return {"profile": dataclasses.asdict(self.profile), "costs": dict(self.costs.table),
                "measured_here": self.measured_here()}

    def load_state_dict(self, state: dict) -> None:
        self.profile = DeviceProfile(**state["profile"])
        self.costs.table.update(state["costs"])
        done = state.get("measured_here")     # older checkpoints lack it
        if done:
            self.measured_profile = self.measured_profile or done["profile"]
            self.costs.measured[:0] = [k for k in done["op_costs"] if k not in self.costs.measured]

    def measured_here(self) -> dict:
        """What this run measured on its own host (rather than read from the cache): the profile's
        key and the operations, with the host named; the rest of its numbers came from the cache."""
        return {"host": self.costs.host, "profile": self.measured_profile, "op_costs": list(self.costs.measured)}

    def describe(self) -> dict:
        """summary.json's `clock`: what modelled time is made of and where each part came from."""
        c = self.cfg.clock
        sizes = [len(b) for b in self.buckets]
        return {"compute": c.compute, "compress": c.compress, "overlap": self.overlap,
                "decides": self.decision_key, "profile": self.profile.describe(), "op_costs": self.costs.describe(),
                "measured_here": self.measured_here(),
                "buckets": {"count": len(self.buckets), "parameters_per_bucket": sizes,
                            "cap_mb": self.cfg.network.bucket_cap_mb, "first_mb": self.cfg.network.first_bucket_mb,
                            "requested": self.cfg.network.buckets},
                "model": "step_model_s = compute + compression + communication + optimizer (serial); "
                         "step_overlap_model_s = DDP-like schedule of buckets/pieces (gravac/cluster/timeline.py)"}


def _model(res) -> float:
    return res.compress_s if res.compress_model_s is None else res.compress_model_s

