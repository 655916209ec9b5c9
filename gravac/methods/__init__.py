"""Adaptivity policies: dense, static, accordion, gravac; `build_method` picks one by name."""
from __future__ import annotations

from gravac.methods.base import Method, StepContext, StepResult


def build_method(cfg, group, sizes, device) -> Method:
    """The configured method for this group and parameter layout."""
    name = cfg.method.name
    if name == "dense":
        from gravac.methods.dense import Dense as cls
    elif name == "static":
        from gravac.methods.static import Static as cls
    elif name == "accordion":
        from gravac.methods.accordion import Accordion as cls
    elif name == "gravac":
        from gravac.methods.gravac import GraVAC as cls
    else:  # config validation lists the valid names; this guards direct library use
        raise ValueError(f"unknown method {name!r}; choose one of: dense, static, accordion, gravac")
    return cls(cfg, group, sizes, device)


def method_state_bytes(cfg, numel: int) -> int:
    """Per-worker state a method will hold (residual, momentum buffers, compensated gradient in
    flight), so the simulated cluster can refuse to start before allocating it. Accordion's
    epoch accumulator lives once per process, not per worker, and is left out."""
    if cfg.method.name == "dense":
        return 0
    c = cfg.compressor
    residual = (3 if c.momentum_correction else 1) if c.error_feedback else 0  # DGC adds u and v
    return 4 * numel * (residual + 1)


__all__ = ["Method", "StepContext", "StepResult", "build_method", "method_state_bytes"]
