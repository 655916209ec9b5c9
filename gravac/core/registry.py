"""Registries of named plug-ins and the option fields their config dataclasses are made of.

Every pluggable kind (compressor, method, model, dataset) has one `Registry`: an entry owns the
name, the config dataclass (its options, with defaults, ranges and choices declared on the
fields through `option`) and the object that builds the thing. Config validation, the valid
choices in error messages, `--help`, memory estimates and plot labels all read these entries,
so adding a plug-in is one module (class + config dataclass + `@REGISTRY.register`) plus one
YAML file. Each kind declares the facts an entry carries beyond its config as a spec
dataclass (a model's `task`, a compressor's table `order`): `register(name, Cfg, task="lm")`
builds the spec, so a misspelt or missing fact fails at registration, not when it is read.
Part of gravac.core: pure Python, imports nothing of the project.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable


class PluginError(ValueError):
    """A plug-in cannot be loaded or registered; the message says which one and how to fix it,
    in one line (entry points print it without a traceback)."""


def option(default: Any = dataclasses.MISSING, *, check: Callable[[Any], bool] | None = None,
           valid: str = "", choices: tuple | None = None, factory: Callable[[], Any] | None = None,
           doc: str = ""):
    """A config field with its validation: `check(value)` must hold (`valid` says what is valid,
    e.g. ">= 1"), or the value must be one of `choices`. `doc` says in a few words what the field
    means (printed by `--help` and `field_doc`)."""
    meta = {"check": check, "valid": valid, "choices": tuple(choices) if choices else None, "doc": doc}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def field_errors(obj: Any, prefix: str) -> list[str]:
    """One-line messages for every field of dataclass `obj` whose value breaks its declaration."""
    out = []
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}.{f.name}"
        choices, check = f.metadata.get("choices"), f.metadata.get("check")
        if choices is not None and value not in choices:
            out.append(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")
        elif check is not None and not _holds(check, value):
            out.append(f"{key}={value!r} is out of range: must be {f.metadata.get('valid') or 'valid'}")
    return out


def field_doc(cls: type, name: str) -> str:
    """What field `name` of config dataclass `cls` means (its `option(doc=...)`), else ""."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("doc", "") or ""
    return ""


def _holds(check: Callable[[Any], bool], value: Any) -> bool:
    try:
        return bool(check(value))
    except (TypeError, ValueError):      # a value of the wrong type ("abc" >= 1) is not valid either
        return False


def own_fields(cls: type, base: type) -> list[str]:
    """Names of the fields `cls` adds to its `base` config class (its own options)."""
    inherited = {f.name for f in dataclasses.fields(base)}
    return [f.name for f in dataclasses.fields(cls) if f.name not in inherited]


@dataclass(frozen=True)
class NoSpec:
    """The spec of a kind whose entries carry nothing beyond name, config, label and doc."""


@dataclass
class Entry:
    """One registered plug-in: `name`, its config dataclass, the registered object, a label, and
    `spec`, the kind's typed facts about it (an instance of the registry's spec class)."""
    name: str
    config: type
    target: Any
    label: str
    spec: Any
    description: str = ""

    @property
    def doc(self) -> str:
        """One line for listings (--help): the registered description, else the target's
        docstring's first line."""
        doc = self.description or getattr(self.target, "__doc__", None) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


class Registry:
    """Named plug-ins of one kind, all configured by subclasses of `base` (a dataclass).

    `spec` is the dataclass of the kind's per-entry facts (keywords of `register`); `package`,
    when given, is the package whose every module `load()` imports (the built-ins), together
    with the user's plug-in modules (`import_plugins`)."""

    def __init__(self, kind: str, base: type, *, spec: type = NoSpec, package: str | None = None):
        self.kind, self.base, self.spec, self.package = kind, base, spec, package
        self._entries: dict[str, Entry] = {}
        self._loaded = self._builtins = False

    def load(self) -> "Registry":
        """The built-ins (`load_builtins`), then the user's plug-ins (`import_plugins`); a failure
        (e.g. PluginError) leaves the registry to try again on the next call."""
        self.load_builtins()
        if not self._loaded:
            self._loaded = True        # first, so that a plug-in calling load() does not recurse
            try:
                import_plugins()
            except BaseException:
                self._loaded = False
                raise
        return self

    def load_builtins(self) -> "Registry":
        """Import every module of `package` (their `register` decorators run), once."""
        if self.package and not self._builtins:
            self._builtins = True
            try:
                import_submodules(self.package)
            except BaseException:
                self._builtins = False
                raise
        return self

    def register(self, name: str, config: type | None = None, *, label: str | None = None, doc: str = "",
                 **facts):
        """Decorator registering `target` under `name` with config dataclass `config`
        (default: the kind's base, i.e. no options of its own); `label` names it in plots, `doc`
        describes it in one line (default: the target's docstring). `facts` are the fields of the
        kind's spec dataclass (e.g. a model's task). Registering a taken name with a different
        target is an error."""
        config = config or self.base
        if not (isinstance(config, type) and issubclass(config, self.base) and dataclasses.is_dataclass(config)):
            raise TypeError(f"{self.kind} {name!r}: config must be a dataclass subclassing {self.base.__name__}")
        try:
            spec = self.spec(**facts)
        except TypeError as e:
            known = ", ".join(f.name for f in dataclasses.fields(self.spec)) or "none"
            raise TypeError(f"{self.kind} {name!r}: {e}; the facts a {self.kind} registers: {known}") from None

        def deco(target):
            old = self._entries.get(name)
            if old is not None and _where(old.target) != _where(target):  # a module imported twice is fine
                raise PluginError(f"{self.kind} {name!r} is already registered by {_where(old.target)}: "
                                  f"register yours under another name")
            self._entries[name] = Entry(name, config, target, label or name, spec, doc)
            return target
        return deco

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __getitem__(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(self.names())}") from None

    def __iter__(self):
        return iter(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def options(self, name: str) -> list[str]:
        """The option names entry `name` adds to the kind's common fields."""
        return own_fields(self[name].config, self.base)


def _where(target) -> str:
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def import_submodules(package: str) -> None:
    """Import every module of `package` (so their `register` decorators run): nobody keeps the
    list of plug-ins by hand."""
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def import_plugins() -> None:
    """Import user plug-in modules named in $GRAVAC_PLUGINS (comma-separated) and the
    `gravac_bench.plugins` entry points of installed packages. A module that cannot be found or
    imported, or that registers a taken name, raises one PluginError line naming it. Importing a
    module twice is a no-op, so every registry's `load()` may call this."""
    names = [(n.strip(), "GRAVAC_PLUGINS") for n in os.environ.get("GRAVAC_PLUGINS", "").split(",") if n.strip()]
    try:
        from importlib.metadata import entry_points
        names += [(ep.value, f"entry point {ep.name!r} of group gravac_bench.plugins")
                  for ep in entry_points(group="gravac_bench.plugins")]
    except Exception:  # pragma: no cover - metadata problems must not stop a run
        pass
    for name, source in names:
        what = f"plug-in module {name!r} (from {source})"
        try:
            importlib.import_module(name)
        except ImportError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                raise PluginError(f"{what} is not found: fix the name, or put the folder holding it on "
                                  f"PYTHONPATH") from None
            raise PluginError(f"{what} cannot be imported: {e}") from None
        except PluginError as e:
            raise PluginError(f"{what}: {e}") from None
