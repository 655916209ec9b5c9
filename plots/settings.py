"""Settings (seed replicas of one configuration) and contexts (settings that can be compared).

What defines a setting comes from the runs themselves: every config key except seeds, paths,
logging and the keys the run's method says it ignores (summary.json `setting.ignores`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plots.labels import assign_labels
from plots.load import HIGHER_IS_BETTER, Run

SEED_KEYS = {"train.seed", "dataset.seed"}
IGNORED_PREFIXES = ("experiment.", "logger.", "setting.")
IGNORED_KEYS = {"dataset.root", "dataset.cache_dir", "clock.cache_dir", "clock.extend_machine", "dataset.download", "cluster.threads", "cluster.timeout_s",
                "cluster.max_memory_gb", "train.eval_batch_size", "train.target", "train.target_metric"}

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
    ignored = tuple(run.setting.get("ignores", []))
    return {k: v for k, v in flatten(run.config).items()
            if k not in SEED_KEYS and k not in IGNORED_KEYS and not k.startswith(IGNORED_PREFIXES)
            and not (ignored and k.startswith(ignored))}


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


def _group_order(g: Group) -> tuple:
    """Tables and legends list settings in the order their methods state (summary `setting.order`:
    method, compressor, then e.g. the CF or epsilon), then by label."""
    return (tuple(_sortable(v) for v in g.first.setting.get("order", [])), g.label)


def _sortable(v: Any) -> tuple:
    """Numbers before strings, so mixed lists compare."""
    return (0, float(v), "") if isinstance(v, (int, float)) else (1, 0.0, str(v))


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
