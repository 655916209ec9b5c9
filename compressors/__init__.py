"""Gradient compressors and error-feedback memory for gravac-bench (pure tensor code).

CF = dense size / elements sent (10x keeps 10%). Every compressor returns a :class:`Payload`
of exact input values at global indices; ``recompress`` compresses a payload further using only
its values (GraVAC's multi-level compression).
"""
from .base import COUNT_BYTES, Compressor, Payload, target_k
from .dgc import DGC, dgc_warmup_cf
from .factory import COMPRESSORS, build_compressor
from .layerwise import Layerwise
from .memory import ErrorFeedback
from .randomk import RandomK
from .redsync import RedSync
from .topk import TopK

__all__ = ["Payload", "Compressor", "TopK", "DGC", "RedSync", "RandomK", "Layerwise", "ErrorFeedback",
           "build_compressor", "dgc_warmup_cf", "target_k", "COMPRESSORS", "COUNT_BYTES"]
