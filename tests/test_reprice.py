"""bench/reprice.py: re-pricing a curated run under its own collective model gives back every
recorded step time (the identity that makes its other answers trustworthy), a changed record
breaks it, only the communication changes under another model, and user errors are one line."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench import reprice

ROOT = Path(__file__).resolve().parents[1]
VGG = ROOT / "results" / "reference" / "mini_vgg" / "runs"
# one curated run per rebuilt method (and payload kind); GraVAC and Accordion change CF over the run
# (GraVAC ε=0.7 stays dense on mini_vgg; ε=0.3 sends both its compressed levels)
QUANTIZED = ["qsgd-8-bit-bucket-512-s0", "terngrad-2-bit-s0", "ef-signsgd-1-bit-s0",
             "min-max-quant-4-bit-bucket-1024-s0"]
RUNS = ["dense-s0", "top-k-10x-s0", "dgc-10x-s1", "redsync-1000x-s0", "random-k-10x-s0", "gravac-eps0.7-dgc-s0",
        "gravac-eps0.3-dgc-s0", "accordion-topk-1.5x-1000x-s0", *QUANTIZED, "fp16-2x-s0"]


def few_steps(rec: reprice.Recorded, n: int = 12) -> reprice.Recorded:
    """The run's first steps, and the first steps of every other CF it sent (GraVAC's compressed
    levels, Accordion's switch), so the test stays fast yet sees every message layout."""
    keep, seen = [], {}
    for s in rec.steps:
        key = (s.get("level"), round(s["cf"]))
        if len(keep) < n or seen.get(key, 0) < 3:
            keep.append(s)
            seen[key] = seen.get(key, 0) + 1
    return dataclasses.replace(rec, steps=keep)


@pytest.fixture(scope="module")
def recs():
    return {name: few_steps(reprice.load(str(VGG / name))) for name in RUNS}


@pytest.mark.parametrize("name", RUNS)
def test_identity_reprices_every_recorded_step_time(recs, name):
    rec = recs[name]
    assert reprice.identity(rec) is None
    for s in rec.steps:
        got = reprice.price(rec, rec.net, s)
        for k in ("comm_model_s", "step_model_s", "step_overlap_model_s", "exposed_comm_model_s"):
            assert got[k] == pytest.approx(s[k], rel=1e-9, abs=1e-15), (name, s["step"], k)


def test_the_identity_check_sees_a_step_it_cannot_rebuild(recs):
    rec = recs["dgc-10x-s1"]
    steps = [dict(s) for s in rec.steps]
    steps[5]["wire_bytes"] += 4          # one more value than the step sent
    why = reprice.identity(dataclasses.replace(rec, steps=steps))
    assert why is not None and why.startswith(f"step {steps[5]['step']}: step_model_s")


def test_the_steps_checked_cover_every_message_layout(recs):
    assert {s["level"] for s in recs["gravac-eps0.7-dgc-s0"].steps} == {"dense"}
    assert {s["level"] for s in recs["gravac-eps0.3-dgc-s0"].steps} == {"min", "c"}
    assert {round(s["cf"]) for s in recs["accordion-topk-1.5x-1000x-s0"].steps} == {2, 6, 745, 910}


@pytest.mark.parametrize("name", QUANTIZED)
def test_a_quantizer_sends_one_all_gather_of_its_packed_bytes_after_backward(recs, name):
    rec = recs[name]
    for s in rec.steps:
        assert reprice.messages(rec, s) == [(None, s["compress_model_s"], [("allgather", s["wire_bytes"])])]


def test_a_cast_sends_every_bucket_in_16_bits_with_its_share_of_the_cast(recs):
    rec = recs["fp16-2x-s0"]
    s = rec.steps[3]
    pieces = reprice.messages(rec, s)
    assert [p[0] for p in pieces] == rec.buckets and len(pieces) > 1
    assert sum(p[1] for p in pieces) == pytest.approx(s["compress_model_s"], rel=1e-12)
    for params, cast, msgs in pieces:
        n = sum(rec.sizes[i] for i in params)
        assert msgs == [("allreduce", pytest.approx(2.0 * n))] and cast == pytest.approx(s["compress_model_s"] * n / rec.numel)


@pytest.mark.parametrize("name", ["dense-s0", "gravac-eps0.7-dgc-s0", "gravac-eps0.3-dgc-s0", "terngrad-2-bit-s0",
                                  "fp16-2x-s0"])
def test_another_model_changes_only_the_communication(recs, name):
    rec = recs[name]
    net = reprice.new_model(rec, "gloo-cpu")
    assert net.profile is not None and (net.alpha_s, net.beta_Bps) == (rec.net.alpha_s, rec.net.beta_Bps)
    for s, t in zip(rec.steps, reprice.reprice(rec, net)):
        assert t["step_model_s"] - s["step_model_s"] == pytest.approx(t["comm_model_s"] - s["comm_model_s"], abs=1e-12)
        assert t["comm_model_s"] > s["comm_model_s"]      # gloo's fitted terms all add to alpha-beta's
        assert t["step_overlap_model_s"] >= t["step_model_s"] - t["comm_model_s"] - 1e-12


def test_a_method_whose_messages_are_not_recorded_is_skipped():
    run = ROOT / "results" / "reference" / "powersgd" / "mini_vgg" / "runs" / "accordion-powersgd-rank-2-1-s0"
    with pytest.raises(reprice.Skip, match="accordion_powersgd: its per-step messages"):
        reprice.load(str(run))


def test_changed_verdicts_are_listed_once_per_setting_and_baseline():
    def row(setting, dense, topk, model):
        return {"experiment": "e", "setting": setting, "model": model, "vs_dense": dense + " (0.8x [0.7x, 0.9x])",
                "vs_dense_verdict": dense, "vs_topk10": topk, "vs_topk10_verdict": topk}
    before = [row("Dense", "baseline", "faster", "ideal"),
              row("DGC 10x", "not distinguishable at 95%", "slower", "ideal")]
    after = [row("Dense", "baseline", "slower", "gloo-cpu"), row("DGC 10x", "slower", "slower", "gloo-cpu")]
    assert reprice.changes(before, after) == [
        "e: DGC 10x vs Dense in modelled time to target: not distinguishable at 95% under ideal -> slower under "
        "gloo-cpu (0.8x [0.7x, 0.9x])"]


@pytest.mark.parametrize("argv, says", [
    (["/no/such/folder", "--collectives", "gloo-cpu"], "/no/such/folder: no such folder"),
    ([str(VGG / "dense-s0"), "--collectives", "no-such-profile"], "no such profile"),
])
def test_user_errors_are_one_line(capsys, argv, says):
    assert reprice.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and says in err


def test_a_speedup_crossing_one_without_a_verdict_is_named_apart():
    def row(setting, speedup, verdict, model):
        return {"experiment": "e", "setting": setting, "model": model, "speedup_vs_dense": speedup,
                "vs_dense_verdict": verdict}
    one = "one seed: not tested"
    before = [row("GraVAC", 1.06, one, "ideal"), row("DGC 1000x", 1.66, one, "ideal")]
    after = [row("GraVAC", 0.969, one, "gloo-cpu"), row("DGC 1000x", 1.58, one, "gloo-cpu")]
    assert reprice.crossings(before, after) == [
        "e: GraVAC vs Dense: 1.06x under ideal -> 0.969x under gloo-cpu (one seed: not tested)"]
