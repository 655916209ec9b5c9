"""Adaptivity policies and schedulers, registered by name in `METHODS` (see base.py);
`build_method` builds the configured one."""
from __future__ import annotations

from gravac.methods.base import (METHODS, CompressingMethod, Method, MethodEnv, RunStats, StepContext, StepResult,
                                 build_method, method_class)

__all__ = ["METHODS", "Method", "CompressingMethod", "MethodEnv", "RunStats", "StepContext", "StepResult", "build_method", "method_class"]
