"""DDP communication hooks: the suite's compressors, GraVAC and COVAP's filter for your own
`DistributedDataParallel` training (see gravac/hooks/hooks.py and README "Use in your own DDP
code"). `from gravac.hooks import SparseState, sparse_hook` works as it always has."""
from __future__ import annotations

from gravac.hooks.covap_hook import CovapState, covap_hook
from gravac.hooks.hooks import GraVACState, SparseState, gravac_hook, sparse_hook
from gravac.hooks.state import CompressionState, compressor_cfg, make_hook

__all__ = ["SparseState", "sparse_hook", "GraVACState", "gravac_hook", "CovapState", "covap_hook",
           "CompressionState", "make_hook", "compressor_cfg"]
