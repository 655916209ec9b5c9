"""Our PowerSGD against torch's own DDP `powerSGD_hook` (2 gloo processes): the same averaged
gradients step by step, within float tolerance.

Matched settings: rank, min_compression_rate (2, torch's default), orthogonalisation epsilon (0,
torch's default), warm start and error feedback on, the dense start (start_step =
start_powerSGD_iter = 2, the least torch allows with error feedback), and the initial Q: torch
seeds `torch.manual_seed(np.random.RandomState(seed).randint(1_000_000_000))` for the bucket and
draws one normal (1, m, r) tensor per compressed tensor in the bucket's order grouped by matrix
shape; `torch_initial_qs` draws the same and hands them to our method (which would draw its own
from the run's seed). Each parameter's gradient is a scripted tensor (loss = Σ p·c), different per
rank and step. The model's shapes cover: compressed matrices, a 4-D tensor viewed as 4 × 18, 1-D
tensors, and tensors torch's rule leaves dense at rank 2 but not at rank 1.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch
from conftest import gloo_ranks, make_run

from compressors.lowrank import compresses, matrix_shape
from gravac.cluster.comm import SimGroup
from gravac.methods import StepContext, build_method
from gravac.cluster.netmodel import NetworkModel

WORLD, STEPS, START, SEED = 2, 7, 2, 7
SHAPES = [(8, 6), (8,), (4, 2, 3, 3), (16, 12), (3, 8), (5,)]
RANKS = (1, 2)
JOIN_TIMEOUT_S = 240


def coefs(step: int, rank: int) -> list[torch.Tensor]:
    """The gradient of every parameter on `rank` at `step` (a scripted, changing direction)."""
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + 1)
    return [torch.randn(s, generator=g) + 0.3 * step for s in SHAPES]


class Params(torch.nn.Module):
    """Parameters of SHAPES whose gradients are the given coefficients."""

    def __init__(self):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES])

    def forward(self, cs):
        return sum((p * c).sum() for p, c in zip(self.ps, cs))


def torch_run(rank: int, matrix_rank: int) -> dict:
    """DDP with powerSGD_hook: every step's averaged gradient (flat, parameter order) and the
    bucket layout at the first compressed step (parameter indices per bucket, in bucket order)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
        PowerSGDState,
        powerSGD_hook,
    )
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = Params()
    index = {id(p): i for i, p in enumerate(model.parameters())}
    ddp = DDP(model, broadcast_buffers=False)
    state = PowerSGDState(process_group=None, matrix_approximation_rank=matrix_rank, start_powerSGD_iter=START,
                          min_compression_rate=2, use_error_feedback=True, warm_start=True,
                          orthogonalization_epsilon=0, random_seed=SEED)
    layout: dict[int, list[int]] = {}

    def hook(st, bucket):
        if st.iter == START:
            layout[bucket.index()] = [index[id(p)] for p in bucket.parameters()]
        return powerSGD_hook(st, bucket)

    ddp.register_comm_hook(state, hook)
    grads = []
    for s in range(STEPS):
        model.zero_grad()
        ddp(coefs(s, rank)).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
    return {"grads": grads, "layout": layout}


def _work(rank: int) -> dict:
    return {r: torch_run(rank, r) for r in RANKS}


@pytest.fixture(scope="module")
def torch_results(tmp_path_factory):
    return gloo_ranks(_work, tmp_path_factory.mktemp("psgd"), WORLD, JOIN_TIMEOUT_S)


def torch_initial_qs(layout: dict[int, list[int]], matrix_rank: int) -> dict[int, torch.Tensor]:
    """The Qs powerSGD_hook draws at its first compressed step, per parameter index (one bucket)."""
    assert len(layout) == 1, f"expected one DDP bucket, got {layout}"
    (order,) = layout.values()
    rng = np.random.RandomState(SEED)
    groups: dict[tuple[int, int], list[int]] = {}
    for i in order:
        if compresses(SHAPES[i], matrix_rank, 2.0):
            groups.setdefault(matrix_shape(SHAPES[i]), []).append(i)
    out = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng.randint(1_000_000_000))
        for (n, m), members in groups.items():
            for i in members:
                out[i] = torch.randn(1, m, min(n, m, matrix_rank))[0]
    return out


def ours(matrix_rank: int, qs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    cfg = make_run(method=dict(name="powersgd", rank=matrix_rank, min_compression_rate=2.0, epsilon=0.0,
                               warm_start=True, error_feedback=True, start_step=START))
    sizes = [int(np.prod(s)) for s in SHAPES]
    m = build_method(cfg, SimGroup(WORLD, NetworkModel.from_cfg(cfg.network)), sizes, torch.device("cpu"),
                     shapes=SHAPES)
    m.qs.update(qs)
    out = []
    for s in range(STEPS):
        grads = [torch.cat([c.reshape(-1) for c in coefs(s, r)]) for r in range(WORLD)]
        ctx = StepContext(step=s, epoch=0.0, lr=0.1, lr_decayed=False, compute_s=0.0, samples=WORLD)
        out.append(m.step(grads, ctx).grad)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("matrix_rank", RANKS)
def test_same_as_torch_powersgd_hook(torch_results, matrix_rank):
    mine = ours(matrix_rank, torch_initial_qs(torch_results[0][matrix_rank]["layout"], matrix_rank))
    for rank in range(WORLD):
        theirs = torch_results[rank][matrix_rank]["grads"]
        for s in range(STEPS):
            torch.testing.assert_close(mine[s], theirs[s], rtol=1e-4, atol=1e-5, msg=f"step {s}, rank {rank}")
    plain = sum(torch.cat([c.reshape(-1) for c in coefs(STEPS - 1, r)]) for r in range(WORLD)) / WORLD
    assert (mine[-1] - plain).abs().max() > 0.1          # compressed steps are not plain averages
