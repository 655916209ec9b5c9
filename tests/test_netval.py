"""The real-network validation (bench/netval.py): namespaces come and go, the shaped link limits
what gloo can move, and a two-"node" torchrun job over the link writes one results folder."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from netns import Netns, missing  # noqa: E402
from conftest import failure  # noqa: E402

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"no network namespaces: {missing()}")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_namespaces_are_deleted_even_when_the_body_raises():
    with pytest.raises(RuntimeError, match="inside"):
        with Netns(2, 100) as net:
            mine = {net.ns(0), net.ns(1), net.switch}
            assert mine <= _namespaces()
            raise RuntimeError("inside")
    assert not mine & _namespaces()


@pytest.mark.slow   # 14-33 s: the default suite stays near 15 min; CI runs it with -m slow
def test_quick_sweep_writes_csv_whose_predictions_follow_the_model(tmp_path):
    out, before = tmp_path / "nv.csv", _namespaces()
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "netval.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, failure(r)
    rows = list(csv.DictReader(open(out)))
    assert {r["kind"] for r in rows} == {"allreduce", "allgather", "sparse_allgather", "broadcast"}
    assert (tmp_path / "nv.png").stat().st_size > 0
    beta = 100e6 / 8                          # 100 Mbit/s in bytes/s; 2 workers; alpha = 10 us
    for row in rows:
        b, kind = int(row["bytes"]), row["kind"]
        if kind == "allreduce":               # 2(N-1)a + 2(N-1)/N B/b, on the float32 tensor's bytes
            expect = 2e-5 + (b // 4 * 4) / beta
        elif kind == "allgather":             # (N-1)a + (N-1) b/b
            expect = 1e-5 + b / beta
        elif kind == "sparse_allgather":      # count all-gather (8 B) + padded payload all-gather
            expect = 2e-5 + 8 / beta + (b // 8 * 8) / beta
        else:                                 # one tree round with 2 workers
            expect = 1e-5 + (b // 4 * 4) / beta
        assert float(row["predicted_ideal_s"]) == pytest.approx(expect, rel=1e-4)
        assert float(row["predicted_fitted_s"]) > 0    # the committed gloo-cpu profile's prediction
        if b >= 1 << 20:                      # tbf really limits the rate: no collective beats it
            assert float(row["measured_min_s"]) >= 0.8 * (b // 4 * 4) / beta
    assert not {n for n in _namespaces() - before if n.startswith("gvb")}   # the script deleted its own


@pytest.mark.slow
def test_torchrun_two_nodes_over_a_shaped_link_write_one_results_folder(tmp_path):
    """Two namespaces as two "nodes", each running torchrun --nnodes 2 with a c10d rendezvous."""
    port = 20000 + int.from_bytes(os.urandom(2), "little") % 20000   # a fresh namespace: any port is free
    with Netns(2, 1000) as net:
        procs = []
        for node in range(2):
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{net.addr(0)}:{port}", "--rdzv-id", net.tag,
                    # both namespaces share one hostname, so torchrun cannot tell which one owns the
                    # endpoint's address: node 0 hosts the c10d store
                    "--rdzv-conf", f"is_host={'true' if node == 0 else 'false'}",
                    "--local-addr", net.addr(node),     # else the master address is the shared hostname
                    str(ROOT / "bench" / "run.py"), "cluster=ddp", "method=gravac", "compressor=topk",
                    "method.window=2", "train.steps=6", "dataset.image_size=8", "dataset.train_size=256",
                    "dataset.test_size=64", "model.width=4", "train.batch_size=8", "train.eval_every=3",
                    "logger.progress=false", "cluster.threads=1", f"experiment.results_root={tmp_path}",
                    f"clock.cache_dir={tmp_path / 'cache'}", "network=1gbps"]
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            procs.append(net.popen(node, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=400)[0].decode(errors="replace"))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
        assert all(p.returncode == 0 for p in procs), "\n----\n".join(o[-3000:] for o in outs)
    runs = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    assert len(runs) == 1, runs
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["workers"] == 2 and summary["backend"] == "ddp"
    assert len((runs[0] / "steps.jsonl").read_text().splitlines()) == 6
