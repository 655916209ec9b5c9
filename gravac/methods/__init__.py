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
    """Per-worker state a method will hold (residuals per level, accumulators), to check memory first."""
    name, c = cfg.method.name, cfg.compressor
    if name == "dense":
        return 0
    residuals = 2 if name == "gravac" else 1          # GraVAC keeps one per compression level
    copies = (3 if c.momentum_correction else 1) if c.error_feedback else 0
    extra = 1 if name == "accordion" else 0            # Accordion's epoch-accumulated gradient
    return 4 * numel * (residuals * copies + extra + 1)  # + 1: the compensated gradient in flight


__all__ = ["Method", "StepContext", "StepResult", "build_method", "method_state_bytes"]
