"""Turn Hydra's composed config into a checked RunConfig: the one place config is read.

Every user mistake (wrong type, out-of-range value, unknown option or key) becomes a ConfigError
whose message is one line naming the key, the bad value and what would be valid. What is valid
comes from the schema's field declarations and the plug-in registries (gravac.config.plugins), never
from lists kept here.

A pluggable section (model, dataset, compressor, method) becomes the config class its chosen
plug-in registered. Presets may set options of several plug-ins of a kind (an experiment sets
GraVAC's window and Accordion's switch_freq for whichever method a sweep picks): options of
another registered plug-in are dropped, unless given on the command line, where they are an error.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
from typing import Any, Mapping

from compressors import NO_COMPRESSOR
from gravac.config.plugins import registries
from gravac.core import schema
from gravac.core.check import ConfigError, _build, check_section, checked  # noqa: F401 (ConfigError, checked: API)
from gravac.core.registry import own_fields
from gravac.core.schema import PLUGGABLE, SECTIONS, RunConfig
from gravac.methods import method_class


def build_config(cfg: Any, overrides: list[str] | None = None) -> RunConfig:
    """Build and check a RunConfig from a DictConfig or plain mapping; raises ConfigError.

    `overrides` are the command-line overrides: an option of a plug-in other than the chosen one
    is an error there, while presets may carry such options (they are dropped).
    """
    try:
        from omegaconf import DictConfig, OmegaConf
        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    except Exception as e:  # interpolation errors (e.g. a missing env variable) are user errors
        raise ConfigError(f"cannot resolve config: {e}".splitlines()[0]) from None
    data = {k: v for k, v in dict(cfg).items() if k not in ("hydra", "setting")}
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]}; valid keys: {', '.join(SECTIONS)}")
    explicit = {o.split("=", 1)[0].lstrip("+~") for o in overrides or [] if "=" in o}
    sections = {}
    for name, base in SECTIONS.items():
        node = data.get(name, {})
        if not isinstance(node, Mapping):
            raise ConfigError(f"{name} must be a mapping of options, got {node!r}")
        cls, node = _chosen(name, base, node, explicit) if name in PLUGGABLE else (base, node)
        sections[name] = _build(cls, node, name)
    run = RunConfig(**sections)
    _check(run)
    if run.train.epochs > 0 and "train.steps" in explicit:
        raise ConfigError(f"train.steps and train.epochs={run.train.epochs:g} are both set: the run length is one "
                          "of them; drop one (epochs > 0 wins over a preset's steps)")
    cls = method_class(run.method.name)
    if not cls.needs_compressor and run.compressor.name != NO_COMPRESSOR:
        # dense ignores the compressor, so a grid `method=dense,gravac compressor=topk,dgc` works;
        # the run records compressor=none so it is never mistaken for a compressed run (a method
        # selecting by itself, as ExDyna, keeps the common keys it reads, e.g. compressor.cf)
        run.compressor = schema.CompressorCfg(**{k: getattr(run.compressor, k) for k in cls.compressor_keys})
    return run


def _chosen(kind: str, base: type, node: Mapping, explicit: set[str]) -> tuple[type, dict]:
    """The chosen plug-in's config class, and `node` without preset options of other plug-ins."""
    reg = registries()[kind]
    name = node.get("name", base().name)
    if kind == "compressor" and name == NO_COMPRESSOR:
        cls = base                                  # compresses nothing: no options of its own
    elif name not in reg:
        raise ConfigError(f"{kind}.name={name!r} is not valid; choose one of: {', '.join(group_options(kind, ''))}")
    else:
        cls = reg[name].config
    mine = {f.name for f in dataclasses.fields(cls)}
    others = {o for e in reg.entries() for o in own_fields(e.config, base)} - mine
    for key in others & set(node) & {k.split(".", 1)[1] for k in explicit if k.startswith(kind + ".")}:
        raise ConfigError(not_an_option(kind, name, key))
    return cls, {k: v for k, v in node.items() if k not in others}


def not_an_option(kind: str, name: str, key: str) -> str:
    """The one-line message for an option the chosen plug-in does not have."""
    opts = registries()[kind].options(name)
    return f"{kind}.{key} is not an option of {kind}={name}; its options: {', '.join(opts) or 'none'}"


def saved_config(run: RunConfig) -> dict:
    """What config.yaml holds: every section, plus `setting`, the method's description of the run
    (label, style family, sort order, ignored keys), so plots need not import the library."""
    return {**dataclasses.asdict(run), "setting": method_class(run.method.name).describe(run.method, run.compressor)}


def sweep_key(run: RunConfig) -> str:
    """What makes two jobs of a sweep the same run: the resolved config without the keys its method
    declares it ignores (`Method.ignores`: dense ignores compressor.*, adaptive methods
    compressor.cf), as text."""
    import json
    ignored = tuple(method_class(run.method.name).ignores(run.method, run.compressor))

    def keep(node: dict, prefix: str = "") -> dict:
        return {k: keep(v, f"{prefix}{k}.") if isinstance(v, dict) else v
                for k, v in node.items() if not f"{prefix}{k}.".startswith(ignored) and f"{prefix}{k}" not in ignored}
    return json.dumps(keep(dataclasses.asdict(run)), sort_keys=True, default=str)


def same_run_line(run: RunConfig, job: tuple[int, list[str]], earlier: tuple[int, list[str]]) -> str:
    """The line saying sweep job (number, overrides) repeats `earlier`, a job with the same
    sweep_key, naming the overrides in which they differ and why those do not matter."""
    a, b = (dict(o.lstrip("+~").split("=", 1) for o in x[1] if "=" in o) for x in (job, earlier))
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    ignored = tuple(method_class(run.method.name).ignores(run.method, run.compressor))
    why = "the same resolved config"
    if differ and all(f"{k}.".startswith(ignored) or k.startswith(ignored) for k in differ):
        why = f"{run.method.name} ignores {', '.join(differ)}"
    shown = [" ".join(f"{k}={d.get(k, '(unset)')}" for k in differ) for d in (a, b)]
    return f"skipped job #{job[0]} ({shown[0]}): identical to job #{earlier[0]} ({shown[1]}); {why}"


def get(run: RunConfig, key: str) -> Any:
    """Read a dotted key such as 'train.lr' from a RunConfig."""
    obj: Any = run
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _fixed_cf(entry, cfg) -> float | None:
    """The CF a compressor's options fix (quantizers), None when compressor.cf sets it."""
    fixed = getattr(entry.target, "fixed_cf", None)
    return fixed(cfg) if fixed is not None else None


def _sparsifiers(comps) -> str:
    """The registered compressors whose CF compressor.cf sets, for error messages."""
    return ", ".join(n for n in comps.names() if _fixed_cf(comps[n], comps[n].config(name=n)) is None)


def _check(run: RunConfig) -> None:
    """Field declarations, each plug-in's own cross-field rules, then rules across sections."""
    for name in SECTIONS:
        check_section(getattr(run, name), name)
    m, c = run.method, run.compressor
    if method_class(m.name).needs_compressor and c.name == NO_COMPRESSOR:
        usable = registries()["compressor"].names()
        raise ConfigError(f"method={m.name} needs a compressor; set compressor= one of: {', '.join(usable)}")
    comps = registries()["compressor"]
    if c.name in comps and _fixed_cf(comps[c.name], c) is not None:     # a quantizer or cast: no CF to choose
        if method_class(m.name).needs_compressor and not method_class(m.name).takes_fixed_cf:
            methods = registries()["method"]
            takers = [f"method={n}" for n in sorted(methods.names()) if method_class(n).takes_fixed_cf
                      and not method_class(n).config_errors(methods[n].config(name=n), c)]   # that take this one
            listed = takers[0] if len(takers) == 1 else f"{', '.join(takers[:-1])} or {takers[-1]}"
            raise ConfigError(f"method={m.name} chooses compression factors, and compressor={c.name} has none to "
                              f"choose (its options fix its CF: a quantizer's code width, a 16-bit cast's 2x): "
                              f"use {listed} with it, or a sparsifier ({_sparsifiers(comps)})")
        if getattr(m, "probe_cfs", None):
            raise ConfigError(f"method.probe_cfs needs multi-level compression, which compressor={c.name} (its "
                              f"CF is fixed) cannot do: leave method.probe_cfs empty, or use a sparsifier "
                              f"({_sparsifiers(comps)})")
    fit = method_class(m.name).config_errors(m, c) if c.name in comps else []
    if fit:
        raise ConfigError(fit[0])
    task = registries()["model"][run.model.name].spec.task
    data_task = registries()["dataset"][run.dataset.name].spec.task
    if task != data_task:
        fits = [n for n in registries()["dataset"].names() if registries()["dataset"][n].spec.task == task]
        raise ConfigError(f"model={run.model.name} does not fit dataset={run.dataset.name}: "
                          f"it needs a {task} dataset ({', '.join(fits)})")
    lm = task == "lm"
    if lm and run.train.target_metric != "perplexity":
        raise ConfigError(f"dataset={run.dataset.name} is evaluated by perplexity; set train.target_metric=perplexity")
    if not lm and run.train.target_metric == "perplexity":
        raise ConfigError(f"dataset={run.dataset.name} is evaluated by top1/top5, not perplexity")
    if run.dataset.eval_split == "valid" and not lm:
        lms = [e.name for e in registries()["dataset"].entries() if e.spec.task == "lm"]
        raise ConfigError(f"dataset.eval_split=valid exists only for {', '.join(lms)} (language-model data); "
                          f"{run.dataset.name} has a test split")
    if run.train.target_metric in ("top1", "top5") and run.train.target > 1:
        raise ConfigError(f"train.target={run.train.target} is a fraction for {run.train.target_metric} (0.8 = 80%)")
    if run.cluster.dist_backend == "nccl" and run.cluster.device != "cuda":
        raise ConfigError("cluster.dist_backend=nccl needs cluster.device=cuda; use gloo on CPU")


# ---------------------------------------------------------------------------------------------
# Hydra: the base node and each plug-in's option defaults, generated from the schema and registries

def base_node() -> dict:
    """The common fields of every section with their defaults: the first layer of every composed
    config, so group YAML files only state what they change and `key=value` overrides of common
    keys work without '+'. Each plug-in's own options come from `option_nodes`."""
    node = dataclasses.asdict(RunConfig())
    node["dataset"]["root"] = "${oc.env:GRAVAC_DATA_DIR,./data}"
    return node


def option_nodes() -> dict[str, dict[str, dict]]:
    """{kind: {plug-in name: its own options with their defaults}}, from the registries."""
    out: dict[str, dict[str, dict]] = {}
    for kind in PLUGGABLE:
        base = SECTIONS[kind]()
        out[kind] = {}
        for e in registries()[kind].entries():
            values = dataclasses.asdict(e.config())
            out[kind][e.name] = {k: v for k, v in values.items()
                                 if k != "name" and (not hasattr(base, k) or getattr(base, k) != v)}
    out["compressor"][NO_COMPRESSOR] = {}
    return out


def unique_id() -> str:
    """This process's id and a random part: a sweep folder's suffix (conf/config.yaml's
    ${gravac.sweep_id:}) and its stop file's, which no other sweep started in the same second shares."""
    return f"{os.getpid()}{secrets.token_hex(2)}"


def register_resolvers() -> None:
    """${gravac.sweep_id:} in conf/config.yaml. Cached in the config, and Hydra copies the cache
    into every job's config, so each job of the sweep resolves the same folder."""
    from omegaconf import OmegaConf
    OmegaConf.register_new_resolver("gravac.sweep_id", unique_id, use_cache=True, replace=True)


def register_base() -> None:
    """Store base_node() as `gravac_base` and each plug-in's options as `options/<kind>/<name>` in
    Hydra's ConfigStore; conf/config.yaml picks the chosen plug-in's node by interpolation (and
    names a sweep's folder with ${gravac.sweep_id:})."""
    from hydra.core.config_store import ConfigStore

    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="gravac_base", node=base_node())
    for kind, nodes in option_nodes().items():
        for name, node in nodes.items():
            cs.store(group=f"options/{kind}", name=name, node=node)


def group_options(group: str, conf_dir: str) -> list[str]:
    """Choices of a config group: the registry's names for plug-in kinds, else the YAML files."""
    if group in PLUGGABLE:
        extra = [NO_COMPRESSOR] if group == "compressor" else []
        return sorted(list(registries()[group].names()) + extra)
    path = os.path.join(conf_dir, group)
    return sorted(f[:-5] for f in os.listdir(path) if f.endswith(".yaml")) if os.path.isdir(path) else []


def expand_seeds(argv: list[str]) -> list[str]:
    """`experiment.seeds=N` on the command line becomes the sweep `-m train.seed=0,...,N-1`: N seed
    replicas of the setting (of every cell of a grid), which tables and figures group into a mean
    with a 95% confidence interval. It is a command-line shorthand, not a config field."""
    found = [a for a in argv if a.split("=", 1)[0] == "experiment.seeds"]
    if not found:
        return argv
    if len(found) > 1:
        raise ConfigError("experiment.seeds is given twice; give it once")
    value = found[0].split("=", 1)[1]
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"experiment.seeds={value}: give the number of seed replicas, a whole number "
                          "from 1 (experiment.seeds=3 runs train.seed=0,1,2)")
    if any(a.split("=", 1)[0].lstrip("+~") == "train.seed" for a in argv):
        raise ConfigError("experiment.seeds and train.seed are both given; use experiment.seeds=N for "
                          "seeds 0..N-1 or -m train.seed=a,b,c for chosen seeds, not both")
    rest = [a for a in argv if a != found[0]]
    seeds = "train.seed=" + ",".join(str(i) for i in range(int(value)))
    multirun = [] if any(a in ("-m", "--multirun") for a in rest) else ["-m"]
    return multirun + rest + [seeds]


def section(kind: str, **values) -> Any:
    """One checked config section from plain values, e.g. section("model", name="resnet_mini",
    width=8): the registered plug-in's config class for pluggable kinds (for library use)."""
    run = build_config({kind: values})
    return getattr(run, kind)
