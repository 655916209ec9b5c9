"""Accordion: per-layer regime switches at norm checks and after learning-rate decays."""
from __future__ import annotations

import json
import math

import pytest
import torch

from gravac.cluster.comm import SimGroup
from gravac.methods import StepContext, build_method
from gravac.methods.accordion import regimes
from gravac.cluster.netmodel import NetworkModel
from conftest import make_run

SIZES = [400, 300, 300]
W, SPE = 2, 4                                # workers, steps per epoch


def make(granularity="layer", compressor="topk", accumulate="local", sizes=SIZES, **method):
    m = dict(name="accordion", cf_low=1.0, cf_high=50.0, switch_freq=2, eta=0.5)
    m.update(method)
    cfg = make_run(method={**m, "accumulate": accumulate}, compressor=dict(name=compressor, granularity=granularity))
    return build_method(cfg, SimGroup(W, NetworkModel.from_cfg(cfg.network)), sizes, torch.device("cpu"))


def ctx(step: int, decayed: bool = False) -> StepContext:
    return StepContext(step=step, epoch=step / SPE, lr=0.1, lr_decayed=decayed, compute_s=0.01, samples=W * 32)


def grads(step: int, jump_from_epoch: int | None = 2) -> list[torch.Tensor]:
    """Per-worker gradients with a stable per-layer norm; layer 1 triples from `jump_from_epoch`."""
    out = []
    for w in range(W):
        g = torch.randn(sum(SIZES), generator=torch.Generator().manual_seed(100 * step + w)) * 0.1
        g += torch.linspace(1, 2, sum(SIZES))              # a steady direction, so norms are stable
        if jump_from_epoch is not None and step // SPE >= jump_from_epoch:
            g[400:700] *= 3
        out.append(g)
    return out


def run(method, steps, decay_at=(), **kw):
    return [method.step(grads(s, **kw), ctx(s, s in decay_at)) for s in steps]


def test_regimes_rule():
    assert regimes(None, [1.0, 2.0], 0.5) == ([True, True], [None, None])
    low, ratios = regimes([1.0, 2.0, 0.0, 0.0], [1.6, 1.2, 0.0, 3.0], 0.5)
    assert low == [True, False, False, True]
    assert ratios[:3] == [pytest.approx(0.6), pytest.approx(0.4), 0.0] and ratios[3] is None


@pytest.mark.parametrize("accumulate", ["local", "averaged"])
def test_jump_in_one_layer_switches_it_to_low(accumulate):
    m = make(accumulate=accumulate)        # cf_low = 1: the averaged gradient is sent exactly
    res = run(m, range(16))
    assert [r.extra["cf_low_layers"] for r in res] == [3] * 12 + [1] * 4
    first = res[4].extra["accordion_decision"]                  # end of epoch 0: the baseline
    assert first["epoch"] == 0 and first["low_layers"] == [0, 1, 2] and first["ratios"] == [None] * 3
    check = res[12].extra["accordion_decision"]                 # end of epoch 2 vs epoch 0
    assert check["epoch"] == 2 and check["low_layers"] == [1]
    assert check["ratios"][1] == pytest.approx(2.0, rel=0.05)
    assert check["ratios"][0] < 0.1 and check["ratios"][2] < 0.1
    decided = [s for s, r in enumerate(res) if "accordion_decision" in r.extra]
    assert decided == [4, 12]                                   # epochs 1 and 3 are not checks
    expected = 300 + 400 // 50 + 300 // 50                      # layer 1 dense-ish, others at 50x
    assert res[12].floats_sent == expected and res[12].cf == pytest.approx(1000 / expected)
    assert res[0].floats_sent == 1000 and res[11].cf == 1.0
    json.dumps([r.extra for r in res], allow_nan=False)


def test_stable_norms_switch_all_to_high():
    m = make()
    res = run(m, range(13), jump_from_epoch=None)
    assert res[12].extra["accordion_decision"]["low_layers"] == []
    assert res[12].extra["cf_low_layers"] == 0
    assert res[12].floats_sent == sum(s // 50 for s in SIZES)


def test_lr_decay_switches_all_to_low_until_next_check():
    m = make()
    res = run(m, range(24), decay_at={14})
    lows = [r.extra["cf_low_layers"] for r in res]
    assert lows[12:14] == [1, 1] and lows[14:20] == [3] * 6        # decay at step 14 -> all low
    assert res[14].extra["accordion_decision"] == {"epoch": 3, "ratios": None, "low_layers": [0, 1, 2],
                                                   "reason": "lr_decay"}
    check = res[20].extra["accordion_decision"]                   # epoch 4 vs epoch 2: layer 1 stable now
    assert check["epoch"] == 4 and check["low_layers"] == [] and lows[20:] == [0] * 4


def test_lr_decay_at_a_check_wins():
    m = make()
    res = run(m, range(13), decay_at={12})
    d = res[12].extra["accordion_decision"]
    assert d["reason"] == "check+lr_decay" and d["epoch"] == 2 and d["low_layers"] == [0, 1, 2]
    assert d["ratios"][1] == pytest.approx(2.0, rel=0.05)


def test_flat_granularity_has_one_regime():
    stable = run(make(granularity="flat"), range(13), jump_from_epoch=None)
    assert [r.extra["cf_low_layers"] for r in (stable[0], stable[12])] == [1, 0]
    assert stable[12].floats_sent == 1000 // 50
    jump = run(make(granularity="flat"), range(13))            # the whole-model norm grows ~85%
    d = jump[12].extra["accordion_decision"]
    assert d["low_layers"] == [0] and len(d["ratios"]) == 1 and jump[12].floats_sent == 1000


def test_paper_defaults_with_randomk():
    m = make(compressor="randomk", cf_low=1.5, cf_high=1000.0)
    res = run(m, range(3))
    assert res[0].floats_sent == sum(math.floor(s / 1.5) for s in SIZES)


def test_state_dict_resume_matches():
    a = make()
    run(a, range(10))
    b = make()
    b.load_state_dict(a.state_dict())
    for s in range(10, 16):
        ra, rb = a.step(grads(s), ctx(s)), b.step(grads(s), ctx(s))
        assert ra.extra == rb.extra
        torch.testing.assert_close(ra.grad, rb.grad)


@pytest.mark.parametrize("accumulate,lows", [("local", [[], [], []]), ("averaged", [[], [0, 1], [0, 1]])])
def test_stationary_gradient_regimes(accumulate, lows):
    """A stationary gradient is never critical; the averaged (post-communication) gradient's norm
    moves with the regime in force under error feedback, so it reports spurious critical regimes."""
    sizes, spe = [2000, 1000], 10
    m = make(compressor="randomk", cf_low=1.5, cf_high=1000.0, switch_freq=1, accumulate=accumulate, sizes=sizes)
    base = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(0))
    decisions = []
    for s in range(4 * spe + 1):
        gs = [base + 0.5 * torch.randn(sum(sizes), generator=torch.Generator().manual_seed(10 * s + w))
              for w in range(W)]
        res = m.step(gs, StepContext(s, s / spe, 0.1, False, 0.01, 64))
        if "accordion_decision" in res.extra:
            decisions.append(res.extra["accordion_decision"]["low_layers"])
    assert decisions[0] == [0, 1] and decisions[1:] == lows          # checks after epochs 0, 1, 2, 3
