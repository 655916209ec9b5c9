"""Turn Hydra's composed config into a checked RunConfig: the one place config is read.

Every user mistake (wrong type, out-of-range value, unknown option or key) becomes a ConfigError
whose message is one line naming the key, the bad value and what would be valid.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Mapping

from gravac import schema
from gravac.schema import RunConfig


class ConfigError(ValueError):
    """A config value a user typed is wrong; the message is one line meant for the user."""


CHOICES: dict[str, tuple[str, ...]] = {
    "model.name": ("resnet101", "vgg16", "lstm", "resnet_mini", "vgg_mini", "lstm_mini"),
    "dataset.name": ("synthetic", "cifar10", "cifar100", "ptb"),
    "dataset.eval_split": ("test", "valid"),
    "compressor.name": ("none", "topk", "dgc", "redsync", "randomk"),
    "compressor.granularity": ("layer", "flat"),
    "method.name": ("dense", "static", "accordion", "gravac"),
    "method.policy": ("exponential", "geometric"),
    "method.tcomp": ("mean", "last"),
    "method.grow_if": ("always", "accepted"),
    "method.accumulate": ("local", "averaged"),
    "cluster.backend": ("sim", "ddp"),
    "cluster.dist_backend": ("auto", "gloo", "nccl"),
    "cluster.device": ("cpu", "cuda"),
    "network.time_source": ("auto", "modelled", "wall"),
    "train.target_metric": ("top1", "top5", "perplexity"),
    "logger.name": ("none", "wandb"),
    "logger.mode": ("offline", "online", "disabled"),
}

# (key, predicate, description of the valid range)
RANGES: list[tuple[str, typing.Callable[[Any], bool], str]] = [
    ("model.width", lambda v: v >= 1, ">= 1"),
    ("model.blocks", lambda v: v >= 1, ">= 1"),
    ("model.embed_size", lambda v: v >= 1, ">= 1"),
    ("model.hidden_size", lambda v: v >= 1, ">= 1"),
    ("model.num_layers", lambda v: v >= 1, ">= 1"),
    ("model.dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("dataset.bptt", lambda v: v >= 1, ">= 1"),
    ("dataset.num_classes", lambda v: v >= 2, ">= 2"),
    ("dataset.image_size", lambda v: v >= 8, ">= 8"),
    ("dataset.train_size", lambda v: v >= 1, ">= 1"),
    ("dataset.test_size", lambda v: v >= 1, ">= 1"),
    ("dataset.noise", lambda v: v >= 0, ">= 0"),
    ("compressor.cf", lambda v: v >= 1, ">= 1 (CF = dense size / sent size)"),
    ("compressor.sample_ratio", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("compressor.warmup_epochs", lambda v: v >= 0, ">= 0"),
    ("compressor.max_iters", lambda v: v >= 1, ">= 1"),
    ("method.cf_min", lambda v: v >= 1, ">= 1"),
    ("method.cf_max", lambda v: v >= 1, ">= 1"),
    ("method.window", lambda v: v >= 1, ">= 1"),
    ("method.step", lambda v: v > 1, "> 1"),
    ("method.epsilon", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("method.omega", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("method.ewma", lambda v: v < 0 or 0 < v <= 1, "in (0, 1], or < 0 for N/100"),
    ("method.cf_low", lambda v: v >= 1, ">= 1"),
    ("method.cf_high", lambda v: v >= 1, ">= 1"),
    ("method.switch_freq", lambda v: v >= 1, ">= 1"),
    ("method.eta", lambda v: v > 0, "> 0"),
    ("cluster.workers", lambda v: v >= 1, ">= 1"),
    ("cluster.threads", lambda v: v >= 0, ">= 0"),
    ("cluster.timeout_s", lambda v: v > 0, "> 0"),
    ("cluster.max_memory_gb", lambda v: v >= 0, ">= 0"),
    ("network.bandwidth_gbps", lambda v: v > 0, "> 0"),
    ("network.latency_us", lambda v: v >= 0, ">= 0"),
    ("network.comm_ratio", lambda v: v >= 0, ">= 0"),
    ("network.calibrate_steps", lambda v: v >= 1, ">= 1"),
    ("train.batch_size", lambda v: v >= 1, ">= 1"),
    ("train.lr", lambda v: v > 0, "> 0"),
    ("train.momentum", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("train.weight_decay", lambda v: v >= 0, ">= 0"),
    ("train.gamma", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("train.steps", lambda v: v >= 1, ">= 1"),
    ("train.epochs", lambda v: v >= 0, ">= 0"),
    ("train.eval_every", lambda v: v >= 1, ">= 1"),
    ("train.eval_batch_size", lambda v: v >= 1, ">= 1"),
    ("train.target", lambda v: v >= 0, ">= 0"),
    ("train.grad_clip", lambda v: v >= 0, ">= 0"),
    ("train.checkpoint_every", lambda v: v >= 0, ">= 0 (0 = only when stopped)"),
    ("train.milestones", lambda v: all(isinstance(m, int) and m >= 1 for m in v), "a list of step numbers >= 1"),
]


def build_config(cfg: Any) -> RunConfig:
    """Build and check a RunConfig from a DictConfig or plain mapping; raises ConfigError."""
    try:
        from omegaconf import DictConfig, OmegaConf
        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    except Exception as e:  # interpolation errors (e.g. a missing env variable) are user errors
        raise ConfigError(f"cannot resolve config: {e}".splitlines()[0]) from None
    cfg = {k: v for k, v in dict(cfg).items() if k != "hydra"}
    run = _build(RunConfig, cfg, "")
    _check(run)
    if run.method.name == "dense" and run.compressor.name != "none":
        # dense ignores the compressor, so a grid `method=dense,gravac compressor=topk,dgc` works;
        # the run records compressor=none so it is never mistaken for a compressed run
        run.compressor = schema.CompressorCfg()
    return run


def _build(cls: type, data: Any, path: str) -> Any:
    """Recursively build dataclass `cls` from a mapping, checking keys and types."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls, vars(schema))
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ConfigError(f"unknown key {key}; valid keys under {path or 'config'}: {', '.join(fields)}")
    kwargs = {}
    for name, value in data.items():
        key = f"{path}.{name}" if path else name
        kwargs[name] = _coerce(hints[name], value, key)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, key: str) -> Any:
    """Check `value` against a field's type hint, allowing int where float is expected."""
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key)
    origin = typing.get_origin(hint)
    if origin is typing.Union:  # Optional[...]
        if value is None:
            return None
        hint = [a for a in typing.get_args(hint) if a is not type(None)][0]
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} is not a boolean (use true or false)")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} is not an integer")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ConfigError(f"{key}={value!r} must be a finite number")
            return float(value)
        raise ConfigError(f"{key}={value!r} is not a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}={value!r} is not a string")
    if hint is list or origin is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        raise ConfigError(f"{key}={value!r} is not a list (use [a,b,...])")
    return value


def get(run: RunConfig, key: str) -> Any:
    """Read a dotted key such as 'train.lr' from a RunConfig."""
    obj: Any = run
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _check(run: RunConfig) -> None:
    """Check choices, ranges and combinations that a type alone cannot express."""
    for key, choices in CHOICES.items():
        value = get(run, key)
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(choices)}")
    for key, ok, desc in RANGES:
        value = get(run, key)
        if not ok(value):
            raise ConfigError(f"{key}={value!r} is out of range: must be {desc}")
    m, c = run.method, run.compressor
    if m.name in ("static", "accordion", "gravac") and c.name == "none":
        raise ConfigError(f"method={m.name} needs a compressor; set compressor= one of: topk, dgc, redsync, randomk")
    if m.name == "gravac" and m.cf_max < m.cf_min:
        raise ConfigError(f"method.cf_max={m.cf_max} must be >= method.cf_min={m.cf_min}")
    if m.name == "accordion" and m.cf_high < m.cf_low:
        raise ConfigError(f"method.cf_high={m.cf_high} must be >= method.cf_low={m.cf_low}")
    lm = run.dataset.name == "ptb"
    if lm != run.model.name.startswith("lstm"):
        raise ConfigError(f"model={run.model.name} does not fit dataset={run.dataset.name}: "
                          "lstm models need dataset=ptb, CNNs an image dataset")
    if lm and run.train.target_metric != "perplexity":
        raise ConfigError("dataset=ptb is evaluated by perplexity; set train.target_metric=perplexity")
    if not lm and run.train.target_metric == "perplexity":
        raise ConfigError(f"dataset={run.dataset.name} is evaluated by top1/top5, not perplexity")
    if run.dataset.eval_split == "valid" and not lm:
        raise ConfigError(f"dataset.eval_split=valid exists only for ptb; {run.dataset.name} has a test split")
    if run.train.target_metric in ("top1", "top5") and run.train.target > 1:
        raise ConfigError(f"train.target={run.train.target} is a fraction for {run.train.target_metric} (0.8 = 80%)")
    if run.cluster.dist_backend == "nccl" and run.cluster.device != "cuda":
        raise ConfigError("cluster.dist_backend=nccl needs cluster.device=cuda; use gloo on CPU")


def base_node() -> dict:
    """The schema's defaults as a plain dict: the first layer of every composed config.

    Group YAML files then only state what they change, yet every key exists (so `key=value`
    overrides work without '+') and `--cfg job` shows the complete configuration.
    """
    node = dataclasses.asdict(RunConfig())
    node["dataset"]["root"] = "${oc.env:GRAVAC_DATA_DIR,./data}"
    return node


def register_base() -> None:
    """Store base_node() in Hydra's ConfigStore as `gravac_base` (conf/config.yaml starts from it)."""
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name="gravac_base", node=base_node())


def check_overrides(argv: list[str], conf_dir: str) -> None:
    """Reject unknown group options and unknown keys on the command line before Hydra sees them.

    Hydra would also refuse them, but with a multi-line message; this gives the one-line form
    ("unknown model 'x'; choose one of: ...") for the mistakes users make most.
    """
    import os
    groups = sorted(d for d in os.listdir(conf_dir) if os.path.isdir(os.path.join(conf_dir, d)))
    base = base_node()
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith("hydra") or "(" in value or "$" in value:
            continue
        if key in groups:
            options = sorted(f[:-5] for f in os.listdir(os.path.join(conf_dir, key)) if f.endswith(".yaml"))
            for choice in value.split(","):
                if choice not in options:
                    raise ConfigError(f"unknown {key} {choice!r}; choose one of: {', '.join(options)}")
            continue
        parts = key.split(".")
        node: Any = base
        for i, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                where = ".".join(parts[:i]) or "config"
                valid = ", ".join(node) if isinstance(node, dict) else "(none: it is a value)"
                raise ConfigError(f"unknown key {key}; valid keys under {where}: {valid}")
            node = node[part]
