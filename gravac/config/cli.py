"""The command line of bench/run.py: overrides checked in one line per mistake before Hydra sees
them (unknown groups, options and keys; composition errors), and `--help` with every plug-in's
description and options, from the registries.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from compressors import NO_COMPRESSOR
from gravac.config.plugins import registries
from gravac.core.check import ConfigError
from gravac.core.registry import field_doc
from gravac.core.schema import PLUGGABLE, SECTIONS
from gravac.config.compose import base_node, group_options, not_an_option, option_nodes


def check_overrides(argv: list[str], conf_dir: str) -> None:
    """Reject unknown group options and unknown keys on the command line before Hydra sees them.

    Hydra would also refuse them, but with a multi-line message; this gives the one-line form
    ("unknown model 'x'; choose one of: ...") for the mistakes users make most. A key is known if
    it is a common field of its section or an option of any registered plug-in of that kind.
    """
    groups = sorted(d for d in os.listdir(conf_dir) if os.path.isdir(os.path.join(conf_dir, d))) + \
        [k for k in PLUGGABLE if not os.path.isdir(os.path.join(conf_dir, k))]
    base = base_node()
    opts = option_nodes()
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith("hydra") or "(" in value or "$" in value:
            continue
        if key in groups:
            options = group_options(key, conf_dir)
            for choice in value.split(","):
                if choice not in options:
                    raise ConfigError(f"unknown {key} {choice!r}; choose one of: {', '.join(options)}")
            continue
        parts = key.split(".")
        node: Any = base
        if parts[0] in opts and len(parts) == 2:
            node = {**base[parts[0]], **{k: v for n in opts[parts[0]].values() for k, v in n.items()}}
            if parts[1] not in node:
                raise ConfigError(f"unknown key {key}; valid keys under {parts[0]}: {', '.join(node)}")
            continue
        for i, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                where = ".".join(parts[:i]) or "config"
                valid = ", ".join(node) if isinstance(node, dict) else "(none: it is a value)"
                raise ConfigError(f"unknown key {key}; valid keys under {where}: {valid}")
            node = node[part]


def check_composition(argv: list[str], conf_dir: str, limit: int = 64) -> None:
    """Compose the config as Hydra will (each job of a sweep, up to `limit`) and turn a
    composition error into one line; the common case is an option of a plug-in other than the
    chosen one (`method=static method.epsilon=0.5`), which Hydra reports in several lines."""
    import itertools

    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    args = [a for a in argv if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except Exception as e:  # a syntax error: Hydra's own first line says it well
        raise ConfigError(str(e).strip().splitlines()[0]) from None
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
               else [o.input_line] for o in parsed]
    with initialize_config_dir(config_dir=os.path.abspath(conf_dir), version_base="1.3"):
        for job in itertools.islice(itertools.product(*choices), limit):
            try:
                compose(config_name="config", overrides=list(job))
            except Exception as e:  # noqa: BLE001 - every composition error becomes one line
                raise ConfigError(_composition_message(e, list(job))) from None


def _composition_message(err: Exception, overrides: list[str]) -> str:
    """One line for a Hydra composition error, naming the chosen plug-in when a key is not its."""
    import re

    from hydra import compose
    text = str(err).strip()
    m = re.search(r"Could not override '([\w.]+)'", text)
    if m and m.group(1).split(".")[0] in PLUGGABLE and m.group(1).count(".") == 1:
        kind, key = m.group(1).split(".")
        rest = [o for o in overrides if not o.lstrip("+~").startswith(f"{kind}.{key}=")]
        try:
            chosen = compose(config_name="config", overrides=rest)[kind]["name"]
        except Exception:  # noqa: BLE001
            chosen = None
        if chosen is not None and chosen in registries()[kind]:
            return not_an_option(kind, chosen, key)
    options = re.search(r"Available options in '([\w/]+)':\n((?:\t\S+\n)+)", text + "\n")
    if options:   # an unknown hydra/launcher (or other Hydra group) choice: name the valid ones
        return f"{text.splitlines()[0]}; choose one of: {', '.join(options.group(2).split())}"
    return text.splitlines()[0]


def key_types(cls: type) -> list[str]:
    """`key: type = default` for each common field of config section `cls` (not `name`, which is
    the group's choice), its choices in place of the type when it has them: what `--help` shows so
    that a value's type is known before a run refuses it."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name == "name":
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        kind = " | ".join(map(str, f.metadata["choices"])) if f.metadata.get("choices") else f.type
        out.append(f"{f.name}: {kind} = {default!r}" if isinstance(default, str) else f"{f.name}: {kind} = {default}")
    return out


def help_text(conf_dir: str) -> str:
    """`bench/run.py --help`: every plug-in with its one-line description and options (from the
    registries), the other config groups' options (from conf/), and where to look further."""
    lines = ["gravac-bench: communication-efficient data-parallel training benchmark",
             "Usage: python bench/run.py [group=option ...] [key=value ...]   (-m runs a sweep: method=dense,gravac)",
             "", "Plug-ins: group=option, then group.key=value for the option's settings (defaults shown)"]
    for kind in PLUGGABLE:
        reg = registries()[kind]
        lines.append(f"  {kind}:")
        entries = sorted(reg.entries(), key=lambda e: e.name)
        if kind == "compressor":
            lines.append(f"    {NO_COMPRESSOR:13} no compression (method=dense)")
        for e in entries:
            opts = option_nodes()[kind][e.name]
            extra = " [" + " ".join(f"{k}={v}" for k, v in opts.items()) + "]" if opts else ""
            lines.append(f"    {e.name:13} {e.doc}{extra}")
            lines += [f"      {k}: {field_doc(e.config, k)}" for k in opts if field_doc(e.config, k)]
    lines += ["", "Other groups: group=option"]
    for group in sorted(os.listdir(conf_dir)):
        if group not in PLUGGABLE and group != "hydra" and os.path.isdir(os.path.join(conf_dir, group)):
            lines.append(f"  {group}: {', '.join(group_options(group, conf_dir))}")
    lines += ["", "Settings of every run, key: type = default (a | b: one of these; the composed config: --cfg job)"]
    lines += [f"  {name}: {', '.join(key_types(cls))}" for name, cls in SECTIONS.items() if key_types(cls)]
    lines += ["", "Examples:",
              "  python bench/run.py                                   # resnet_mini, synthetic data, 4 simulated workers",
              "  python bench/run.py model=vgg16 --cfg job             # show a composed config without running",
              "  python bench/run.py method=static compressor=topk compressor.cf=100 cluster=ddp cluster.workers=2",
              "  python bench/run.py -m method=dense,gravac            # a sweep",
              "  python bench/run.py -m hydra/launcher=joblib hydra.launcher.n_jobs=2 arm=topk10,dense   # 2 jobs at a time",
              "  python bench/run.py -m hydra/launcher=slurm hydra.launcher.partition=P arm=topk10,dense  # SLURM jobs",
              "Data: dataset.root (default $GRAVAC_DATA_DIR, else ./data). Results: experiment.results_root. "
              "See README.md; Hydra's own help: --hydra-help"]
    return "\n".join(lines)
