"""build_compressor: compressors by name, for configs and command lines."""
from __future__ import annotations

import inspect

from .base import Compressor
from .dgc import DGC
from .layerwise import Layerwise
from .randomk import RandomK
from .redsync import RedSync
from .topk import TopK

COMPRESSORS: dict[str, type[Compressor]] = {"topk": TopK, "dgc": DGC, "redsync": RedSync, "randomk": RandomK}


def options_of(name: str) -> list[str]:
    """Keyword options the named compressor accepts (plus ``layer_sizes``)."""
    params = inspect.signature(COMPRESSORS[name].__init__).parameters
    return sorted([p for p in params if p != "self"] + ["layer_sizes"])


def build_compressor(name: str, **options) -> Compressor:
    """Compressor ``name`` with keyword ``options``; ``layer_sizes=[...]`` wraps it in Layerwise.

    Unknown names or options raise ValueError listing the valid choices.
    """
    key = str(name).lower()
    if key not in COMPRESSORS:
        raise ValueError(f"unknown compressor {name!r}; valid: {', '.join(COMPRESSORS)}")
    valid = options_of(key)
    bad = sorted(set(options) - set(valid))
    if bad:
        raise ValueError(f"unknown option(s) {', '.join(bad)} for compressor {key!r}; valid: {', '.join(valid)}")
    sizes = options.pop("layer_sizes", None)
    comp = COMPRESSORS[key](**options)
    return Layerwise(comp, sizes) if sizes is not None else comp
