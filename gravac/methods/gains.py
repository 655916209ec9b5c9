"""Compression gain, both ways it has been defined: the paper's and the authors' code's.

Paper (GraVAC, Tyagi & Swany 2023, and its talk): gain = ||C(g_o)||² / ||g_o||², squared L2 norms
of the whole (error-compensated) gradient g_o and of its compressed version; GraVAC smooths it
with an EWMA (gravac/methods/gravac.py).

Authors' public code (sahiltyagi4/GraVAC, gravac_py3):
- `helper/misc.py: grad_norm` returns Σ_l ||x_l||₂ over the model's layers (parameter tensors):
  a SUM of per-layer L2 norms, not squared;
- `run/compression_throughput.py`: numerator = grad_norm of the layer-wise compressed tensors
  (`layerwise_compressed_grads`, which the compressor built from gradient + residual, i.e. the
  compressed error-compensated gradient); denominator = grad_norm of the raw back-propagated
  `p.grad` (no residual);
- each side is smoothed on its own by `helper/misc.py: MovingWindowAverage`: the last
  `windowsize` samples (default 25) in a list; once the list is full, pandas
  `DataFrame.ewm(alpha, min_periods=windowsize).mean()` (adjust=True: weights (1−α)^i on the
  i-th most recent sample, normalised) and its last value; 0.0 until the list is first full; the
  oldest sample is then dropped; `alpha` default 0.05;
- `misc.compression_gain` = smoothed numerator / smoothed denominator.
With error feedback the residual grows the numerator but not the denominator, so this gain can
exceed 1 and stays high at large CFs.

Here the code's definition is computed from cluster sums (Σ over workers of each side), so every
worker takes the same decision: the code decides per worker, which can desynchronise collectives.
While the smoothed denominator is 0 (the first `window` − 1 steps) the gain is 0; the code would
divide by zero there. Not copied from the code (known slips): its candidate-CF gain reads the
cf_min helper's compressed tensors instead of the candidate's; residuals of levels that were not
sent still update.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import torch

from compressors import Payload
from compressors.arrays import native, native_like


def segment_bounds(sizes: list[int]) -> list[tuple[int, int]]:
    """(offset, size) of every layer (parameter tensor) in the flat gradient."""
    out, off = [], 0
    for n in sizes:
        out.append((off, n))
        off += n
    return out


def layer_norm_sum(x: torch.Tensor, bounds: list[tuple[int, int]]) -> float:
    """Σ_l ||x_l||₂ of a flat dense tensor over the layers `bounds` (the code's grad_norm)."""
    return float(sum(torch.linalg.vector_norm(x[o:o + n], dtype=torch.float64) for o, n in bounds))


def payload_layer_norm_sum(p: Payload, bounds: list[tuple[int, int]]) -> float:
    """Σ_l ||C(x)_l||₂ of a payload: its values grouped by the layer their index falls in."""
    if p.indices is None:
        return layer_norm_sum(p.values, bounds)
    vals = native(p.values)
    idx = native_like(p.indices, vals)
    if not isinstance(vals, np.ndarray):                      # not a CPU tensor: use torch
        starts = torch.tensor([o for o, _ in bounds[1:]], dtype=p.indices.dtype, device=p.indices.device)
        seg = torch.bucketize(p.indices, starts, right=True)
        sums = torch.zeros(len(bounds), dtype=torch.float64, device=p.values.device)
        sums.index_add_(0, seg, p.values.double() ** 2)
        return float(sums.sqrt().sum())
    starts = np.asarray([o for o, _ in bounds[1:]], dtype=np.int64)
    seg = np.searchsorted(starts, idx, side="right")
    v = vals.astype(np.float64)
    return float(np.sqrt(np.bincount(seg, weights=v * v, minlength=len(bounds))).sum())


class SlidingEWMA:
    """The authors' MovingWindowAverage: EWMA (pandas adjust=True) over the last `window` samples,
    0.0 until `window` samples have been seen (see the module docstring)."""

    def __init__(self, window: int, alpha: float):
        if window < 1 or not 0 < alpha <= 1:
            raise ValueError("SlidingEWMA needs window >= 1 and 0 < alpha <= 1")
        self.window, self.alpha = int(window), float(alpha)
        self.samples: deque = deque(maxlen=self.window)
        self.value = 0.0
        w = (1 - self.alpha) ** np.arange(self.window - 1, -1, -1, dtype=np.float64)   # oldest .. newest
        self._weights = w / w.sum()

    def update(self, x: float) -> float:
        self.samples.append(float(x))
        if len(self.samples) == self.window:
            self.value = float(np.dot(self._weights, np.fromiter(self.samples, dtype=np.float64)))
        return self.value

    def state_dict(self) -> dict:
        return {"samples": list(self.samples), "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.samples = deque(state["samples"], maxlen=self.window)
        self.value = float(state["value"])


class CodeGain:
    """The code's gain: smoothed Σ||C(g_o)_l|| over smoothed Σ||g_l|| (each side its own window)."""

    def __init__(self, window: int, alpha: float):
        self.num, self.den = SlidingEWMA(window, alpha), SlidingEWMA(window, alpha)

    def update(self, num: float, den: float) -> float:
        n, d = self.num.update(num), self.den.update(den)
        return n / d if d > 0 else 0.0

    @property
    def value(self) -> float:
        return self.num.value / self.den.value if self.den.value > 0 else 0.0

    def state_dict(self) -> dict:
        return {"num": self.num.state_dict(), "den": self.den.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.num.load_state_dict(state["num"])
        self.den.load_state_dict(state["den"])

