"""bench/compress_error.py: one-shot compression errors at equal wire bytes, checked by hand."""
from __future__ import annotations

import csv

import pytest
import torch

from bench.compress_bench import make
from bench.compress_error import energy_share, main, parse_pairs, relative_error
from compressors.base import COUNT_BYTES
from gravac.core.errors import UserError


def test_topk_error_is_the_energy_it_drops_layer_by_layer():
    g = torch.tensor([1.0, 2.0, 3.0, 4.0])                                  # ||g||^2 = 30
    err, wire = relative_error(make("topk"), 2.0, g, [4])
    assert err == pytest.approx(5 / 30) and wire == 2 * (4 + 4) + COUNT_BYTES  # keeps 3, 4: drops 1 + 4
    err, _ = relative_error(make("topk"), 2.0, g, [2, 2])
    assert err == pytest.approx(10 / 30)                                     # one per layer: keeps 2 and 4
    assert energy_share(g, 2.0) == pytest.approx(25 / 30)                   # globally the two largest


def test_a_quantizer_error_is_its_decode_against_the_gradient():
    g = torch.tensor([0.5, -1.0, 2.0, -4.0, 0.0, 3.0, -2.5, 1.5])
    comp = make("efsignsgd")                                                  # sign times mean |g| per tensor
    err, _ = relative_error(comp, 1.0, g, [8])
    scale = g.abs().mean()
    want = ((torch.where(g >= 0, scale, -scale) - g) ** 2).sum() / (g ** 2).sum()
    assert err == pytest.approx(float(want), rel=1e-6)


def test_pairs_are_parsed_or_refused_in_one_line():
    assert parse_pairs("qsgd@8,quant:bits=4+bucket=1024@16") == [("qsgd", 8.0), ("quant:bits=4+bucket=1024", 16.0)]
    for bad in ("qsgd", "qsgd@1", "nosuch@8", "qsgd@x"):
        with pytest.raises(UserError, match="--pairs entry"):
            parse_pairs(bad)


def test_cli_writes_a_row_per_compressor_and_layerwise_topk_never_beats_the_global_share(tmp_path):
    out = tmp_path / "ce"
    rows = main(["--families", "default", "--pool", "2", "--warmup", "1", "--pairs", "qsgd@8,efsignsgd@64",
                 "--out", str(out)])
    saved = list(csv.DictReader((out / "errors.csv").open()))
    assert [r["compressor"] for r in saved] == ["qsgd", "topk@8", "efsignsgd", "topk@64"] and len(rows) == 4
    for r in saved:
        assert float(r["rel_error"]) >= 0 and int(r["pool"]) == 2
    for t in (r for r in saved if r["compressor"].startswith("topk@")):
        # per-layer k sum to at most the global d/CF, so they keep at most the global top share
        assert float(t["rel_error"]) >= 1 - float(t["top_share"]) - 1e-9
    assert float(saved[0]["rel_error"]) < float(saved[1]["rel_error"])      # 8-bit QSGD loses far less than Top-k 8x here
    md = (out / "summary.md").read_text()
    assert md.count("| default |") == 2 and "--pairs qsgd@8,efsignsgd@64" in md
