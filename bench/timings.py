"""Measure the durations the README states, so they are measured rather than typed.

`python bench/timings.py` times the main job (README set-up command 1's run: `python bench/run.py`
with its defaults); `--tests` also times the README's test command (`python -m pytest`, then
`python -m pytest -m slow`). Each line says what ran, how long it took, and under what load (the
1-minute load average before and after, and the cores), since a shared machine is slower.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd: list[str]) -> tuple[float, int, str]:
    """Wall seconds, exit code and the telling output line of `cmd` (a run's `done:` line, else the
    last), run from the checkout."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = (p.stdout + p.stderr).strip().splitlines()
    done = [x for x in lines if x.startswith("done:")]
    return time.perf_counter() - t0, p.returncode, (done or lines or [""])[-1]


def line(what: str, cmd: list[str]) -> str:
    """One Markdown line: what ran, its wall time, exit code and the load it ran under."""
    before = os.getloadavg()[0]
    seconds, code, last = timed(cmd)
    after = os.getloadavg()[0]
    return (f"- {what}: {seconds:.0f} s ({seconds / 60:.1f} min), exit {code}, on {os.cpu_count()} cores at "
            f"load {before:.1f} -> {after:.1f}; {'output' if last.startswith('done:') else 'last line'}: {last[:200]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", action="store_true", help="also time the README's test command (default and slow)")
    a = ap.parse_args(argv)
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="gravac-timings-") as tmp:
        print(line("main job (`python bench/run.py`)",
                   [py, "bench/run.py", "logger.progress=false", f"experiment.results_root={tmp}"]), flush=True)
    if a.tests:
        print(line("default tests (`python -m pytest`)", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"]),
              flush=True)
        print(line("slow tests (`python -m pytest -m slow`)",
                   [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
