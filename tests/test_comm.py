"""The communication layer: aggregation matches the math, padding never leaks, ddp == sim."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from compressors import Payload
from gravac.cluster.comm import COUNT_BYTES, DistGroup, SimGroup
from gravac.cluster.netmodel import NetworkModel

NET = NetworkModel(alpha_s=1e-5, beta_Bps=1e9)


def _payloads():
    """Two workers with different counts; worker 1's padding would land on index 0 if it leaked."""
    p0 = Payload(values=torch.tensor([1.0, 2.0, 3.0]), indices=torch.tensor([0, 4, 7]), numel=10)
    p1 = Payload(values=torch.tensor([10.0]), indices=torch.tensor([4]), numel=10)
    return [p0, p1]


def test_sim_sparse_mean_and_wire_bytes():
    out, stats = SimGroup(2, NET).aggregate(_payloads())
    expected = torch.zeros(10)
    expected[0], expected[4], expected[7] = 1 / 2, 12 / 2, 3 / 2
    assert torch.equal(out, expected)
    assert stats.wire_bytes == 3 * (4 + 4) + COUNT_BYTES  # padded to the largest payload
    assert stats.modelled_s == pytest.approx(NET.allgather(8, 2) + NET.allgather(24, 2))


def _packed():
    """Two workers' EF-SignSGD payloads of one layout (layers of 3 and 7): sign x mean |x| per layer."""
    from compressors import build_compressor
    comp = build_compressor("efsignsgd", layer_sizes=[3, 7])
    xs = [torch.tensor([1.0, -2, 3, 4, -5, 6, -7, 8, 0, 1]), torch.tensor([-1.0, 1, 1, 2, 2, 2, 2, -2, 2, 2])]
    return [comp.compress(x, 1) for x in xs]


def test_sim_packed_mean_wire_bytes_and_floats():
    """Quantized payloads are all-gathered as packed bytes, decoded and averaged in rank order."""
    out, stats = SimGroup(2, NET).aggregate(_packed())
    m = torch.tensor(31 / 7, dtype=torch.float32)      # worker 0's second layer: mean |x| = 31/7
    expected = torch.cat([torch.tensor([2.0 - 1, -2 + 1, 2 + 1]),      # layer 0: +-2 and +-1
                          torch.stack([m + 2, -m + 2, m + 2, -m + 2, m - 2, m + 2, m + 2])]) / 2
    assert torch.equal(out, expected)
    assert stats.wire_bytes == 2 + 2 * 4                 # 10 sign bits in 2 bytes, 2 float32 scales
    assert stats.floats == 10 / 4                          # value-equivalents: wire bits / 32
    assert stats.modelled_s == pytest.approx(NET.allgather(10, 2)) and len(stats.messages) == 1


def test_sim_dense_and_shared():
    g = SimGroup(2, NET)
    out, stats = g.allreduce_mean([torch.ones(4), 3 * torch.ones(4)])
    assert torch.equal(out, 2 * torch.ones(4)) and stats.wire_bytes == 16
    idx = torch.tensor([1, 3])
    shared = [Payload(values=torch.tensor([2.0, 4.0]), indices=idx, numel=5, shared=True),
              Payload(values=torch.tensor([4.0, 0.0]), indices=idx, numel=5, shared=True)]
    out, stats = g.aggregate(shared)
    assert torch.equal(out, torch.tensor([0.0, 3.0, 0.0, 2.0, 0.0])) and stats.wire_bytes == 8


def _ddp_worker(rank, init, out_dir):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    g = DistGroup(NET, torch.device("cpu"))
    out, stats = g.aggregate([_payloads()[rank]])
    rows, _ = g.gather_floats([[float(rank), 1.5]])
    pout, pstats = g.aggregate([_packed()[rank]])
    torch.save({"out": out, "wire": stats.wire_bytes, "rows": rows,
                "packed": (pout, pstats.wire_bytes, pstats.floats)}, os.path.join(out_dir, f"{rank}.pt"))
    dist.destroy_process_group()


def test_ddp_sparse_allgather_equals_sim():
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_ddp_worker, args=(f"file://{tmp}/store", tmp), nprocs=2, join=False,
                                 start_method="spawn")
        deadline = 120
        import time
        t0 = time.time()
        while not ctx.join(timeout=5):
            if time.time() - t0 > deadline:
                for p in ctx.processes:
                    p.kill()
                pytest.fail("ddp workers hung")
        sim, sim_stats = SimGroup(2, NET).aggregate(_payloads())
        for r in range(2):
            got = torch.load(os.path.join(tmp, f"{r}.pt"))
            assert torch.equal(got["out"], sim)
            assert got["wire"] == sim_stats.wire_bytes
            assert got["rows"] == [[0.0, 1.5], [1.0, 1.5]]
            psim, pstats = SimGroup(2, NET).aggregate(_packed())
            assert torch.equal(got["packed"][0], psim)
            assert got["packed"][1:] == (pstats.wire_bytes, pstats.floats) == (10, 2.5)
