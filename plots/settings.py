"""Settings (seed replicas of one configuration) and contexts (settings that can be compared).

What defines a setting comes from the runs themselves: every config key except seeds, paths,
logging and the keys the run's method says it ignores (summary.json `setting.ignores`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from plots.labels import assign_labels
from plots.load import HIGHER_IS_BETTER, Run

MAX_SERIES = 8      # settings drawn on one axes; more go to continuation figures ("2/3")
SHORT_RATIO = 10    # a setting whose runs are this many times shorter than its context's longest is drawn apart

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
    out = {k: v for k, v in flatten(run.config).items()
           if k not in SEED_KEYS and k not in IGNORED_KEYS and not k.startswith(IGNORED_PREFIXES)
           and not (ignored and k.startswith(ignored))}
    if out.get("clock.machine") == "auto":   # the device it resolved to, as a run that named it says
        out["clock.machine"] = resolved_machine(run)
    return out


def resolved_machine(run: Run) -> str:
    """The device clock.machine=auto chose: the named device its profile came from, else "" (this
    host), from summary.json's clock."""
    prof = ((run.summary or {}).get("clock") or {}).get("profile") or {}
    machine = prof.get("machine") or ""
    return "" if machine.startswith("torch ") else machine    # a host's key, not a device name


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
    """Settings that can be compared: same study, model, dataset, metric, cluster size and network.
    `part` ("2/3") marks one of the figures a context with too many settings is split into."""
    model: str
    dataset: str
    metric: str
    workers: int | None
    network: str
    groups: list[Group] = field(default_factory=list)
    target: float | None = None
    target_note: str = ""
    merged_keys: dict[str, Any] = field(default_factory=dict)   # options only newer runs record (see build_contexts)
    study: str = ""
    part: str = ""

    @property
    def title(self) -> str:
        w = f", {self.workers} workers" if self.workers else ""
        study = f"{self.study}: " if self.study else ""
        part = f" ({self.part})" if self.part else ""
        return f"{study}{self.model} / {self.dataset}{w}, network {self.network}{part}"

    @property
    def slug(self) -> str:
        workers = f"{self.workers}w" if self.workers else "unknown"
        study = f"{self.study}-" if self.study else ""
        return slugify(f"{study}{self.model}-{self.dataset}-{workers}-{self.network}".replace("?", "unknown"))

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
    percentage), else the most common configured target among the context's runs. Runs written
    before an option existed join the replicas that record it with one value (`merged_keys`).
    """
    ctxs: dict[tuple, Context] = {}
    by_ctx: dict[tuple, list[Run]] = {}
    for run in runs:
        by_ctx.setdefault((run.model, run.dataset, run.metric, run.workers, str(run.network.get("name", "?")),
                           run.study), []).append(run)
    for key, members in by_ctx.items():
        ctx = ctxs.setdefault(key, Context(*key[:5], study=key[5]))
        settings, ctx.merged_keys = _settings_across_versions(members)
        for run, setting in zip(members, settings):
            _add_to_group(ctx, run, setting)
    out = list(ctxs.values())
    for ctx in out:
        assign_labels(ctx.groups)
        ctx.groups.sort(key=_group_order)
        for g in ctx.groups:
            g.runs.sort(key=lambda r: (r.cfg("train.seed", 0) or 0, r.name))
        _pick_target(ctx, target)
    out.sort(key=lambda c: (c.study, c.model, c.dataset, c.workers or 0, c.network))
    return out


def merged_note(ctx: Context) -> str:
    """One sentence on the options `build_contexts` merged across code versions, or ""."""
    if not ctx.merged_keys:
        return ""
    what = ", ".join(f"{k}={v}" for k, v in ctx.merged_keys.items())
    return f"runs written before these options existed count as {what} (their value in every run that records them)"


def _add_to_group(ctx: Context, run: Run, settings: dict[str, Any]) -> None:
    for g in ctx.groups:
        if g.settings == settings:
            g.runs.append(run)
            return
    ctx.groups.append(Group(runs=[run], settings=settings))


def _settings_across_versions(runs: list[Run]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each run's relevant settings, where an option that only newer runs record (added to the code
    after the older runs were written) does not split replicas: a key missing from some runs of a
    context and set to one value in all the others is dropped, and returned with that value. The
    older code behaved as that value when adding an option keeps the old behaviour as its default
    (this project's rule); runs that vary the option are still split by it."""
    settings = [relevant_settings(r) for r in runs]
    pairs = [(s, r) for s, r in zip(settings, runs) if r.has_config]
    kind = lambda r, k: r.cfg(k.split(".")[0] + ".name")  # noqa: E731  (the method, compressor, ...; None for train)
    merged = {}
    for k in sorted(set().union(*(s.keys() for s, _ in pairs))) if pairs else []:
        values = {s[k] for s, _ in pairs if k in s}
        kinds = {kind(r, k) for s, r in pairs if k in s}
        # a gap between versions: a run of the same method (compressor, ...) as those recording k lacks it;
        # keys only some methods have are not gaps
        if len(values) == 1 and any(k not in s and kind(r, k) in kinds for s, r in pairs):
            merged[k] = next(iter(values))
    return [{k: v for k, v in s.items() if k not in merged} for s in settings], merged


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


def steps_drawn(g: Group) -> int:
    """The most steps any replica of a setting recorded: how far its curves reach."""
    return max(len(r.steps) for r in g.runs)


def without_short_runs(ctx: Context, ratio: int = SHORT_RATIO) -> tuple[Context, list[Group]]:
    """The context without the settings whose runs are `ratio` times shorter than its longest, and
    those settings: a 20-step smoke run beside 800-step runs is a dot at the origin of every axis."""
    longest = max((steps_drawn(g) for g in ctx.groups), default=0)
    short = [g for g in ctx.groups if steps_drawn(g) * ratio <= longest]
    if not short:
        return ctx, []
    return replace(ctx, groups=[g for g in ctx.groups if g not in short]), short


def split_parts(ctx: Context, cap: int = MAX_SERIES) -> list[Context]:
    """The context as one or more contexts of at most `cap` settings each, in its order and of
    near-equal size, marked "1/3", "2/3", ... when there are several: one axes stays readable.
    Dense, when the context has it, opens every part, so each figure has its baseline."""
    if len(ctx.groups) <= cap:
        return [ctx]
    dense = next((g for g in ctx.groups if g.method == "dense"), None)
    rest = [g for g in ctx.groups if g is not dense]
    room = cap - (dense is not None)
    n = math.ceil(len(rest) / room)
    chunks = np.array_split(np.arange(len(rest)), n)
    return [replace(ctx, groups=[dense] * (dense is not None) + [rest[i] for i in idx], part=f"{k}/{n}")
            for k, idx in enumerate(chunks, 1)]
