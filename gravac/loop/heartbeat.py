"""Which worker stopped answering: every spawned worker notes the step it is at, so that when a
collective times out the launcher can name the rank that fell silent, not the one that timed out.

The launcher sets GRAVAC_HEARTBEAT_DIR (its rendezvous folder); `beat(rank, tick)` rewrites the
rank's file in place (a pwrite, no fsync), twice a step: tick 2s when step s starts, 2s+1 when its
local work is done and it waits for the peers. Without the variable it does nothing.
"""
from __future__ import annotations

import os

_FD: dict[int, int] = {}


def beat(rank: int, tick: int) -> None:
    """Record that `rank` has reached `tick` (2s: step s started; 2s+1: its local work is done)."""
    d = os.environ.get("GRAVAC_HEARTBEAT_DIR")
    if not d:
        return
    fd = _FD.get(rank)
    if fd is None:
        fd = _FD[rank] = os.open(os.path.join(d, f"beat-{rank}"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.pwrite(fd, f"{tick:>12d}\n".encode(), 0)


def last_ticks(d: str, world: int) -> dict[int, int]:
    """The last tick each rank reported (-1: none yet)."""
    out = {}
    for r in range(world):
        try:
            with open(os.path.join(d, f"beat-{r}")) as f:
                out[r] = int(f.read().strip() or -1)
        except (OSError, ValueError):
            out[r] = -1
    return out


def silent_rank(d: str, world: int, failed: int) -> tuple[int, int] | None:
    """(rank, tick) of the worker furthest behind when it is behind the one that failed, else None."""
    ticks = last_ticks(d, world)
    rank = min(ticks, key=lambda r: (ticks[r], r))
    return (rank, ticks[rank]) if rank != failed and ticks[rank] < ticks[failed] else None
