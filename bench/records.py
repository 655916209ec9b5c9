"""Committed step records of short portable-numerics runs, and the check that a rerun gives the same bits.

`python bench/records.py check [NAME ...]` reruns each record's command (cluster.numerics=portable, a
pinned device clock) on this host and compares every step's loss, floats, wire bytes, CF and
modelled times, and every evaluation, bit for bit; it exits 1 at the first drift and names it.
`python bench/records.py write [NAME ...]` measures them anew (after a deliberate change of the
numbers, e.g. a new torch). Records live in results/reference/portable/; the vgg_mini and LSTM ones
need CIFAR-10 and PTB under $GRAVAC_DATA_DIR. Every host that passes `check` is a cross-host check:
the records say on which CPU they were written.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "results", "reference", "portable")
CLOCK = ["clock.machine=portable-records", f"clock.cache_dir={os.path.join(HERE, 'device')}"]
COMMON = ["cluster.numerics=portable", "logger.progress=False", "train.eval_every=1000", *CLOCK]
# name -> (the dataset folder it needs under $GRAVAC_DATA_DIR or None, its overrides)
RECORDS = {
    "default_topk10": (None, ["train.steps=20", "method=static", "compressor=topk", "compressor.cf=10"]),
    "vgg_mini_topk10": ("cifar10", ["experiment=mini_vgg", "arm=topk10", "train.steps=30"]),
    "lstm_mini_topk10": ("ptb", ["experiment=mini_lstm", "arm=topk10", "train.steps=30"]),
}
STEP_KEYS = ("step", "loss", "floats_sent", "wire_bytes", "cf", "comm_model_s", "compute_model_s",
             "compress_model_s", "step_model_s", "step_overlap_model_s")
EVAL_KEYS = ("step", "loss", "metric")


def host() -> dict:
    """The CPU a record was written or checked on: model name and the SIMD extensions it has."""
    model, flags = platform.processor() or "unknown", []
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        model = info.get("model name\t", model).strip()
        flags = sorted(f for f in info.get("flags\t", "").split() if f.startswith(("avx", "sse4", "fma", "amx")))
    except OSError:
        pass
    return {"cpu": model, "simd": flags}


def missing_data(name: str) -> str | None:
    """Why record `name` cannot run here (its dataset is absent), or None."""
    need = RECORDS[name][0]
    if need is None:
        return None
    root = os.environ.get("GRAVAC_DATA_DIR")
    if not root or not os.path.isdir(os.path.join(root, need)):
        return f"record {name} needs {need}/ under $GRAVAC_DATA_DIR (README, Data)"
    return None


def rerun(name: str, extra: list[str] = (), env: dict | None = None, emulate: str = "") -> dict:
    """Run record `name`'s command now (plus `extra` overrides) and return its record; `emulate`
    names a CPU model for qemu-x86_64 to present instead of this host's (another host, emulated)."""
    with tempfile.TemporaryDirectory(prefix="gravac-record-") as tmp:
        wrap = ["qemu-x86_64", "-cpu", emulate] if emulate else []
        cmd = [*wrap, sys.executable, os.path.join(ROOT, "bench", "run.py"), *COMMON, *RECORDS[name][1],
               f"experiment.results_root={tmp}", *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})})
        if p.returncode:
            raise RuntimeError(f"record {name}: the run failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
        run_dir = os.path.dirname(glob.glob(os.path.join(tmp, "*", "*", "steps.jsonl"))[0])
        return _record(run_dir, name)


def _record(run_dir: str, name: str) -> dict:
    def rows(file, keys):
        with open(os.path.join(run_dir, file)) as f:
            return [{k: r[k] for k in keys} for r in map(json.loads, f)]
    with open(os.path.join(run_dir, "summary.json")) as f:
        numerics = json.load(f)["numerics"]
    return {"name": name, "overrides": RECORDS[name][1], "numerics": numerics,
            "steps": rows("steps.jsonl", STEP_KEYS), "evals": rows("evals.jsonl", EVAL_KEYS)}


def path(name: str) -> str:
    return os.path.join(HERE, f"{name}.json")


def load(name: str) -> dict:
    with open(path(name)) as f:
        return json.load(f)


def drift(expected: dict, got: dict) -> list[str]:
    """One line per field whose values differ (its first differing row), empty when bit-identical."""
    out = []
    for part in ("steps", "evals"):
        a, b = expected[part], got[part]
        if len(a) != len(b):
            out.append(f"{part}: {len(b)} rows, the record has {len(a)}")
            continue
        for key in a[0] if a else ():
            bad = next((i for i, (x, y) in enumerate(zip(a, b)) if x[key] != y[key]), None)
            if bad is not None:
                out.append(f"{part}[{bad}].{key}: {b[bad][key]!r}, the record has {a[bad][key]!r}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("check", "write"))
    ap.add_argument("--emulate", metavar="CPU", default="",
                    help="run under qemu-x86_64 -cpu CPU (e.g. Broadwell-v4: an Intel CPU with AVX2 and no AVX-512; "
                         "far slower: the default record's 20 steps took about 15 min here; needs qemu-user)")
    ap.add_argument("names", nargs="*", help=f"records to {{check|write}} (default: all of {', '.join(RECORDS)})")
    a = ap.parse_intermixed_args(argv)
    if a.emulate and not shutil.which("qemu-x86_64"):
        ap.error("--emulate needs qemu-x86_64 (Debian/Ubuntu: apt install qemu-user)")
    unknown = [n for n in a.names if n not in RECORDS]
    if unknown:
        ap.error(f"unknown record {', '.join(unknown)}; choose from {', '.join(RECORDS)}")
    failed = 0
    for name in a.names or RECORDS:
        why = missing_data(name)
        if why:
            print(f"skip  {why}")
            continue
        got = rerun(name, ["clock.extend_machine=True"] if a.action == "write" else [], emulate=a.emulate)
        if a.action == "write":
            os.makedirs(HERE, exist_ok=True)
            with open(path(name), "w") as f:
                json.dump({**got, "written_on": host()}, f, indent=1)
            print(f"wrote {path(name)} ({len(got['steps'])} steps)")
            continue
        problems = drift(load(name), got)
        failed += bool(problems)
        where = f"qemu -cpu {a.emulate} on {host()['cpu']}" if a.emulate else host()["cpu"]
        print(f"{'DRIFT' if problems else 'same '} {name} on {where}" + "".join(f"\n  {p}" for p in problems))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
