"""The plug-in registries of every kind, with the built-in plug-ins and the user's loaded.

`registries()` maps a kind (compressor, method, model, dataset) to its Registry. Built-ins are
found by importing every module of their package; user plug-ins are modules named in
$GRAVAC_PLUGINS or installed under the `gravac_bench.plugins` entry-point group (see
CONTRIBUTING.md). Registering is `@REGISTRY.register(name, ConfigClass)` on the class or builder.
"""
from __future__ import annotations

from compressors import COMPRESSORS
from compressors.registry import Registry, import_plugins, import_submodules

_loaded = False


def registries() -> dict[str, Registry]:
    """{kind: Registry}, loading built-ins and plug-ins on first use."""
    global _loaded
    from gravac.data.registry import DATASETS
    from gravac.methods.base import METHODS
    from gravac.models.registry import MODELS
    if not _loaded:
        _loaded = True         # first, so that a plug-in calling registries() does not recurse
        try:
            for package in ("gravac.methods", "gravac.models", "gravac.data"):
                import_submodules(package)
            import_plugins()
        except BaseException:  # e.g. PluginError: the next call tries again
            _loaded = False
            raise
    return {"compressor": COMPRESSORS, "method": METHODS, "model": MODELS, "dataset": DATASETS}
