"""Gradient compressors and error-feedback memory for gravac-bench (pure tensor code).

CF = dense size / elements sent (10x keeps 10%). Every compressor returns a :class:`Payload`
of exact input values at global indices; ``recompress`` compresses a payload further using only
its values (GraVAC's multi-level compression). Compressors are registered by name in
``COMPRESSORS`` with their config dataclass (see gravac/core/registry.py); every module of this package is
imported, so a new compressor is one module (plus its conf/compressor YAML).
"""
from .base import COMPRESSORS, COUNT_BYTES, NO_COMPRESSOR, Compressor, CompressorCfg, CompressorSpec, Payload, target_k
from .topk import TopK
from .dgc import DGC, DGCCfg, dgc_warmup_cf
from .redsync import RedSync, RedSyncCfg
from .randomk import RandomK, RandomKCfg
from .factory import build_compressor, from_config
from .layerwise import Layerwise
from .memory import ErrorFeedback
from gravac.core.registry import Registry, import_submodules, option

import_submodules(__name__)   # register every compressor module of the package

__all__ = ["Payload", "Compressor", "CompressorCfg", "TopK", "DGC", "DGCCfg", "RedSync", "RedSyncCfg",
           "RandomK", "RandomKCfg", "Layerwise", "ErrorFeedback", "build_compressor", "from_config",
           "dgc_warmup_cf", "target_k", "COMPRESSORS", "NO_COMPRESSOR", "COUNT_BYTES", "CompressorSpec", "Registry", "option"]
