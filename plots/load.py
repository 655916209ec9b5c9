"""Reading run folders into tidy records.

A run folder holds config.yaml, steps.jsonl, evals.jsonl and summary.json (any may be missing or,
for the JSONL files, end in a torn line when the run was killed). A JSONL file may also be stored
gzipped (steps.jsonl.gz, as in results/reference/): it is read the same way. `load_run` reads what is there
and records every defect in `Run.problems`, so the analysis uses incomplete runs for what they
contain and the command can say which runs were incomplete. A run whose files hold a value of
the wrong kind where the analysis needs one (`"step": null` or "three", `cluster.workers: four`)
is damaged: `Run.damage` says why, and `load_runs` leaves it out with that reason, so one such run
never stops a report. Everything numeric comes from the
files: cumulative quantities are cumulative sums of steps.jsonl, cross-checked with summary.json.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import yaml

from gravac.core.io import read_jsonl
from plots.runcheck import _bad_setting, _bad_step, _cross_check, _num


RUN_MARKERS = ("steps.jsonl", "steps.jsonl.gz", "summary.json")
HIGHER_IS_BETTER = {"top1": True, "top5": True, "perplexity": False}


# ----------------------------------------------------------------------------------------------
# discovery and reading

def find_runs(paths: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """Run folders found under `paths`, CSV files given directly, and paths that do not exist.

    A path is a run folder (it holds steps.jsonl or summary.json) or any folder walked
    recursively; a run folder is not descended into. Duplicates (same real path) are dropped.
    """
    runs, csvs, missing, seen = [], [], [], set()
    for p in paths:
        if os.path.isfile(p):
            (csvs if p.endswith(".csv") else missing).append(p)
            continue
        if not os.path.isdir(p):
            missing.append(p)
            continue
        for root, dirs, files in os.walk(p):
            dirs.sort()
            if any(m in files for m in RUN_MARKERS):
                real = os.path.realpath(root)
                if real not in seen:
                    seen.add(real)
                    runs.append(root)
                dirs[:] = []
    return runs, csvs, missing


def assign_studies(runs: list[Run], roots: Iterable[str]) -> None:
    """Set each run's study: the first folder below the argument it was found under, when that
    argument holds runs in several such folders (results/reference/covap/mini_vgg/runs/x under
    results/reference is "covap"), so a folder of studies is drawn study by study; else ""."""
    first: dict[str, tuple[str, str]] = {}
    for run in runs:
        real = os.path.realpath(run.path)
        for root in roots:
            rel = os.path.relpath(real, os.path.realpath(root))
            if rel != "." and not rel.startswith(".."):
                first[run.path] = (root, rel.split(os.sep)[0] if os.sep in rel else "")
                break
    per_root: dict[str, set[str]] = {}
    for root, study in first.values():
        per_root.setdefault(root, set()).add(study)
    for run in runs:
        root, study = first.get(run.path, ("", ""))
        run.study = study if len(per_root.get(root, ())) > 1 else ""


def _safe_load(stream):
    """yaml.safe_load with libyaml's C parser when PyYAML has it: the same documents, and the 292
    configs of results/reference read in 0.3 s of CPU instead of 1.2 s."""
    return yaml.load(stream, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _read_mapping(path: str, loader) -> tuple[dict | None, str | None]:
    """A YAML/JSON mapping, or (None, reason)."""
    if not os.path.exists(path):
        return None, "missing"
    try:
        with open(path) as f:
            data = loader(f)
    except Exception as e:  # unreadable or corrupt: report, never raise
        return None, f"unreadable ({type(e).__name__})"
    if not isinstance(data, dict):
        return None, "not a mapping"
    return data, None


# ----------------------------------------------------------------------------------------------
# one run

@dataclass
class Hit:
    """Cumulative figures of a run after `step` steps (at an evaluation, or at its last step)."""
    step: int
    floats: float
    wire: float
    wall_s: float
    model_s: float
    metric: float = math.nan


@dataclass
class Run:
    """One run folder's records. `problems` lists what makes it incomplete; `notes` cross-checks."""
    path: str
    config: dict
    summary: dict | None
    steps: list[dict]
    evals: list[dict]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    has_config: bool = True
    damage: str | None = None       # why the run cannot be used at all (load_runs skips it)
    study: str = ""                 # the folder of studies it was found in (see assign_studies); "" when none
    _cum: dict = field(default_factory=dict, repr=False)

    # -- identity ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    def cfg(self, dotted: str, default: Any = None) -> Any:
        """A value of the resolved config by dotted key (`method.epsilon`), else `default`."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def _pick(self, dotted: str, summary_key: str, default: Any = None) -> Any:
        v = self.cfg(dotted)
        if v is None and self.summary:
            v = self.summary.get(summary_key)
        return default if v is None else v

    @property
    def method(self) -> str:
        return str(self._pick("method.name", "method", "unknown"))

    @property
    def setting(self) -> dict:
        """How the run's method describes its setting (summary.json `setting`: label, family,
        order, cf_text, ignored config keys), so no method or compressor is known here by name.
        Runs written before summaries carried it get a generic description."""
        for s in ((self.summary or {}).get("setting"), self.config.get("setting")):
            if isinstance(s, dict) and isinstance(s.get("label"), str):
                return s
        comp, cf = self.compressor, self.cf
        label = self.method if comp == "none" else f"{self.method} ({comp}{f' {cf:g}x' if cf else ''})"
        return {"label": label, "family": self.method, "order": [9, 9, comp, cf or 0], "ignores": [],
                "cf_text": f"{cf:g}x" if cf else "?", "compressor_label": comp}

    @property
    def compressor(self) -> str:
        return str(self._pick("compressor.name", "compressor", "none"))

    @property
    def cf(self) -> float | None:
        """The compressor's fixed CF when the method uses it (static), else None."""
        s = (self.summary or {}).get("setting") or self.config.get("setting")
        if isinstance(s, dict):
            if any("compressor.cf".startswith(p) for p in s.get("ignores", [])):
                return None
        elif self.method != "static":    # runs written before runs described their setting
            return None
        v = self._pick("compressor.cf", "cf")
        return None if v is None else float(v)

    @property
    def model(self) -> str:
        return str(self._pick("model.name", "model", "?"))

    @property
    def dataset(self) -> str:
        return str(self._pick("dataset.name", "dataset", "?"))

    @property
    def workers(self) -> int | None:
        v = self._pick("cluster.workers", "workers")
        return None if v is None else int(v)

    @property
    def metric(self) -> str:
        """The run's target metric: config, else summary, else what the evaluations hold."""
        m = self.cfg("train.target_metric") or (self.summary or {}).get("metric")
        if not m:
            m = "perplexity" if any("perplexity" in e for e in self.evals) else "top1"
        return str(m)

    @property
    def higher_is_better(self) -> bool:
        return HIGHER_IS_BETTER.get(self.metric, True)

    @property
    def target(self) -> float | None:
        """The configured target (train.target > 0), else summary's, else None."""
        t = self.cfg("train.target")
        if not t and self.summary:
            t = self.summary.get("target")
        return float(t) if t else None

    @property
    def network(self) -> dict:
        """The network model as the run reported it (calibrated β included), else its config."""
        net = (self.summary or {}).get("network")
        if isinstance(net, dict):
            return net
        return dict(self.cfg("network", {}) or {})

    @property
    def model_key(self) -> str:
        """The per-step field that is the run's modelled time: step_overlap_model_s when the run's
        clock overlapped communication with backward (summary `clock.decides`), else step_model_s."""
        clock = (self.summary or {}).get("clock") or {}
        if clock.get("overlap") and self.has_column("step_overlap_model_s"):
            return "step_overlap_model_s"
        return "step_model_s"

    @property
    def status(self) -> str:
        return str((self.summary or {}).get("status", "no summary"))

    # -- per-step series -----------------------------------------------------------------------
    def single_worker_s(self) -> np.ndarray:
        """Per-step time one worker alone takes on the run's clock: the serial step without
        compression or communication (forward + backward + optimizer, profile or measured)."""
        return self.column("step_model_s") - self.column("compress_model_s") - self.column("comm_model_s")

    def column(self, key: str) -> np.ndarray:
        """Per-step values of `key` (NaN where absent), in step order."""
        return np.array([_num(r.get(key)) for r in self.steps], dtype=float)

    def has_column(self, key: str) -> bool:
        return any(key in r for r in self.steps)

    def cumulative(self, key: str) -> np.ndarray:
        """Running sum of `key` over steps: element i is the total after step i (i+1 steps done)."""
        if key not in self._cum:
            self._cum[key] = np.cumsum(self.column(key))
        return self._cum[key]

    def after(self, steps_done: int) -> Hit | None:
        """Cumulative floats, bytes and times after `steps_done` steps; None if not all recorded."""
        if steps_done <= 0 or steps_done > len(self.steps):
            return None
        if int(self.steps[steps_done - 1].get("step", steps_done - 1)) != steps_done - 1:
            return None
        i = steps_done - 1
        return Hit(step=steps_done, floats=float(self.cumulative("floats_sent")[i]),
                   wire=float(self.cumulative("wire_bytes")[i]),
                   wall_s=float(self.cumulative("step_wall_s")[i]),
                   model_s=float(self.cumulative(self.model_key)[i]))

    def totals(self) -> Hit | None:
        """Cumulative figures over every recorded step."""
        return self.after(len(self.steps)) if self.steps else None

    # -- evaluations ---------------------------------------------------------------------------
    def eval_metric(self, ev: dict) -> float:
        v = ev.get("metric")
        if v is None:
            v = ev.get(self.metric)
        return _num(v)

    def eval_series(self) -> tuple[np.ndarray, np.ndarray]:
        """(steps done, metric) at every evaluation with a finite metric."""
        pts = [(int(e["step"]), self.eval_metric(e)) for e in self.evals if "step" in e]
        pts = [(s, m) for s, m in pts if math.isfinite(m)]
        return np.array([p[0] for p in pts], dtype=int), np.array([p[1] for p in pts], dtype=float)

    def reached(self, value: float, target: float) -> bool:
        return value >= target if self.higher_is_better else value <= target

    def first_hit(self, target: float | None) -> Hit | None:
        """Cumulative figures at the first evaluation whose metric reaches `target` (None: never).

        Taken at that evaluation's step, not interpolated: the run learns it has reached the
        target only when it evaluates (this is also what summary.json's target_reached records).
        """
        if target is None:
            return None
        for s, m in zip(*self.eval_series()):
            if self.reached(m, target):
                h = self.after(int(s))
                if h is not None:
                    h.metric = float(m)
                return h if h is not None else Hit(int(s), math.nan, math.nan, math.nan, math.nan, float(m))
        return None

    def final_metric(self) -> float:
        s, m = self.eval_series()
        return float(m[-1]) if len(m) else math.nan

    def best_metric(self) -> float:
        s, m = self.eval_series()
        if not len(m):
            return math.nan
        return float(m.max() if self.higher_is_better else m.min())


def load_run(path: str) -> Run:
    """Read one run folder; never raises for missing or damaged files."""
    problems: list[str] = []
    config, why = _read_mapping(os.path.join(path, "config.yaml"), _safe_load)
    has_config = config is not None
    if config is None:
        problems.append(f"config.yaml {why} (settings taken from summary.json)")
    summary, why = _read_mapping(os.path.join(path, "summary.json"), json.load)
    if summary is None:
        problems.append(f"summary.json {why}")
    elif summary.get("status") != "completed":
        problems.append(f"status={summary.get('status')}" + (f" ({summary['error']})" if summary.get("error") else ""))
    steps, bad_s = read_jsonl(os.path.join(path, "steps.jsonl"))
    evals, bad_e = read_jsonl(os.path.join(path, "evals.jsonl"))
    if bad_s:
        problems.append(f"steps.jsonl: {bad_s} unreadable line(s) skipped (torn write)")
    if bad_e:
        problems.append(f"evals.jsonl: {bad_e} unreadable line(s) skipped (torn write)")
    if not any(os.path.exists(os.path.join(path, f)) for f in ("steps.jsonl", "steps.jsonl.gz")):
        problems.append("steps.jsonl missing")
    if not evals:
        problems.append("no evaluations")
    damage = _bad_step(steps, "steps.jsonl") or _bad_step(evals, "evals.jsonl")
    if damage:
        steps, evals = [], []
    # sort by step, keep the last record of a step, note gaps
    by_step: dict[int, dict] = {}
    for i, r in enumerate(steps):
        s = r.get("step")
        by_step[int(s) if s is not None else i] = r
    steps = [by_step[k] for k in sorted(by_step)]
    if steps and [int(r.get("step", -1)) for r in steps] != list(range(len(steps))):
        problems.append("steps.jsonl has missing steps (cumulative figures stop at the first gap)")
    run = Run(path=path, config=config or {}, summary=summary, steps=steps,
              evals=sorted(evals, key=lambda e: _num(e.get("step"))), problems=problems,
              has_config=has_config, damage=damage)
    run.damage = run.damage or _bad_setting(run)
    if not run.damage:
        _cross_check(run)
    return run


def load_runs(dirs: Iterable[str]) -> tuple[list[Run], list[tuple[str, str]]]:
    """The runs of `dirs` that can be drawn, and (folder, why) for those left out: damaged runs,
    and runs that failed or were stopped before their first step (nothing to draw: they would only
    add an empty context whose every figure is 'not made')."""
    runs = [load_run(d) for d in dirs]
    left = [(r.path, r.damage or "no steps") for r in runs if r.damage or not r.steps]
    return [r for r in runs if r.steps and not r.damage], left


def skipped_lines(left: list[tuple[str, str]]) -> list[str]:
    """The lines that name the runs `load_runs` left out: one for those with no steps, one per
    damaged run."""
    empty = [p for p, why in left if why == "no steps"]
    lines = [f"skipped {len(empty)} run{'s' if len(empty) != 1 else ''} with no steps: {', '.join(empty)}"] if empty else []
    return lines + [f"skipped damaged run {p}: {why}" for p, why in left if why != "no steps"]


