"""Fault injection for testing the run's failure handling: GRAVAC_FAULT=RANK:STEP[:KIND].

KIND is `raise` (an exception in that worker, the default), `exit` (the process exits without a
word, code 17), `kill` (a real SIGKILL, as from the out-of-memory killer), `hang` (the worker stops
responding) or `nan` (its loss becomes NaN).
Read once; costs one integer comparison per step when unset.
"""
from __future__ import annotations

import os
import signal
import time

from gravac.core.errors import UserError

KINDS = ("raise", "exit", "kill", "hang", "nan")


def _parse() -> tuple[int, int, str] | None:
    spec = os.environ.get("GRAVAC_FAULT", "")
    if not spec:
        return None
    parts = spec.split(":")
    try:
        rank, step, kind = int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "raise"
    except (ValueError, IndexError):
        kind = None
    if kind not in KINDS or len(parts) > 3:
        raise UserError(f"GRAVAC_FAULT={spec!r} must look like RANK:STEP[:{'|'.join(KINDS)}] "
                        "(or unset it)") from None
    return rank, step, kind


FAULT = _parse()


def maybe_fail(rank: int, step: int) -> bool:
    """Trigger the configured fault for (rank, step); returns True when the loss must become NaN."""
    if FAULT is None or FAULT[0] != rank or FAULT[1] != step:
        return False
    kind = FAULT[2]
    if kind == "exit":
        os._exit(17)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        time.sleep(3600)
    if kind == "nan":
        return True
    raise RuntimeError(f"injected fault (GRAVAC_FAULT) in rank {rank} at step {step}")
