"""Reading run folders into tidy records.

A run folder holds config.yaml, steps.jsonl, evals.jsonl and summary.json (any may be missing or,
for the JSONL files, end in a torn line when the run was killed). A JSONL file may also be stored
gzipped (steps.jsonl.gz, as in results/reference/): it is read the same way. `load_run` reads what is there
and records every defect in `Run.problems`, so the analysis uses incomplete runs for what they
contain and the command can say which runs were incomplete. Everything numeric comes from the
files: cumulative quantities are cumulative sums of steps.jsonl, cross-checked with summary.json.
"""
from __future__ import annotations

import gzip
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import yaml

from plots.labels import assign_labels

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


def read_jsonl(path: str) -> tuple[list[dict], int]:
    """The JSON objects of a JSONL file (or of PATH.gz when only that exists) and the number of
    non-empty lines that did not parse."""
    out, bad = [], 0
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    bad += 1
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
                else:
                    bad += 1
    except (OSError, EOFError):  # EOFError: a truncated .gz; what was read so far is kept
        return out, bad + 1 if os.path.exists(path) else 0
    return out, bad


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


def _num(v: Any) -> float:
    """A float from a record value; None, strings and non-finite JSON become NaN."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return math.nan


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
    def compressor(self) -> str:
        return str(self._pick("compressor.name", "compressor", "none"))

    @property
    def cf(self) -> float | None:
        """The static CF (method=static), else None."""
        if self.method != "static":
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
    def status(self) -> str:
        return str((self.summary or {}).get("status", "no summary"))

    # -- per-step series -----------------------------------------------------------------------
    @property
    def step_numbers(self) -> np.ndarray:
        return np.array([int(r.get("step", i)) for i, r in enumerate(self.steps)], dtype=int)

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
                   model_s=float(self.cumulative("step_model_s")[i]))

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
    config, why = _read_mapping(os.path.join(path, "config.yaml"), yaml.safe_load)
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
    # sort by step, keep the last record of a step, note gaps
    by_step: dict[int, dict] = {}
    for i, r in enumerate(steps):
        s = r.get("step")
        by_step[int(s) if isinstance(s, (int, float)) else i] = r
    steps = [by_step[k] for k in sorted(by_step)]
    if steps and [int(r.get("step", -1)) for r in steps] != list(range(len(steps))):
        problems.append("steps.jsonl has missing steps (cumulative figures stop at the first gap)")
    run = Run(path=path, config=config or {}, summary=summary, steps=steps,
              evals=sorted(evals, key=lambda e: _num(e.get("step"))), problems=problems,
              has_config=has_config)
    _cross_check(run)
    return run


def _cross_check(run: Run) -> None:
    """Compare the cumulative sums of steps.jsonl with summary.json; note any disagreement."""
    s = run.summary
    if not s or not run.steps:
        return
    n = s.get("steps")
    if isinstance(n, int) and n != len(run.steps):
        run.problems.append(f"steps.jsonl has {len(run.steps)} of the {n} steps summary.json counts")
        return
    tot = run.totals()
    if tot is None:
        return
    for key, mine in (("floats_sent", tot.floats), ("wire_bytes", tot.wire), ("step_wall_s", tot.wall_s),
                      ("model_s", tot.model_s)):
        theirs = _num(s.get(key))
        if math.isfinite(theirs) and math.isfinite(mine) and not math.isclose(mine, theirs, rel_tol=1e-6, abs_tol=1e-9):
            run.notes.append(f"summary {key}={theirs:.6g} but steps.jsonl sums to {mine:.6g}")
    tr = s.get("target_reached")
    if isinstance(tr, dict) and run.target is not None:
        hit = run.first_hit(run.target)
        if hit is None or hit.step != tr.get("step"):
            run.notes.append(f"summary target_reached at step {tr.get('step')}, evals.jsonl says "
                             f"{'never' if hit is None else hit.step}")


# ----------------------------------------------------------------------------------------------
# settings (seed replicas) and contexts (settings that can be compared)

SEED_KEYS = {"train.seed", "dataset.seed"}
IGNORED_PREFIXES = ("experiment.", "logger.")
IGNORED_KEYS = {"dataset.root", "dataset.cache_dir", "dataset.download", "cluster.threads", "cluster.timeout_s",
                "cluster.max_memory_gb", "train.eval_batch_size", "train.target", "train.target_metric"}
GRAVAC_KEYS = {"cf_min", "cf_max", "window", "step", "epsilon", "omega", "policy", "ewma"}
ACCORDION_KEYS = {"cf_low", "cf_high", "switch_freq", "eta"}
COMPRESSOR_ONLY = {"sample_ratio": "dgc", "momentum_correction": "dgc", "warmup_epochs": "dgc",
                   "max_iters": "redsync", "shared_indices": "randomk"}


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists become tuples so values are hashable."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = tuple(v) if isinstance(v, list) else v
    return out


def relevant_settings(run: Run) -> dict[str, Any]:
    """The config keys that define a run's setting: seeds, paths, logging and ignored options out."""
    if not run.has_config:
        s = run.summary or {}
        return {k: s.get(k) for k in ("method", "compressor", "cf", "model", "dataset", "workers",
                                      "backend", "batch_size")}
    method, comp = run.method, run.compressor
    out = {}
    for k, v in flatten(run.config).items():
        if k in SEED_KEYS or k in IGNORED_KEYS or k.startswith(IGNORED_PREFIXES):
            continue
        section, _, leaf = k.partition(".")
        if section == "method" and leaf != "name":
            if (leaf in GRAVAC_KEYS and method != "gravac") or (leaf in ACCORDION_KEYS and method != "accordion"):
                continue
            if method in ("dense", "static"):
                continue
        if section == "compressor":
            if method == "dense" or (leaf == "cf" and method != "static"):
                continue
            if leaf in COMPRESSOR_ONLY and COMPRESSOR_ONLY[leaf] != comp:
                continue
        out[k] = v
    return out


@dataclass(eq=False)
class Group:
    """Runs of one setting (seed replicas); `label` is set once all groups are known."""
    runs: list[Run]
    settings: dict[str, Any]
    label: str = ""

    @property
    def first(self) -> Run:
        return self.runs[0]

    @property
    def method(self) -> str:
        return self.first.method

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def slug(self) -> str:
        return slugify(self.label)


@dataclass(eq=False)
class Context:
    """Settings that can be compared: same model, dataset, metric, cluster size and network."""
    model: str
    dataset: str
    metric: str
    workers: int | None
    network: str
    groups: list[Group] = field(default_factory=list)
    target: float | None = None
    target_note: str = ""

    @property
    def title(self) -> str:
        w = f", {self.workers} workers" if self.workers else ""
        return f"{self.model} / {self.dataset}{w}, network {self.network}"

    @property
    def slug(self) -> str:
        workers = f"{self.workers}w" if self.workers else "unknown"
        return slugify(f"{self.model}-{self.dataset}-{workers}-{self.network}".replace("?", "unknown"))

    @property
    def higher_is_better(self) -> bool:
        return HIGHER_IS_BETTER.get(self.metric, True)

    @property
    def runs(self) -> list[Run]:
        return [r for g in self.groups for r in g.runs]

    def find(self, label: str) -> Group | None:
        return next((g for g in self.groups if g.label == label), None)


def slugify(text: str) -> str:
    """A file-name-safe version of a label ("GraVAC ε=0.7 (dgc)" -> "gravac-eps0.7-dgc")."""
    text = text.replace("ε=", "eps").replace("×", "x").replace("/", "-")
    keep = "".join(c.lower() if c.isalnum() or c in ".-_" else "-" for c in text)
    while "--" in keep:
        keep = keep.replace("--", "-")
    return keep.strip("-") or "run"


METHOD_ORDER = {"dense": 0, "static": 1, "accordion": 2, "gravac": 3}
COMPRESSOR_ORDER = {"none": 0, "topk": 1, "dgc": 2, "redsync": 3, "randomk": 4}


def _group_order(g: Group) -> tuple:
    r = g.first
    eps = r.cfg("method.epsilon", 0) if r.method == "gravac" else 0
    return (METHOD_ORDER.get(r.method, 9), COMPRESSOR_ORDER.get(r.compressor, 9), r.compressor,
            r.cf or 0, eps or 0, g.label)


def build_contexts(runs: list[Run], target: float | None = None) -> list[Context]:
    """Group runs into settings and settings into contexts; label groups; pick each context's target.

    The target is `target` when given (for an accuracy metric a value above 1 is read as a
    percentage), else the most common configured target among the context's runs.
    """
    ctxs: dict[tuple, Context] = {}
    for run in runs:
        key = (run.model, run.dataset, run.metric, run.workers, str(run.network.get("name", "?")))
        ctx = ctxs.setdefault(key, Context(*key))
        settings = relevant_settings(run)
        for g in ctx.groups:
            if g.settings == settings:
                g.runs.append(run)
                break
        else:
            ctx.groups.append(Group(runs=[run], settings=settings))
    out = list(ctxs.values())
    for ctx in out:
        assign_labels(ctx.groups)
        ctx.groups.sort(key=_group_order)
        for g in ctx.groups:
            g.runs.sort(key=lambda r: (r.cfg("train.seed", 0) or 0, r.name))
        _pick_target(ctx, target)
    out.sort(key=lambda c: (c.model, c.dataset, c.workers or 0, c.network))
    return out


def _pick_target(ctx: Context, override: float | None) -> None:
    if override is not None:
        t = override
        if ctx.metric in ("top1", "top5") and t > 1:
            t = t / 100
            ctx.target_note = f"--target {override:g} read as {t:g} ({ctx.metric} is a fraction)"
        ctx.target = t
        return
    targets = [r.target for r in ctx.runs if r.target is not None]
    if not targets:
        return
    values, counts = np.unique(np.array(targets), return_counts=True)
    ctx.target = float(values[np.argmax(counts)])
    if len(values) > 1:
        ctx.target_note = (f"runs have different targets ({', '.join(f'{v:g}' for v in values)}); "
                           f"using the most common, {ctx.target:g} (override with --target)")
