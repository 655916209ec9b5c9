"""L-GreCo: the DP's optimum against brute force, the budget on measured errors, equality with
static compression when only the default is a candidate, per-layer error feedback, sim = ddp."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from compressors import target_k
from gravac.cluster.comm import DistGroup, SimGroup
from gravac.cluster.netmodel import NetworkModel
from gravac.core.errors import UserError
from gravac.core.schema import RunConfig
from gravac.methods import StepContext, build_method
from gravac.methods.lgreco import decide, discretise, solve
from conftest import failure, gloo_ranks, make_run, run_cli_many

SIZES = [600, 300, 80, 20]
W = 2
CANDS = [5, 20, 100, 400]


def make(sizes=SIZES, workers=W, group=None, compressor="topk", comp=None, **method):
    m = dict(name="lgreco", candidates=CANDS, default_cf=20, period=3, window=2)
    m.update(method)
    cfg = make_run(method=m, compressor=dict(name=compressor, granularity="layer", **(comp or {})))
    group = group or SimGroup(workers, NetworkModel.from_cfg(cfg.network))
    return build_method(cfg, group, sizes, torch.device("cpu"))


def ctx(step: int) -> StepContext:
    return StepContext(step=step, epoch=step / 10, lr=0.1, lr_decayed=False, compute_s=0.01, samples=W * 16)


def grads(step: int, ranks=range(W), sizes=SIZES) -> list[torch.Tensor]:
    """Layers of different character: a few large entries (cheap to compress), flat and large,
    large noise (costly), small noise, so the DP has something to trade."""
    out = []
    for r in ranks:
        g = torch.Generator().manual_seed(1000 * step + r)
        x = torch.randn(sum(sizes), generator=g) * 0.01
        x[:5] += 3.0 * (1 + r)                                    # layer 0: five spikes
        x[600:900] += torch.linspace(0.5, 1.0, 300)              # layer 1: flat and large
        x[900:980] *= 100                                         # layer 2: large noise
        out.append(x)
    return out


# --- the dynamic program ----------------------------------------------------------------------------

def brute(errors, sizes, feasible) -> float:
    """The least total size over every assignment `feasible` accepts (inf if none)."""
    layers, cands = errors.shape
    best = math.inf
    for a in itertools.product(range(cands), repeat=layers):
        if feasible(a):
            best = min(best, sum(sizes[l, c] for l, c in enumerate(a)))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_dp_returns_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    layers, cands, buckets = int(rng.integers(1, 7)), 4, int(rng.choice([7, 50, 1000]))
    errors = rng.random((layers, cands)) * rng.choice([1e-3, 1.0, 1e3])
    sizes = rng.integers(1, 500, (layers, cands)).astype(float)
    budget = float(errors[:, 1].sum()) * rng.choice([0.5, 1.0, 1.5])
    d = discretise(errors, budget, buckets)
    choice = solve(errors, sizes, budget, buckets)
    opt = brute(errors, sizes, lambda a: sum(d[l, c] for l, c in enumerate(a)) <= buckets)
    if choice is None:
        assert opt == math.inf
        return
    rows = np.arange(layers)
    assert sizes[rows, choice].sum() == opt                          # optimal for the discretised budget
    assert errors[rows, choice].sum() <= budget * (1 + 1e-12)         # and within the real one
    # against the real (continuous) problem: no worse than its optimum with the rounding slack removed
    slack = layers * budget / buckets
    assert sizes[rows, choice].sum() <= brute(errors, sizes, lambda a: sum(errors[l, c] for l, c in enumerate(a))
                                              <= budget - slack)


@pytest.mark.parametrize("seed", range(4))
def test_dp_is_exact_when_errors_lie_on_the_bucket_grid(seed):
    """Errors that are whole buckets lose nothing to rounding: the DP solves the real problem (a
    bucket width of 1/16, so the errors and their division are exact in binary)."""
    rng = np.random.default_rng(100 + seed)
    layers, buckets, budget = 6, 32, 2.0
    errors = rng.integers(0, 12, (layers, 4)) * (budget / buckets)
    sizes = rng.integers(1, 100, (layers, 4)).astype(float)
    choice = solve(errors, sizes, budget, buckets)
    opt = brute(errors, sizes, lambda a: sum(errors[l, c] for l, c in enumerate(a)) <= budget + 1e-9)
    assert choice is not None and sizes[np.arange(layers), choice].sum() == opt


def test_decide_keeps_the_default_when_nothing_beats_it():
    errors = np.array([[1.0, 2.0], [1.0, 2.0]])           # the default (1) is the only choice in budget
    sizes = np.array([[10.0, 5.0], [10.0, 5.0]])
    d = decide(errors, sizes, default=1, scale=1.0, buckets=100)
    assert d.choice == [1, 1] and d.fallback is None and d.floats == d.default_floats == 10
    zero = decide(np.zeros((2, 2)), sizes, default=0, scale=1.0, buckets=100)    # all-zero gradient
    assert zero.choice == [0, 0] and zero.fallback == "zero budget"
    # rounding up makes the uniform default itself infeasible with one bucket per layer's error
    tight = decide(np.array([[0.3, 0.6], [0.3, 0.6]]), sizes, default=0, scale=1.0, buckets=1)
    assert tight.choice == [0, 0] and tight.fallback == "infeasible" and tight.error <= tight.budget


# --- the method -----------------------------------------------------------------------------------

def topk_errors(a: torch.Tensor, sizes, cfs) -> list[float]:
    """||a_l − topk(a_l)|| per layer, computed independently of the compressors package."""
    out, off = [], 0
    for n, cf in zip(sizes, cfs):
        seg = a[off:off + n].double()
        k = target_k(n, cf)
        kept = seg.abs().topk(k).values
        out.append(math.sqrt(max(0.0, float(seg.square().sum() - kept.square().sum()))))
        off += n
    return out


def test_budget_holds_on_the_measured_errors_and_levels_differ():
    """At every solve the chosen levels' error on rank 0's averaged compensated gradient, recomputed
    here with torch.topk, is within the default's; the levels are not uniform; sent = predicted."""
    m = make()
    window, solves = [], 0
    for s in range(13):
        gs = grads(s)
        comp0 = gs[0] + m.memories[0][0].residual           # rank 0's compensated gradient (no momentum)
        res = m.step(gs, ctx(s))
        if "lgreco_solve" in res.extra:
            solves += 1
            a = torch.stack(window).mean(0)
            rec = res.extra["lgreco_solve"]
            levels = m.layer_cfs
            assert sum(topk_errors(a, SIZES, levels)) == pytest.approx(rec["error_predicted"], rel=1e-6)
            assert sum(topk_errors(a, SIZES, [20] * 4)) == pytest.approx(rec["error_budget"], rel=1e-6)
            assert rec["error_predicted"] <= rec["error_budget"]
            assert rec["floats_predicted"] == res.floats_sent == sum(target_k(n, c) for n, c in zip(SIZES, levels))
            assert rec["floats_predicted"] < rec["floats_default"] and rec["fallback"] is None
            assert len(set(levels)) > 1
            window = []
        if s % 3 >= 1:
            window.append(comp0)
    assert solves == 4


def test_histogram_counts_layer_steps_and_shares_weigh_layers_by_size():
    """Levels carried forward between announcements; the shares weigh each layer by its values
    (hand-computed: sizes 600/300/80/20, two steps uniform at 20x, one at 5/100/100/400x)."""
    from types import SimpleNamespace
    m = make()
    stats = SimpleNamespace(records=[{"lgreco_levels": [20.0] * 4}, {}, {"lgreco_levels": [5.0, 100.0, 100.0, 400.0]}])
    assert m.level_histogram(stats) == {"5": 1, "20": 8, "100": 2, "400": 1}
    shares = m.parameter_shares(stats)
    assert list(shares) == ["5", "20", "100", "400"]
    assert shares == pytest.approx({"5": 600 / 3000, "20": 2000 / 3000, "100": 380 / 3000, "400": 20 / 3000})
    assert m.summarize(stats)["layer_sizes"] == SIZES


def test_only_the_default_as_candidate_is_static_compression():
    """candidates=[default]: the same averaged gradients and floats as method=static, bit for bit."""
    cfg = make_run(method=dict(name="static"), compressor=dict(name="topk", granularity="layer", cf=20))
    static = build_method(cfg, SimGroup(W, NetworkModel.from_cfg(cfg.network)), SIZES, torch.device("cpu"))
    lg = make(candidates=[20])
    for s in range(8):
        a, b = static.step(grads(s), ctx(s)), lg.step(grads(s), ctx(s))
        assert torch.equal(a.grad, b.grad) and a.floats_sent == b.floats_sent, s


SMALL = ["dataset.image_size=8", "dataset.train_size=64", "dataset.test_size=32", "model.width=4",
         "train.batch_size=8", "train.eval_every=100", "logger.progress=false", "cluster.workers=2",
         "cluster.threads=1", "train.lr=0.02"]


def _steps(root) -> list[dict]:
    (run,) = [p for p in root.glob("*/*") if p.is_dir()]
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]


@pytest.mark.slow   # 14-33 s: the default suite stays near 15 min; CI runs it with -m slow
def test_cli_single_candidate_equals_static_and_ddp_equals_sim(tmp_path):
    """Real training: method=lgreco with only the default equals static Top-k 20x loss for loss;
    L-GreCo with several candidates takes the same levels on cluster=ddp as on cluster=sim."""
    lg = ["method=lgreco", "method.candidates=[5,20,100,1000]", "method.default_cf=20", "method.period=3",
          "method.window=2", "train.steps=10"]
    runs = {"static": ["method=static", "compressor.cf=20", "train.steps=6"],
            "single": ["method=lgreco", "method.candidates=[20]", "method.default_cf=20", "method.period=2",
                       "method.window=1", "train.steps=6"],
            "sim": [*lg, "cluster=sim"], "ddp": [*lg, "cluster=ddp"]}
    jobs = [dict(args=[*SMALL, f"experiment.results_root={tmp_path / k}", *v], timeout=300) for k, v in runs.items()]
    for k, r in zip(runs, run_cli_many(jobs)):
        assert r.returncode == 0, f"{k}: {failure(r)}"
    static, single = _steps(tmp_path / "static"), _steps(tmp_path / "single")
    assert [s["loss"] for s in static] == [s["loss"] for s in single]
    assert [s["floats_sent"] for s in static] == [s["floats_sent"] for s in single]
    sim, ddp = _steps(tmp_path / "sim"), _steps(tmp_path / "ddp")
    levels = [(s["step"], s["lgreco_levels"]) for s in sim if "lgreco_levels" in s]
    assert levels == [(s["step"], s["lgreco_levels"]) for s in ddp if "lgreco_levels" in s]
    assert len(levels) >= 2 and len(set(levels[-1][1])) > 1          # a solve moved the levels
    for x, y in zip(sim, ddp):
        assert x["floats_sent"] == y["floats_sent"]
        assert math.isclose(x["loss"], y["loss"], rel_tol=1e-4, abs_tol=1e-5), (x["step"], x["loss"], y["loss"])


def test_error_feedback_per_layer_conserves_mass():
    """With mixed levels, each worker's compensated gradient = what it sent + its new residual, per
    layer and exactly, and each layer sent its own level's k."""
    m = make()
    seen = {}
    finish = m.finish

    def keep(c, *a, **kw):
        seen["c"] = c
        return finish(c, *a, **kw)
    m.finish = keep
    for s in range(5):
        m.step(grads(s), ctx(s))
    assert len(set(m.layer_cfs)) > 1
    c = seen["c"]
    offs = np.cumsum([0, *SIZES])
    for w in range(W):
        sent, res = c.payloads[w].dense(), m.memories[0][w].residual
        for l, (o, n) in enumerate(zip(offs, SIZES)):
            assert torch.equal(sent[o:o + n] + res[o:o + n], c.comps[w][o:o + n]), (w, l)
            idx = c.payloads[w].indices
            assert int(((idx >= o) & (idx < o + n)).sum()) == target_k(n, m.layer_cfs[l])


def test_checkpoint_resumes_the_same_decisions():
    a, b = make(), make()
    for s in range(4):
        a.step(grads(s), ctx(s))
    b.load_state_dict(a.state_dict())
    for s in range(4, 9):
        x, y = a.step(grads(s), ctx(s)), b.step(grads(s), ctx(s))
        assert torch.equal(x.grad, y.grad) and x.extra.get("lgreco_solve") == y.extra.get("lgreco_solve")


def test_user_errors_are_one_line():
    with pytest.raises(Exception, match="default_cf=7 must be one of"):
        make(default_cf=7)
    with pytest.raises(Exception, match="window=5 must be <="):
        make(window=5)
    with pytest.raises(Exception, match="^method=lgreco chooses a CF per layer: set compressor.granularity=layer$"):
        make_run(method=dict(name="lgreco"), compressor=dict(name="topk", granularity="flat"))
    with pytest.raises(Exception, match="warmup_epochs=0"):
        make_run(method=dict(name="lgreco"), compressor=dict(name="dgc", warmup_epochs=1.0))
    cfg = make_run(method=dict(name="lgreco"), compressor=dict(name="topk"))
    cfg.compressor.granularity = "flat"                     # past the config check: the method refuses too
    with pytest.raises(UserError, match="granularity=layer"):
        build_method(cfg, SimGroup(W, NetworkModel.from_cfg(cfg.network)), SIZES, torch.device("cpu"))


# --- L-GreCo over Accordion -------------------------------------------------------------------------

ACC = dict(name="lgreco_accordion", cf_low=5, cf_high=100, switch_freq=1, eta=0.5, period=3, window=2)


def acc_grads(step: int, ranks=range(W)) -> list[torch.Tensor]:
    """A steady direction (stable norms: Accordion goes high after its second check), layer 2 jumps
    in epoch 3 (back to low there), spikes in layer 0 (cheap to compress further)."""
    out = []
    for r in ranks:
        x = torch.randn(sum(SIZES), generator=torch.Generator().manual_seed(100 * step + r)) * 0.1
        x += torch.linspace(1, 2, sum(SIZES))
        x[:5] += 30.0
        if step // 4 >= 3:
            x[900:980] *= 4
        out.append(x)
    return out


def acc_ctx(step: int) -> StepContext:
    return StepContext(step=step, epoch=step / 4, lr=0.1, lr_decayed=False, compute_s=0.01, samples=W * 16)


def test_accordion_checkpoint_keeps_both_accumulators():
    """L-GreCo's window sum and Accordion's gradient sum are both in the state (they once shared the
    key "accum", so a resume mid-window solved on Accordion's sum): a copy resumed at a step inside
    both takes the same regimes, solves and gradients as the original."""
    a, b = make(**ACC), make(**ACC)
    for s in range(11):                    # step 10: inside L-GreCo's window (period 3, window 2) and an epoch
        a.step(acc_grads(s), acc_ctx(s))
    state = a.state_dict()
    assert state["window_count"] == 1 and state["window_accum"] is not None and state["accum"] is not None
    assert not torch.equal(state["window_accum"], state["accum"])
    b.load_state_dict(state)
    solves = 0
    for s in range(11, 20):
        x, y = a.step(acc_grads(s), acc_ctx(s)), b.step(acc_grads(s), acc_ctx(s))
        assert torch.equal(x.grad, y.grad) and x.extra.get("lgreco_solve") == y.extra.get("lgreco_solve")
        assert x.extra.get("accordion_decision") == y.extra.get("accordion_decision")
        solves += "lgreco_solve" in x.extra
    assert solves >= 3


def test_accordion_levels_are_the_budget_lgreco_redistributes():
    """At every solve the budget is the error of Accordion's per-layer levels in force (recomputed
    here with torch.topk on rank 0's window), the choice stays within it and sends no more; a regime
    change puts Accordion's own levels in force until the next solve."""
    m = make(**ACC)
    window, solves, mixed = [], 0, False
    for s in range(20):
        gs = acc_grads(s)
        comp0 = gs[0] + m.memories[0][0].residual
        res = m.step(gs, acc_ctx(s))
        acc = [5.0 if low else 100.0 for low in m.regimes.low]
        if "accordion_decision" in res.extra and "lgreco_solve" not in res.extra:
            assert m.layer_cfs == acc
        if "lgreco_solve" in res.extra:
            solves += 1
            rec, a = res.extra["lgreco_solve"], torch.stack(window).mean(0)
            assert sum(topk_errors(a, SIZES, acc)) == pytest.approx(rec["error_budget"], rel=1e-6)
            assert rec["floats_default"] == sum(target_k(n, c) for n, c in zip(SIZES, acc))
            assert rec["error_predicted"] <= rec["error_budget"] and rec["floats_predicted"] <= rec["floats_default"]
            mixed |= len(set(acc)) > 1
            window = []
        if s % 3 >= 1:
            window.append(comp0)
    assert solves == 6 and mixed


def test_accordion_cfs_must_be_candidates():
    with pytest.raises(Exception, match="cf_high=100 must be one of"):
        make(**{**ACC, "candidates": [5, 20]})


# --- quantizers: per-layer code widths -----------------------------------------------------------------

QUANT = dict(compressor="quant", comp=dict(bits=4, bucket=64))
QSGD = dict(compressor="qsgd", comp=dict(levels=7, bucket=64))


def minmax_error(a: torch.Tensor, sizes, widths, bucket: int = 64) -> list[float]:
    """||a_l − Q_b(a_l)|| per layer for nearest-rounding min-max quantization with a (min, step) per
    bucket of each layer, in float64, independently of the compressors package."""
    out, off = [], 0
    for n, b in zip(sizes, widths):
        seg, sq = a[off:off + n].double(), 0.0
        for lo in range(0, n, bucket):
            v = seg[lo:lo + bucket]
            step = float(v.max() - v.min()) / (2 ** b - 1)
            if step > 0:
                dec = v.min() + torch.round((v - v.min()) / step) * step
                sq += float((v - dec).square().sum())
        out.append(math.sqrt(sq))
        off += n
    return out


def static_quant(name: str, **opts):
    cfg = make_run(method=dict(name="static"), compressor=dict(name=name, granularity="layer", **opts))
    return build_method(cfg, SimGroup(W, NetworkModel.from_cfg(cfg.network)), SIZES, torch.device("cpu"))


@pytest.mark.parametrize("setting", [QUANT, QSGD], ids=["quant", "qsgd"])
def test_only_the_default_width_is_static_quantization(setting):
    """bits=[the compressor's own width]: the same averaged gradients, floats and wire bytes as
    method=static with that quantizer, bit for bit, solves included (QSGD: per-worker draws)."""
    static = static_quant(setting["compressor"], **setting["comp"])
    lg = make(**setting, bits=[4])
    for s in range(8):
        a, b = static.step(grads(s), ctx(s)), lg.step(grads(s), ctx(s))
        assert torch.equal(a.grad, b.grad) and (a.floats_sent, a.comm.wire_bytes) == (b.floats_sent, b.comm.wire_bytes), s
    assert lg.layer_cfs == [4] * 4


def test_two_layers_at_8_and_2_bits_by_hand():
    """Layers of 10 and 3 values, buckets of 4, at 8 and 2 bits: layer 0 sends its 10 codes in 10
    bytes plus (min, step) for 3 buckets, 34 bytes (8.5 value-equivalents); layer 1 its 3 codes in
    one byte plus one bucket's pair, 9 bytes (2.25); the payload is 43 bytes, floats 10.75. The
    codes by hand: [0..3] and [4..7] at 8 bits are 0, 85, 170, 255, [8, 9] is 0, 255; [10, 12, 16]
    at 2 bits (min 10, step 2) is 0, 1, 3 packed little-end first into 0b110100."""
    sizes = [10, 3]
    x = torch.tensor([0., 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16])
    m = make(sizes=sizes, compressor="quant", comp=dict(bits=8, bucket=4), bits=[8, 2])
    assert m.compressor.segment_bytes([8, 2]).tolist() == [34, 9]
    _, table = m.trial(x, 2, 0, 0)
    assert table.tolist() == [(3 + 24) / 4, (1 + 8) / 4]                   # both layers at 2 bits
    p = m.encode(x, [8, 2], seed=0)
    wire = p.to_bytes().numpy()
    assert p.wire_bytes() == wire.shape[0] == 43 and p.floats == 10.75
    assert wire[:10].tolist() == [0, 85, 170, 255, 0, 85, 170, 255, 0, 255]
    assert wire[10:34].view(np.float32).tolist() == np.float32([0, 3 / 255, 4, 3 / 255, 8, 1 / 255]).tolist()
    assert wire[34] == 0b110100 and wire[35:43].view(np.float32).tolist() == [10, 2]
    torch.testing.assert_close(p.dense(), x)
    m.layer_cfs = [8, 2]                                    # through the method: what the step sends
    res = m.step([x, x], ctx(0))
    assert (res.comm.wire_bytes, res.floats_sent, res.cf) == (43, 10.75, 13 / 10.75)


def test_quant_levels_keep_the_budget_and_send_fewer_bytes_than_uniform():
    """At every solve the chosen widths' error on rank 0's averaged compensated gradient, recomputed
    here, is the predicted one and within the uniform 4-bit's; the widths mix; the step sends the
    predicted value-equivalents, fewer wire bytes than static 4-bit."""
    m, static = make(**QUANT), static_quant("quant", bits=4, bucket=64)
    window, solves = [], 0
    for s in range(10):
        gs = grads(s)
        comp0 = gs[0] + m.memories[0][0].residual
        res, ref = m.step(gs, ctx(s)), static.step(gs, ctx(s))
        if "lgreco_solve" in res.extra:
            solves += 1
            rec, a, levels = res.extra["lgreco_solve"], torch.stack(window).mean(0), m.layer_cfs
            assert sum(minmax_error(a, SIZES, levels)) == pytest.approx(rec["error_predicted"], rel=1e-5)
            assert sum(minmax_error(a, SIZES, [4] * 4)) == pytest.approx(rec["error_budget"], rel=1e-5)
            assert rec["error_predicted"] <= rec["error_budget"] and rec["fallback"] is None
            assert len(set(levels)) > 1 and set(levels) <= {8, 4, 2}
            assert rec["floats_predicted"] == res.floats_sent < rec["floats_default"]
            assert res.comm.wire_bytes == 4 * res.floats_sent < ref.comm.wire_bytes
            window = []
        if s % 3 >= 1:
            window.append(comp0)
    assert solves == 3


def test_quant_error_feedback_per_layer_and_resume():
    """Mixed widths: residual = compensated − sent per worker, every layer; a resumed copy takes the
    same decisions and gradients."""
    a, b = make(**QUANT), make(**QUANT)
    for s in range(4):
        a.step(grads(s), ctx(s))
    assert len(set(a.layer_cfs)) > 1
    b.load_state_dict(a.state_dict())
    seen = {}
    finish = a.finish

    def keep(c, *args, **kw):
        seen["c"] = c
        return finish(c, *args, **kw)
    a.finish = keep
    for s in range(4, 9):
        x, y = a.step(grads(s), ctx(s)), b.step(grads(s), ctx(s))
        assert torch.equal(x.grad, y.grad) and x.comm.wire_bytes == y.comm.wire_bytes
        assert x.extra.get("lgreco_solve") == y.extra.get("lgreco_solve")   # (a resume re-announces the levels)
        c = seen["c"]
        for w in range(W):
            assert torch.equal(a.memories[0][w].residual, c.comps[w] - c.payloads[w].dense())


def test_quant_records_say_bits():
    """Summaries and the explanation name widths in bits, not CFs."""
    from gravac.methods.base import RunStats
    m = make(**QUANT)
    recs = []
    for s in range(4):
        r = m.step(grads(s), ctx(s))
        recs.append({"floats_sent": r.floats_sent, **json.loads(json.dumps(r.extra))})
    stats = RunStats(recs, 10)
    summ = m.summarize(stats)
    assert summ["level_unit"] == "bits" and set(summ) == {"level_unit", "layer_bits_histogram", "parameter_bits_share",
                                                          "layer_sizes"}
    assert sum(summ["layer_bits_histogram"].values()) == 16 and "4" in summ["layer_bits_histogram"]
    text = m.explain(stats)
    assert "per code width: " in text and "4-bit: " in text and "x:" not in text
    assert "starting code width 4-bit" in make(**QUANT, period=50).explain(RunStats(recs[:1], 10))
    cfg = make_run(method=dict(name="lgreco"), compressor=dict(name="quant", bits=4))
    from gravac.methods.lgreco import LGreco
    assert LGreco.label(cfg.method, cfg.compressor) == "L-GreCo (quant 8/4/2-bit, budget 1x uniform 4-bit)"
    assert LGreco.cf_text(cfg.method, cfg.compressor) == "2–8 bits per layer"
    assert LGreco.describe(cfg.method, cfg.compressor)["level_unit"] == "bits"     # config.yaml's setting too
    topk = make_run(method=dict(name="lgreco"), compressor=dict(name="topk", granularity="layer"))
    assert LGreco.describe(topk.method, topk.compressor)["level_unit"] == "cf"
    assert make().summarize(stats)["level_unit"] == "cf"
    wide = make(compressor="quant", comp=dict(bits=8, bucket=64))     # the widest as the budget: nothing to trade
    recs = [{"floats_sent": r.floats_sent, **r.extra} for r in (wide.step(grads(s), ctx(s)) for s in range(4))]
    assert "(uniform 8-bit is the widest candidate" in wide.explain(RunStats(recs, 10))


def test_quantizer_refusals_are_one_line():
    from gravac.core.check import ConfigError
    for name in ("terngrad", "efsignsgd", "fp16"):
        with pytest.raises(ConfigError, match=rf"^method=lgreco chooses a code width per layer, and compressor={name} "
                                              r"has a single one .*: use method=static with it, or compressor=quant or qsgd"
                                              r" \(8, 4 or 2 bits per layer\)$"):
            make_run(method=dict(name="lgreco"), compressor=dict(name=name))
    with pytest.raises(ConfigError, match=r"^method.bits=\[8, 4\] are a quantizer's code widths, and compressor=topk is a "
                                          r"sparsifier: leave method.bits empty .*or use compressor=quant or qsgd$"):
        make_run(method=dict(name="lgreco", bits=[8, 4]), compressor=dict(name="topk"))
    with pytest.raises(ConfigError, match=r"^compressor.bits=4 is the uniform width whose total error is the budget: it "
                                          r"must be one of method.bits=\[8, 2\]$"):
        make_run(method=dict(name="lgreco", bits=[8, 2]), compressor=dict(name="quant", bits=4))
    with pytest.raises(ConfigError, match=r"^method=lgreco chooses among qsgd's code widths .*compressor.levels=5 "
                                          r"\(4-bit codes\) is not one: set compressor.levels=127, 7 or 1$"):
        make_run(method=dict(name="lgreco"), compressor=dict(name="qsgd", levels=5))
    with pytest.raises(ConfigError, match=r"^method.bits=\[8, 3\] is out of range"):
        make_run(method=dict(name="lgreco", bits=[8, 3]), compressor=dict(name="quant"))
    with pytest.raises(ConfigError, match=r"^method=lgreco_accordion chooses compression factors, and compressor=quant "
                                          r"has none to choose .*: use method=lgreco, method=mergecomp or method=static with it"):
        make_run(method=dict(name="lgreco_accordion"), compressor=dict(name="quant"))


# --- two gloo processes take the same decisions as the simulated cluster -------------------------------

def _work(rank: int) -> dict:
    group = DistGroup(NetworkModel.from_cfg(RunConfig().network), torch.device("cpu"))
    plain, acc, quant = make(group=group), make(group=group, **ACC), make(group=group, **QUANT)
    return {"lgreco": [(r.extra, r.floats_sent, r.grad) for r in (plain.step(grads(s, [rank]), ctx(s))
                                                                 for s in range(8))],
            "lgreco_accordion": [(r.extra, r.floats_sent, r.grad) for r in (acc.step(acc_grads(s, [rank]), acc_ctx(s))
                                                                           for s in range(20))],
            "lgreco_quant": [(r.extra, r.floats_sent, r.grad) for r in (quant.step(grads(s, [rank]), ctx(s))
                                                                       for s in range(8))]}


def test_ddp_ranks_agree_with_each_other_and_with_sim(tmp_path):
    ranks = gloo_ranks(_work, tmp_path, W, 240)
    for name, m, g, c, steps in [("lgreco", make(), grads, ctx, 8), ("lgreco_accordion", make(**ACC), acc_grads, acc_ctx, 20),
                                 ("lgreco_quant", make(**QUANT), grads, ctx, 8)]:
        for s in range(steps):
            ref = m.step(g(s), c(s))
            for rank in ranks:
                extra, floats, grad = rank[name][s]
                assert extra == ref.extra and floats == ref.floats_sent, (name, s)
                torch.testing.assert_close(grad, ref.grad, rtol=1e-6, atol=1e-6)
        assert any("lgreco_solve" in r[0] for r in ranks[0][name])
    assert any("accordion_decision" in r[0] for r in ranks[0]["lgreco_accordion"])
    assert any(len(set(r[0].get("lgreco_levels", [4]))) > 1 for r in ranks[0]["lgreco_quant"])
