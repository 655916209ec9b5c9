"""The quantizers' NumPy code against their numba kernels, side by side in one process.

Every case (one memory pass ``x.abs().sum()``; per quantizer: its scales alone, encode and decode
on the NumPy path and on the kernels) is timed round-robin, so load from other processes hits
all alike, on the same heavy-tailed data (randn * exp(randn)); prints medians in ms and in passes
(time / pass) and checks that both paths gave the same bytes. Freed memory stays mapped while
timing (compress_bench's ``--alloc steady``), so its passes are compress_bench's.

    python bench/quant_kernels.py [--numel 44549160] [--repeats 5] [--threads 2] [--only qsgd,quant]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import compressors.arrays as carrays  # noqa: E402
from compressors.efsignsgd import EFSignSGD  # noqa: E402
from compressors.packed import group_lengths, group_min_max, group_scale  # noqa: E402
from compressors.qsgd import QSGD  # noqa: E402
from compressors.quant import Quant  # noqa: E402
from compressors.terngrad import TernGrad  # noqa: E402
from compress_bench import allocator  # noqa: E402  (bench/ is on the path of a script run from it)

CASES = {   # name: (quantizer, what its scales are)
    "qsgd": (lambda: QSGD(), "l2"),                       # s = 127, bucket 512
    "terngrad": (lambda: TernGrad(), "max"),              # per tensor
    "efsignsgd": (lambda: EFSignSGD(), "mean"),           # per tensor
    "quant": (lambda: Quant(), "minmax"),                 # 8-bit, bucket 1024, nearest
    "quant-st": (lambda: Quant(rounding="stochastic"), "minmax"),
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=44_549_160)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=",".join(CASES))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    k = carrays.kernels()
    if k is None:
        raise SystemExit("numba is not installed: nothing to compare")
    n = args.numel
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g) * torch.randn(n, generator=g).exp()
    a = x.numpy()
    names = args.only.split(",")
    qs = {m: CASES[m][0]() for m in names}
    fns = {"pass": lambda: x.abs().sum()}
    payload = {}
    for m in names:
        q, kind = qs[m], CASES[m][1]
        lens = group_lengths([n], q.bucket)
        for path, kk in (("numpy", None), ("kernel", k)):
            def scales(a=a, lens=lens, kind=kind, kk=kk):
                carrays._KERNELS[:] = [kk]
                return group_min_max(a, lens) if kind == "minmax" else group_scale(a, lens, kind)
            fns[f"{m}/scales/{path}"] = scales
        for path, kk in (("numpy", None), ("kernel", k)):
            carrays._KERNELS[:] = [kk]
            payload[m, path] = q.quantize(x, [n], seed=1)

            def enc(q=q, kk=kk):
                carrays._KERNELS[:] = [kk]
                q.quantize(x, [n], seed=1)

            def dec(q=q, kk=kk, p=payload[m, path]):
                carrays._KERNELS[:] = [kk]
                q.decode(p)
            fns[f"{m}/encode/{path}"], fns[f"{m}/decode/{path}"] = enc, dec
        a_, b_ = payload[m, "numpy"], payload[m, "kernel"]
        same = a_.codes.tobytes() == b_.codes.tobytes() and a_.scales.tobytes() == b_.scales.tobytes()
        carrays._KERNELS[:] = [None]
        d0 = q.decode(a_).numpy().tobytes()
        carrays._KERNELS[:] = [k]
        same = same and d0 == q.decode(b_).numpy().tobytes()
        print(f"{m}: kernel bytes {'identical' if same else 'DIFFER'} to NumPy's")
    times = {c: [] for c in fns}
    with allocator("steady"):      # compress_bench's default: no page faults after the warm-up
        for c, f in fns.items():   # warm-up (compiles / loads the kernels, maps the memory)
            f()
        for _ in range(args.repeats):
            for c, f in fns.items():
                t0 = time.perf_counter()
                f()
                times[c].append(time.perf_counter() - t0)
    med = {c: statistics.median(v) for c, v in times.items()}
    ps = med["pass"]
    print(f"\nnumel {n:,}, {args.threads} threads, {args.repeats} repeats round-robin; pass = {ps * 1e3:.1f} ms "
          f"(range {min(times['pass']) * 1e3:.1f}-{max(times['pass']) * 1e3:.1f})")
    print("passes = median time / median pass; 'scales': the scales alone (part of encode)")
    print(f"{'quantizer':10} | {'NumPy scales':>12} {'enc':>6} {'dec':>6} {'both':>6} | {'kernel scales':>13} {'enc':>6} "
          f"{'dec':>6} {'both':>6} | {'speed-up':>8}")
    for m in names:
        e0, d0 = med[f"{m}/encode/numpy"] / ps, med[f"{m}/decode/numpy"] / ps
        e1, d1 = med[f"{m}/encode/kernel"] / ps, med[f"{m}/decode/kernel"] / ps
        print(f"{m:10} | {med[f'{m}/scales/numpy'] / ps:12.2f} {e0:6.2f} {d0:6.2f} {e0 + d0:6.2f} | "
              f"{med[f'{m}/scales/kernel'] / ps:13.2f} {e1:6.2f} {d1:6.2f} {e1 + d1:6.2f} | {(e0 + d0) / (e1 + d1):7.2f}x")
    print("\nms, median (min) of the repeats:")
    for c, v in times.items():
        print(f"  {c:24} {statistics.median(v) * 1e3:8.1f} ({min(v) * 1e3:.1f})")


if __name__ == "__main__":
    main()
