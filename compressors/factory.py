"""Compressors by name (the registry), for configs, command lines and direct use."""
from __future__ import annotations

import inspect

from .base import COMPRESSORS, Compressor, CompressorCfg
from .layerwise import Layerwise

def options_of(name: str) -> list[str]:
    """Keyword options the named compressor's class accepts (plus ``layer_sizes``)."""
    params = inspect.signature(COMPRESSORS[name].target.__init__).parameters
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
    comp = COMPRESSORS[key].target(**options)
    return Layerwise(comp, sizes) if sizes is not None else comp


def from_config(cfg: CompressorCfg, sizes: list[int]) -> Compressor:
    """The configured compressor, wrapped per parameter tensor when granularity=layer."""
    comp = COMPRESSORS[cfg.name].target.from_config(cfg)
    return Layerwise(comp, sizes) if cfg.granularity == "layer" else comp
