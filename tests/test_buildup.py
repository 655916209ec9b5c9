"""bench/buildup.py's settling: MiCRO / ExDyna are recorded only after the code's controller holds K."""
from __future__ import annotations

import torch

from bench.buildup import held, run_method, summarise
from gravac.cluster.netmodel import NetworkModel

D, N, CF = 2000, 4, 50                     # K = 40
_gen = torch.Generator().manual_seed(0)
_base = torch.randn(D, generator=_gen) ** 3
POOL = [0.02 * (_base + torch.randn(D, generator=_gen)) for _ in range(16)]   # a shared heavy-tailed mean + noise


def grads_at(t: int, n: int) -> list[torch.Tensor]:
    """The study's pool indexing: worker r at step t takes pool gradient (t·N + r) mod pool."""
    return [POOL[(t * n + r) % len(POOL)] for r in range(n)]


def test_held_needs_a_full_2n_window_inside_the_band():
    assert not held([1.0] * 7, 4)                        # fewer than 2N steps
    assert held([5.0] + [1.0] * 8, 4)                    # only the last 2N count
    assert held([0.5, 1.5] * 4, 4)                       # the swing over a cycle averages out
    assert not held([1.0] * 7 + [2.0], 4)                # mean 1.125


def test_exclusive_methods_settle_then_record_2n_steps_at_about_k():
    net = NetworkModel(alpha_s=1e-5, beta_Bps=1.25e9)
    rows = []
    for m in ("micro", "exdyna", "topk"):
        rows += [{"family": "syn", **r} for r in run_method(m, grads_at, [D], net, N, CF, steps=3, cap=400)]
    summary = {r["method"]: r for r in summarise(rows)}
    for m in ("micro", "exdyna"):
        s = summary[m]
        assert s["settled"] is True and 4 * N + 20 + 2 * N <= s["settle_steps"] < 400
        assert 0.9 <= s["settle_window"] <= 1.1
        assert s["recorded_steps"] == 2 * N
        assert s["union_over_selected"] == 1.0           # exclusive partitions: no duplicates
    assert summary["topk"]["recorded_steps"] == 3 and summary["topk"]["settle_steps"] == 0
    assert summary["topk"]["union_over_selected"] < 1.0  # independent Top-k overlaps
