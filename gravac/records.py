"""One step's record: what steps.jsonl holds for every method (plus the method's own fields)."""
from __future__ import annotations


def step_record(ctx, loss: float, res, compress_s: float, spe: int, wall_s: float) -> dict:
    """The record of step `ctx.step`: loss, CF and floats sent, wire bytes, and the step's time
    measured (compute, compression, communication) and modelled (communication by the network
    model). `compress_s` is the cluster's slowest compression; evaluation time is excluded."""
    return {"step": ctx.step, "epoch": round(ctx.step / spe, 6), "loss": loss, "lr": ctx.lr, "cf": res.cf,
            "floats_sent": res.floats_sent, "wire_bytes": res.comm.wire_bytes,
            "compute_s": ctx.compute_s, "compress_s": compress_s, "comm_s": res.comm.measured_s,
            "comm_model_s": res.comm.modelled_s,
            "step_model_s": ctx.compute_s + compress_s + res.comm.modelled_s,
            "step_wall_s": ctx.compute_s + compress_s + res.comm.measured_s,
            "time_s": wall_s, **res.extra}
