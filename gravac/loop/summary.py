"""Running totals of a run and its summary.json: cumulative floats and bytes, times, target.

Cumulative figures are per worker (floats sent by one worker over the run). The cluster time is
the sum of step times (modelled when a network model is on, measured otherwise); evaluation time
is excluded from both, as it is from the paper's time-to-accuracy.
"""
from __future__ import annotations

import time

from gravac.cluster.netmodel import NetworkModel
from gravac.cluster.numerics import Numerics
from gravac.core.schema import RunConfig
from gravac.methods import method_class


class Summary:
    """Accumulates step and eval records into the figures summary.json reports."""

    def __init__(self, cfg: RunConfig, dataset, params: int, total_steps: int, net: NetworkModel, metric: str,
                 clock=None):
        self.cfg, self.net, self.metric, self.clock = cfg, net, metric, clock
        self.dataset_name, self.params, self.total_steps = dataset.name, params, total_steps
        self.steps_per_epoch = 0
        self.higher = metric != "perplexity"
        self.steps = 0
        self.floats = 0.0
        self.wire = 0
        self.model_s = 0.0
        self.overlap_model_s = 0.0
        self.wall_step_s = 0.0
        self.t0 = time.perf_counter()
        self.elapsed_before = 0.0          # wall seconds of earlier segments of a resumed run
        self.final = self.best = None
        self.target_hit: dict | None = None
        self.error: str | None = None
        self.explanation: str | None = None    # the method's closing line (Method.explain)
        self.method_summary: dict | None = None   # the method's own figures (Method.summarize)
        self.resume_command: str | None = None   # set when a stop checkpointed the run
        self.cf_hist: dict[str, int] = {}
        self.setting = method_class(cfg.method.name).describe(cfg.method, cfg.compressor)

    @property
    def modelled_clock(self) -> bool:
        """Step times are modelled (network model on, time_source not wall), else measured."""
        n = self.cfg.network
        return n.enabled and n.time_source != "wall"

    def wall_s(self) -> float:
        """Wall seconds of the run so far, across resumed segments."""
        return self.elapsed_before + time.perf_counter() - self.t0

    def state_dict(self) -> dict:
        """Counters to carry over a checkpoint (configuration and clocks are rebuilt)."""
        skip = {"cfg", "net", "t0", "elapsed_before", "setting", "clock", "total_steps",  # total: this command's
                "explanation", "method_summary", "resume_command"}
        state = {k: v for k, v in vars(self).items() if k not in skip}
        state["elapsed_s"] = self.wall_s()
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self.elapsed_before = state.pop("elapsed_s")
        state.pop("total_steps", None)   # older checkpoints kept it; an extended run has a new total
        vars(self).update(state)
        self.t0 = time.perf_counter()

    def add_step(self, rec: dict) -> None:
        self.steps = rec["step"] + 1
        self.floats += rec["floats_sent"]
        self.wire += rec["wire_bytes"]
        self.model_s += rec["step_model_s"]
        self.overlap_model_s += rec.get("step_overlap_model_s", rec["step_model_s"])
        self.wall_step_s += rec["step_wall_s"]
        cf = rec["cf"]
        key = f"{float(f'{cf:.2g}'):g}"   # 2 significant digits: per-layer CFs vary slightly
        self.cf_hist[key] = self.cf_hist.get(key, 0) + 1

    def reached(self, value: float) -> bool:
        t = self.cfg.train.target
        return t > 0 and (value >= t if self.higher else value <= t)

    def add_eval(self, ev: dict) -> None:
        v = ev["metric"]
        self.final = v
        if self.best is None or (v > self.best if self.higher else v < self.best):
            self.best = v
        if self.target_hit is None and self.reached(v):
            self.target_hit = {"step": ev["step"], "floats_sent": self.floats, "wire_bytes": self.wire,
                               "wall_s": self.wall_s(), "step_wall_s": self.wall_step_s,
                               "model_s": self.model_s, "overlap_model_s": self.overlap_model_s}

    def last_metric_str(self) -> str:
        return "-" if self.final is None else f"{self.final:.4g}"

    def as_dict(self, status: str) -> dict:
        c = self.cfg
        cf = None if "compressor.cf" in self.setting["ignores"] or "compressor." in self.setting["ignores"] \
            else c.compressor.cf
        return {
            "status": status, "error": self.error, "resume_command": self.resume_command,
            "method": c.method.name, "compressor": c.compressor.name, "cf": cf, "setting": self.setting,
            "model": c.model.name, "dataset": self.dataset_name, "parameters": self.params,
            "workers": c.cluster.workers, "backend": c.cluster.backend, "batch_size": c.train.batch_size,
            "seed": c.train.seed, "experiment": c.experiment.name,
            "steps": self.steps, "total_steps": self.total_steps,
            "metric": self.metric, "final_metric": self.final, "best_metric": self.best,
            "target": c.train.target or None,
            "floats_sent": self.floats, "wire_bytes": self.wire,
            "wall_s": self.wall_s(), "step_wall_s": self.wall_step_s, "model_s": self.model_s,
            "overlap_model_s": self.overlap_model_s,
            "time_source": "modelled" if self.modelled_clock else "wall",
            "network": self.net.describe(),
            "clock": self.clock.describe() if self.clock is not None else None,
            "numerics": Numerics.current(c.cluster.numerics).describe(),
            "cf_histogram": self.cf_hist,
            "target_reached": self.target_hit,
            "explanation": self.explanation,
            "method_summary": self.method_summary,
        }
