"""How a process computes: its thread count and, in portable mode, kernels that give the same bits on
any x86-64 host.

On CPU, PyTorch picks kernels by the host's instruction set: ATen's vectorised kernels (AVX-512,
AVX2 or plain), oneDNN's convolutions and LSTMs (by ISA and cache sizes), NNPACK's convolutions
(AVX2 code) and MKL's matrix products (a code branch per CPU). Each choice rounds differently, so
one seed ends in different bits on different hosts. `cluster.numerics=portable` pins every one of
them (measured in REPRODUCING.md "Bit-identical across hosts"):

- ``ATEN_CPU_CAPABILITY=default``: ATen's kernels without SIMD extensions;
- ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility, the branch Intel documents
  as giving the same results on every Intel and compatible CPU for a fixed thread count;
- oneDNN and NNPACK off, so convolutions and LSTMs go through ATen's own kernels and MKL's GEMM;
- one thread per process, since a reduction split over threads rounds by the split.

ATen and MKL read their variables once, at their first use, so the mode is set before the
process's first tensor operation and checked afterwards: a process that computed before (an
interactive session, a test process) is refused rather than silently left native.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import torch

from gravac.core.errors import UserError
from gravac.cluster.host import cores

PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
_MKL_CBWR_ALL, _MKL_CBWR_COMPATIBLE = -1, 3    # mkl_cbwr.h: MKL_CBWR_ALL = ~0, MKL_CBWR_COMPATIBLE = 3


def _mkl_cbwr() -> int | None:
    """MKL's reproducibility branch in this process (3 = COMPATIBLE), or None without an MKL build."""
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        get = lib.mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    return get(_MKL_CBWR_ALL)


@dataclass(frozen=True)
class Numerics:
    """The numerics a process runs with, as recorded in summary.json."""
    mode: str
    threads: int
    cpu_capability: str
    mkl_cbwr: str
    mkldnn: bool
    nnpack: bool

    @classmethod
    def current(cls, mode: str) -> "Numerics":
        cbwr = _mkl_cbwr()
        return cls(mode, torch.get_num_threads(), torch.backends.cpu.get_cpu_capability(),
                   {None: "no MKL", _MKL_CBWR_COMPATIBLE: "COMPATIBLE"}.get(cbwr, f"branch {cbwr}"),
                   torch.backends.mkldnn.enabled, torch.backends.nnpack.is_available() and torch._C._get_nnpack_enabled())

    def describe(self) -> dict:
        return dict(vars(self))


def apply(mode: str, threads: int, local_processes: int = 1) -> Numerics:
    """Set this process's threads (0: its share of the cores) and numerics `mode` (native | portable).

    The environment keeps the portable variables, so worker processes started later inherit them.
    """
    if mode == "portable":   # ClusterCfg.errors has refused threads > 1
        os.environ.update(PORTABLE_ENV)
        torch.backends.mkldnn.enabled = False   # oneDNN picks kernels by ISA and cache sizes
        torch.backends.nnpack.set_flags(False)  # NNPACK's x86 kernels are AVX2 code
        threads = 1
    torch.set_num_threads(threads or max(1, cores() // local_processes))
    now = Numerics.current(mode)
    if mode == "portable":
        _check_portable(now)
    return now


def _check_portable(now: Numerics) -> None:
    """Refuse to run portable in a process whose kernels were chosen before the mode was set."""
    late = []
    if now.cpu_capability != "DEFAULT":
        late.append(f"ATen's kernels are already {now.cpu_capability}")
    if now.mkl_cbwr == "no MKL":
        raise UserError("cluster.numerics=portable needs an x86-64 build of torch with MKL (torch.__config__.show() "
                        "lists MKL); this build has none: use cluster.numerics=native")
    if now.mkl_cbwr != "COMPATIBLE":
        late.append(f"MKL already runs {now.mkl_cbwr}")
    if late:
        raise UserError("cluster.numerics=portable must be set before this process's first tensor operation, but "
                        + " and ".join(late) + ": start the run from bench/run.py, or export "
                        + " ".join(f"{k}={v}" for k, v in PORTABLE_ENV.items()) + " before starting Python")
