"""The plug-in registries of every kind, with the built-in plug-ins and the user's loaded.

`registries()` maps a kind (compressor, method, model, dataset) to its Registry. Each registry
finds its built-ins by importing every module of its package (`Registry.load_builtins`); user
plug-ins are modules named in $GRAVAC_PLUGINS or installed under the `gravac_bench.plugins`
entry-point group (see CONTRIBUTING.md), imported after every built-in so that a plug-in taking a
built-in's name is the one refused. Registering is `@REGISTRY.register(name, ConfigClass)` on the
class or builder (gravac.core.registry).
"""
from __future__ import annotations

from compressors import COMPRESSORS
from gravac.core.registry import Registry
from gravac.data.registry import DATASETS
from gravac.methods.base import METHODS
from gravac.models.registry import MODELS


def registries() -> dict[str, Registry]:
    """{kind: Registry}, loading built-ins and plug-ins on first use."""
    regs = {"compressor": COMPRESSORS, "method": METHODS, "model": MODELS, "dataset": DATASETS}
    for reg in regs.values():
        reg.load_builtins()
    for reg in regs.values():
        reg.load()
    return regs
