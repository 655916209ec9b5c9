"""The host a process runs on: the CPU cores it may use."""
from __future__ import annotations

import os


def cores() -> int:
    """CPU cores this process may use: the SLURM allocation's, else its affinity mask's."""
    if os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return max(1, int(os.environ["SLURM_CPUS_PER_TASK"]))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
