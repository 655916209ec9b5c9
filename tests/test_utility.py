"""bench/utility.py: iteration times on the suite's overlap timeline for a hand-computed 2-bucket
toy, break-even bandwidths against their closed form, one-line input errors, and one real run."""
from __future__ import annotations

import csv
import math

import pytest

from bench import utility
from gravac.cluster.profile import DeviceProfile
from gravac.cluster.timeline import Piece

Msg, Plan = utility.Msg, utility.Plan

# forward 10 ms; backward 20 ms, parameter 1's gradient ready after 10 ms, parameter 0's at the end
TOY = DeviceProfile(forward_s=0.01, backward_s=0.02, ready_s=[0.02, 0.01], optimizer_s=0.001, source="given")
DENSE = Plan("dense", "Dense", [Piece([1], 0.0, [Msg(0.0, "allreduce", 2e6)]),
                                Piece([0], 0.0, [Msg(0.0, "allreduce", 2e6)])])


def test_two_bucket_toy_by_hand():
    """N = 2 at 0.8 Gbit/s (1e8 B/s), no latency: a 2 MB all-reduce takes 2(N-1)/N x 2e6 / 1e8 =
    20 ms. Overlap: bucket 1 leaves at 20 ms (forward + 10 ms), ends at 40; bucket 0 is ready at
    30 and waits for the link: 40 -> 60; + optimizer = 61 ms. Both after backward (one piece):
    30 + 40 + 1 = 71 ms. fp16 halves each message (10 ms): 20 -> 30, 30 -> 40, 41 ms; with a
    4 ms cast shared by equal buckets (2 ms each, delaying backward): bucket 1 cast 20-22, sent
    22-32; bucket 0 ready at 32, cast 32-34, sent 34-44: 45 ms. (Static fp16 builds such pieces,
    tests/test_half.py.)"""
    assert utility.iteration_s(DENSE, TOY, 2, 0.8, 0.0) == pytest.approx(0.061)
    serial = Plan("one", "One piece", [Piece(None, 0.0, [m for p in DENSE.pieces for m in p.messages])])
    assert utility.iteration_s(serial, TOY, 2, 0.8, 0.0) == pytest.approx(0.071)
    def fp16(cast_s):
        return Plan("fp16", "FP16", [Piece(p.params, cast_s, [Msg(0.0, "allreduce", 1e6)]) for p in DENSE.pieces])
    assert fp16(0.0).wire_bytes == DENSE.wire_bytes / 2 == 2e6
    assert utility.iteration_s(fp16(0.0), TOY, 2, 0.8, 0.0) == pytest.approx(0.041)
    assert utility.iteration_s(fp16(0.002), TOY, 2, 0.8, 0.0) == pytest.approx(0.045)
    # latency: each all-reduce adds 2(N-1) alpha = 20 us at N = 2, on both buckets' chain
    assert utility.iteration_s(DENSE, TOY, 2, 0.8, 1e-5) == pytest.approx(0.061 + 2 * 2e-5)


def test_break_even_matches_the_closed_form():
    """Everything after backward: dense all-reduce of D against compression c plus an all-gather of
    b. Equal when c + (N-1)a + (N-1)b/B = 2(N-1)a + 2(N-1)/N D/B, i.e.
    B* = (2(N-1)/N D - (N-1) b) / (c - (N-1) a); below B* the compressed step is faster."""
    prof = DeviceProfile(forward_s=0.0, backward_s=0.05, ready_s=[], optimizer_s=0.0, source="given")
    n, a, D, b, c = 8, 1e-5, 4e7, 4e5, 0.01
    ref = Plan("dense", "Dense", [Piece(None, 0.0, [Msg(0.0, "allreduce", D)])])
    comp = Plan("topk", "Top-k", [Piece(None, c, [Msg(0.0, "allgather", b)])])
    closed = (2 * (n - 1) / n * D - (n - 1) * b) / (c - (n - 1) * a) * 8 / 1e9
    assert closed == pytest.approx(54.14, rel=1e-3)
    assert utility.break_even(comp, ref, prof, n, a) == pytest.approx(closed, rel=1e-9)
    never = Plan("big", "Big", [Piece(None, c, [Msg(0.0, "allgather", D)])])     # N x the bytes, and slower
    assert utility.break_even(never, ref, prof, n, a) == 0.0
    free = Plan("free", "Free", [Piece(None, 0.0, [Msg(0.0, "allgather", b)])])  # no cost, fewer bytes
    assert math.isinf(utility.break_even(free, ref, prof, n, a))


def test_break_even_takes_the_highest_crossing(monkeypatch):
    """A method faster only in two bands, 0.1-1 and 10-100 Gbit/s (a near-tie in bytes can do
    that): its break-even is the top of the higher band, 100, found on the grid then bisected.
    Faster only above 5 Gbit/s (latency-bound): no "pays below", pays above 5. Faster everywhere:
    inf below, 0 above; nowhere: 0 below, inf above."""
    bands = {"two": [(0.1, 1.0), (10.0, 100.0)], "top": [(5.0, 1e5)], "none": [], "all": [(0, 1e5)]}
    monkeypatch.setattr(utility, "iteration_s", lambda plan, prof, n, g, a, *_: 1.0 if plan.name == "ref" else
                        0.9 if any(x < g < y for x, y in bands[plan.name]) else 1.1)
    ref = Plan("ref", "Ref", [])
    assert utility.break_even(Plan("two", "", []), ref, TOY, 8, 0.0) == pytest.approx(100.0, rel=1e-9)
    assert math.isinf(utility.pays_above(Plan("two", "", []), ref, TOY, 8, 0.0))
    top = Plan("top", "", [])
    assert utility.break_even(top, ref, TOY, 8, 0.0) == 0.0
    assert utility.pays_above(top, ref, TOY, 8, 0.0) == pytest.approx(5.0, rel=1e-9)
    assert utility.break_even(Plan("none", "", []), ref, TOY, 8, 0.0) == 0.0
    assert math.isinf(utility.pays_above(Plan("none", "", []), ref, TOY, 8, 0.0))
    assert math.isinf(utility.break_even(Plan("all", "", []), ref, TOY, 8, 0.0))
    assert utility.pays_above(Plan("all", "", []), ref, TOY, 8, 0.0) == 0.0


def test_a_collective_profile_prices_the_recorded_messages():
    """With a profile, a recorded sparse all-gather (counts, then values) costs what the model says
    the whole collective costs, an all-reduce what its fitted terms say; without, the ideal ring.
    The counts message carries the 8-byte count on the wire, not the payload."""
    from gravac.cluster.netmodel import CollectiveCost, CollectiveProfile, NetworkModel
    cost = CollectiveCost(call_s=1e-3, step_s=2e-4, link_factor=1.5, pair_factor=0.5, host_s_per_byte=1e-9)
    prof = CollectiveProfile("toy", {k: cost for k in ("allreduce", "allgather", "sparse_allgather", "broadcast")})
    plan = Plan("topk", "Top-k", [Piece(None, 0.0, [Msg(0.0, "sparse_counts", 4e4), Msg(0.0, "sparse_values", 4e4),
                                                    Msg(0.0, "allreduce", 1e6)])])
    assert plan.wire_bytes == 8 + 4e4 + 1e6 and plan.collectives == "allreduce+sparse_allgather"
    for n in (2, 4):
        fitted = NetworkModel(alpha_s=1e-5, beta_Bps=1.25e7, profile=prof)
        want = fitted.predict("sparse_allgather", 4e4, n) + fitted.predict("allreduce", 1e6, n)
        assert utility.comm_s(plan, n, 0.1, 1e-5, prof) == pytest.approx(want, rel=1e-12)
        ideal = 2 * ((n - 1) * 1e-5 + (n - 1) * 4e4 / 1.25e7) + 2 * (n - 1) * 1e-5 + 2 * (n - 1) / n * 1e6 / 1.25e7
        ideal -= (n - 1) * (4e4 - 8) / 1.25e7          # the counts all-gather sends 8 bytes, not 4e4
        assert utility.comm_s(plan, n, 0.1, 1e-5) == pytest.approx(ideal, rel=1e-12)
        assert utility.comm_s(plan, n, 0.1, 1e-5, prof) > 1.4 * utility.comm_s(plan, n, 0.1, 1e-5)
    prof0 = DeviceProfile(forward_s=0.01, backward_s=0.02, ready_s=[], optimizer_s=0.001, source="given")
    assert utility.iteration_s(plan, prof0, 4, 0.1, 1e-5, prof) == pytest.approx(
        0.031 + utility.comm_s(plan, 4, 0.1, 1e-5, prof), rel=1e-12)    # one piece after backward


@pytest.mark.parametrize("argv,line", [
    (["workers=8,x"], "error: workers=8,x: expected a comma list of ints >= 2"),
    (["workers=1,8"], "error: workers=1,8: every value must be a finite number >= 2"),
    (["bandwidths=10Gbps"], "error: bandwidths=10Gbps: expected a comma list of floats > 0 in Gbit/s"),
    (["bandwidths=0,10"], "error: bandwidths=0,10: every value must be a finite number > 0 in Gbit/s"),
    (["methods=topk:0.5"], "error: methods: 'topk:0.5' is not one of: dense, "),
    (["methods=nope"], "error: methods: 'nope' is not one of: dense, "),
    (["cost_scale=-1"], "error: cost_scale=-1: every value must be a finite number >= 0"),
    (["compute_s=0.1,0.2"], "error: compute_s=0.1,0.2: expected one number >= 0"),
    (["workers"], "error: workers: arguments are key=value"),
    (["model=nope"], "error: unknown model 'nope'; choose one of: "),         # bench/run.py's own check
    (["network.collectives=nope"], "error: network.collectives=nope: no such profile"),
    (["--validate", "methods=nope"], "error: methods: 'nope' is not one of: dense, "),
    (["--validate", "workers=1"], "error: workers=1: every value must be a finite number >= 2"),
])
def test_bad_input_is_one_line(argv, line, capsys):
    assert utility.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err


def test_run_on_the_study_device(tmp_path, capsys):
    """resnet_mini on synthetic data (its profile is the study device's): a row per method, N and
    bandwidth; fp16 sends half of dense's bytes on the same buckets, Top-k all-gathers after
    backward; a stated compute time is used and said to be an assumption."""
    out = tmp_path / "u"
    assert utility.main(["model=resnet_mini", "dataset=synthetic", "workers=8,32", "bandwidths=1,100",
                         "methods=topk:100", "compute_s=0.5", f"out={out}"]) == 0
    text = capsys.readouterr().out
    assert "forward" in text and "STATED (compute_s=)" in text
    assert "collectives priced by network.collectives=ideal" in text      # the default model, said
    assert "At N=32 on 100 Gbit/s" in text          # the middle cell when 25 Gbit/s is not asked for
    rows = list(csv.DictReader((out / "utility.csv").open()))
    assert len(rows) == 3 * 2 * 2 and {r["method"] for r in rows} == {"dense", "fp16", "topk:100"}
    by = {(r["method"], r["workers"], r["bandwidth_gbps"]): r for r in rows}
    dense, fp16, topk = by["dense", "8", "1"], by["fp16", "8", "1"], by["topk:100", "8", "1"]
    assert int(dense["wire_bytes"]) == 4 * 272474 == 2 * int(fp16["wire_bytes"])    # resnet_mini's parameters
    assert dense["pieces"] == fp16["pieces"] != "1"
    assert topk["collectives"] == "sparse_allgather" and topk["pieces"] == "1"
    assert float(fp16["speedup_vs_fp16"]) == 1.0 and float(dense["speedup_vs_fp32"]) == 1.0
    assert float(by["dense", "8", "1"]["iteration_s"]) > 0.5     # the stated compute is in it
    even = list(csv.DictReader((out / "break_even.csv").open()))
    assert [(e["method"], e["workers"]) for e in even] == [("topk:100", "8"), ("topk:100", "32")]
    assert (out / "heatmaps.png").stat().st_size > 0


def test_a_preset_naming_cuda_is_priced_on_the_cpu_it_runs_on(tmp_path, capsys):
    """The paper presets say cluster.device=cuda, but the step runs on this host's CPU: its profile
    is the CPU's (here the study device's), never one filed under a GPU's name."""
    assert utility.main(["model=resnet_mini", "dataset=synthetic", "workers=8", "bandwidths=1",
                         "methods=topk:100", f"out={tmp_path / 'u'}", "cluster.device=cuda"]) == 0
    text = capsys.readouterr().out
    assert "device 'reference-cpu'" in text and ", cuda," not in text


def test_validation_row_compares_a_measured_cell_like_with_like():
    """A measured cell (N = 4, 100 Mbit/s) against a 1 MB all-reduce: each model's prediction is
    the run's own median compute + compression + optimizer plus the message's price (ideal without
    the tbf bucket, a profile with it), the ratios measured / predicted; the study device's
    overlapped prediction is only added beside them."""
    from gravac.cluster.netmodel import CollectiveCost, CollectiveProfile, NetworkModel
    plan = Plan("dense", "Dense", [Piece(None, 0.0, [Msg(0.0, "allreduce", 1e6)])])
    recs = [{"step_wall_s": w, "comm_s": c, "compute_s": 0.1, "compress_s": 0.0, "optimizer_s": 0.01, "wire_bytes": 1e6}
            for w, c in ((0.30, 0.19), (0.31, 0.20), (0.50, 0.39))]       # medians: 0.31 s, 0.20 s
    prof = CollectiveProfile("toy", {k: CollectiveCost(2e-3, 1e-4, 1.2, 0.3, 0.0)
                                     for k in ("allreduce", "allgather", "sparse_allgather", "broadcast")})
    row = utility.validation_row(plan, recs, 4, 0.1, 1e-5, {"ideal": None, "toy": prof}, 12000.0, study=TOY)
    ideal = 6 * 1e-5 + 1.5e6 / 1.25e7                       # 2(N-1)a + 2(N-1)/N B/b = 0.12006 s
    assert row["predicted_comm_ideal_s"] == pytest.approx(ideal, rel=1e-12)
    assert row["predicted_step_ideal_s"] == pytest.approx(0.11 + ideal, rel=1e-12)
    assert row["ratio_step_ideal"] == pytest.approx(0.31 / (0.11 + ideal), rel=1e-12)
    assert row["ratio_comm_ideal"] == pytest.approx(0.20 / ideal, rel=1e-12)
    toy = NetworkModel(alpha_s=1e-5, beta_Bps=1.25e7, profile=prof, burst_bytes=12000.0).allreduce(1e6, 4)
    assert toy == pytest.approx(2e-3 + 6 * 1.1e-4 + (1.5e6 - 12000) * 1.2 / 1.25e7)     # the bucket counted
    assert row["predicted_comm_toy_s"] == pytest.approx(toy, rel=1e-12)
    assert row["measured_wire_bytes"] == row["recorded_wire_bytes"] == 1e6 and row["steps"] == 3
    assert row["utility_study_device_ideal_s"] == pytest.approx(0.031 + ideal, rel=1e-12)   # one piece, serial


def test_run_overrides_run_the_method_a_spec_names():
    specs = {s[0]: s for s in utility.method_specs("dense,fp16,topk:100,powersgd:2")}
    assert utility.run_overrides(*specs["dense"][1:]) == ["method=dense", "compressor=none"]
    assert utility.run_overrides(*specs["fp16"][1:]) == ["method=static", "compressor=fp16"]
    assert utility.run_overrides(*specs["topk:100"][1:]) == ["method=static", "compressor=topk", "compressor.cf=100.0"]
    assert utility.run_overrides(*specs["powersgd:2"][1:]) == ["method=powersgd", "method.rank=2", "compressor=none"]
