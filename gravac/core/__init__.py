"""The neutral core every other package builds on: plug-in registries and config fields
(`Registry`, `option`), the config dataclasses (schema), their validator (check), user errors,
crash-safe file helpers (io) and the collective profile files the network config names
(collectives). Imports nothing of the project outside gravac.core."""
from __future__ import annotations

from gravac.core.errors import DivergedError, Interrupted, UserError, WorkerFailed
from gravac.core.registry import Entry, PluginError, Registry, field_doc, field_errors, option

__all__ = ["Registry", "Entry", "PluginError", "option", "field_errors", "field_doc", "UserError", "DivergedError",
           "WorkerFailed", "Interrupted"]
