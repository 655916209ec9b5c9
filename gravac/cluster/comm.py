"""The communication layer: the only code that talks to other workers.

A Group hosts one or more *local* workers: the simulated cluster hosts all N in one process, a
torch.distributed process hosts one. Every collective takes one tensor (or payload) per local
worker and returns the cluster-wide result, so methods are written once for both backends. Each
call also reports what a worker put on the wire and what the network model says it cost.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from compressors import COUNT_BYTES, Payload  # COUNT_BYTES: the int64 count sent before a sparse all-gather
from gravac.cluster.netmodel import NetworkModel


@dataclass
class CommStats:
    """What collectives cost a worker: gradient elements it contributed (mean over all workers,
    the same number on every backend), bytes it sent, modelled and measured seconds, and the
    modelled seconds of each message in order (the overlap timeline schedules them one by one)."""
    wire_bytes: int = 0
    modelled_s: float = 0.0
    measured_s: float = 0.0
    floats: float = 0.0
    messages: list = field(default_factory=list)

    def __add__(self, other: "CommStats") -> "CommStats":
        return CommStats(self.wire_bytes + other.wire_bytes, self.modelled_s + other.modelled_s,
                         self.measured_s + other.measured_s, self.floats + other.floats,
                         self.messages + other.messages)

    def __iadd__(self, other: "CommStats") -> "CommStats":
        return self + other


def sparse_mean(values: Sequence[torch.Tensor], indices: Sequence[torch.Tensor], numel: int,
                world: int) -> torch.Tensor:
    """Dense mean of sparse contributions, added in rank order exactly as every backend does."""
    out = torch.zeros(numel, dtype=values[0].dtype, device=values[0].device)
    for v, i in zip(values, indices):
        out.index_add_(0, i, v)
    return out.div_(world)


def index_dtype(p: Payload) -> torch.dtype:
    """The integer type of p's indices on the wire (int32 when every position fits)."""
    return torch.int32 if p.index_bytes() == 4 else torch.int64


def pack_sparse(p: Payload, padded: int) -> torch.Tensor:
    """p's values (in their own dtype) then its indices, as the bytes of one buffer padded to
    `padded` entries, so every rank of a gloo all-gather sends the same size."""
    vb, ib = p.values.element_size(), p.index_bytes()
    buf = torch.zeros(padded * (vb + ib), dtype=torch.uint8, device=p.values.device)
    buf[: p.nnz * vb] = p.values.contiguous().view(torch.uint8)
    buf[padded * vb: padded * vb + p.nnz * ib] = p.indices.to(index_dtype(p)).contiguous().view(torch.uint8)
    return buf


def unpack_sparse(bufs: Sequence[torch.Tensor], counts: Sequence[int], padded: int,
                  like: Payload) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's (values, int64 indices) from gathered `pack_sparse` buffers; padding is cut
    off by the counts, so a padded slot never adds to a real index."""
    vb, ib, idx_dtype = like.values.element_size(), like.index_bytes(), index_dtype(like)
    values, indices = [], []
    for b, c in zip(bufs, counts):
        values.append(b[: c * vb].view(like.values.dtype))
        indices.append(b[padded * vb: padded * vb + c * ib].clone().view(idx_dtype).long())  # clone: aligned
    return values, indices


def half_wire(p, world: int) -> torch.Tensor:
    """What a worker puts into the 16-bit all-reduce of a cast payload (compressors/half.py): its
    16-bit values divided by the world size in 16 bits, before the sum (as torch's
    fp16_compress_hook), so the sum of N contributions cannot overflow where their mean would not."""
    return p.wire.div(world)


def packed_mean(bufs: Sequence[torch.Tensor], like, world: int) -> torch.Tensor:
    """Mean of every worker's packed payload (`QuantPayload.to_bytes`, rank order), each decoded
    with the layout of `like` and added in rank order, exactly as every backend does."""
    out = None
    for b in bufs:
        d = like.from_bytes(b).dense()
        out = d if out is None else out.add_(d)
    return out.div_(world)


class Group:
    """Interface of a group of workers; see SimGroup and DistGroup."""
    world: int               # total number of workers N
    local_ranks: list[int]   # ranks of the workers this process hosts
    is_main: bool            # this process hosts rank 0 and writes the results
    net: NetworkModel

    # --- primitives each backend implements -------------------------------------------------
    def _allreduce_sum(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def _allgather_sparse(self, payloads: list[Payload]) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        """All workers' (values, indices) in rank order, and the padded count every worker sent
        (the gathered values' lengths are every worker's count)."""
        raise NotImplementedError

    def _allgather_index(self, indices: list[torch.Tensor], index_dtype: torch.dtype) -> tuple[list[torch.Tensor], int]:
        """All workers' index tensors in rank order (int64), and the padded count every worker sent."""
        raise NotImplementedError

    def _allgather_bytes(self, bufs: list[torch.Tensor]) -> list[torch.Tensor]:
        """All workers' uint8 buffers in rank order; every worker's buffer has the same size."""
        raise NotImplementedError

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj`, on every worker (used for decisions taken on rank 0)."""
        raise NotImplementedError

    def _gather_rows(self, rows: list[list[float]]) -> list[list[float]]:
        """Every worker's row of a few numbers, in rank order (one row per local worker in)."""
        raise NotImplementedError

    def broadcast_tensors(self, tensors: list[torch.Tensor]) -> None:
        """Overwrite `tensors` in place with rank 0's values (e.g. BatchNorm buffers)."""

    def gather_floats(self, rows: list[list[float]]) -> tuple[list[list[float]], CommStats]:
        """All workers' rows of a few floats: for statistics a method decides on, so it counts.

        Methods that must take the same decision on every worker exchange their local numbers
        (norms, timings) this way and reduce them identically everywhere.
        """
        t0 = time.perf_counter()
        out = self._gather_rows(rows)
        nbytes = 8 * len(rows[0])
        m = self.net.allgather(nbytes, self.world)
        return out, CommStats(nbytes, m, time.perf_counter() - t0, messages=[m])

    def bookkeeping(self, rows: list[list[float]]) -> list[list[float]]:
        """All workers' rows for the run's own records (loss, timings): not part of any method's cost."""
        return self._gather_rows(rows)

    def slowest(self, *seconds: float) -> tuple[float, ...]:
        """For each value, the largest over all workers (a synchronous step waits for the slowest)."""
        rows = self.bookkeeping([list(seconds)])
        return tuple(max(r[i] for r in rows) for i in range(len(seconds)))

    def barrier(self) -> None:
        """Wait for every worker."""

    # --- collectives the methods use ---------------------------------------------------------
    def allreduce_mean(self, tensors: list[torch.Tensor],
                       bucket_elements: list[int] | None = None) -> tuple[torch.Tensor, CommStats]:
        """Mean over all workers of a dense tensor (one per local worker). `bucket_elements`: the
        modelled time is that of one all-reduce per bucket of these sizes, as DDP sends them (the
        values are reduced in one call: the sum is the same)."""
        t0 = time.perf_counter()
        out = self._allreduce_sum(tensors).div_(self.world)
        es = tensors[0].element_size()
        nbytes = tensors[0].numel() * es
        messages = [self.net.allreduce(n * es, self.world) for n in bucket_elements or [tensors[0].numel()]]
        return out, CommStats(nbytes, sum(messages), time.perf_counter() - t0, float(tensors[0].numel()), messages)

    def aggregate(self, payloads: list[Payload]) -> tuple[torch.Tensor, CommStats]:
        """Dense mean of every worker's payload, by the collective the payload kind needs.

        Dense payloads are all-reduced; shared-index payloads (same indices on every worker)
        all-reduce just their values; other sparse payloads go through a padded all-gather.
        Quantized (packed) payloads are all-gathered and decoded (`aggregate_packed`); 16-bit
        casts are all-reduced in 16 bits (`aggregate_half`).
        All workers must pass payloads of the same kind in the same step.
        """
        p = payloads[0]
        if getattr(p, "packed", False):
            return self.aggregate_packed(payloads)
        if getattr(p, "half", False):
            return self.aggregate_half(payloads)
        if p.indices is None:
            return self.allreduce_mean([q.values for q in payloads])
        if p.shared:
            vals, stats = self.allreduce_mean([q.values for q in payloads])
            out = torch.zeros(p.numel, dtype=vals.dtype, device=vals.device)
            out.index_copy_(0, p.indices, vals)
            return out, stats
        t0 = time.perf_counter()
        values, indices, padded = self._allgather_sparse(payloads)
        out = sparse_mean(values, indices, p.numel, self.world)
        per_elem = p.values.element_size() + p.index_bytes()
        nbytes = padded * per_elem
        messages = self.net.sparse_allgather(nbytes, self.world)     # the counts, then the padded payloads
        floats = sum(v.numel() for v in values) / self.world
        return out, CommStats(nbytes + COUNT_BYTES, sum(messages), time.perf_counter() - t0, floats, messages)


    def aggregate_packed(self, payloads) -> tuple[torch.Tensor, CommStats]:
        """Mean of quantized payloads (compressors/packed.py). Quantized values cannot be summed in
        their wire format (every worker has its own scales), so every worker's packed bytes are
        all-gathered, decoded and added in rank order. A payload's size follows from the layout
        alone, the same on every worker: no count, no padding, never an empty buffer. Floats are
        the payload's value-equivalents, wire bits / 32 (docs/DEFINITIONS.md)."""
        t0 = time.perf_counter()
        p = payloads[0]
        bufs = self._allgather_bytes([q.to_bytes() for q in payloads])
        out = packed_mean(bufs, p, self.world)
        nbytes = p.wire_bytes()
        m = self.net.allgather(nbytes, self.world)
        return out, CommStats(nbytes, m, time.perf_counter() - t0, p.floats, [m])

    def aggregate_half(self, payloads) -> tuple[torch.Tensor, CommStats]:
        """Mean of 16-bit cast payloads (compressors/half.py): every worker's values divided by
        the world size (`half_wire`), summed in 16 bits by one all-reduce, cast back to the
        gradient's dtype. Floats are wire bits / 32 (numel / 2); the modelled all-reduce moves 2
        bytes per value."""
        t0 = time.perf_counter()
        p = payloads[0]
        out = self._allreduce_sum([half_wire(q, self.world) for q in payloads]).to(p.dtype)
        nbytes = p.wire_bytes()
        m = self.net.allreduce(nbytes, self.world)
        return out, CommStats(nbytes, m, time.perf_counter() - t0, p.floats, [m])

    def allgather_indices(self, indices: list[torch.Tensor], numel: int) -> tuple[list[torch.Tensor], CommStats]:
        """Every worker's positions into a tensor of `numel` elements (one index tensor per local
        worker in), in rank order: counts first, then the indices padded to the largest count.

        For methods that agree on a union of positions before all-reducing values there (ExDyna,
        MiCRO). Indices travel as int32 when every position fits (as in sparse payloads); no
        gradient values move, so floats stay 0.
        """
        t0 = time.perf_counter()
        ib = 4 if numel < 2**31 else 8
        gathered, padded = self._allgather_index(indices, torch.int32 if ib == 4 else torch.int64)
        nbytes = padded * ib
        messages = self.net.sparse_allgather(nbytes, self.world)     # the counts, then the padded indices
        return gathered, CommStats(nbytes + COUNT_BYTES, sum(messages), time.perf_counter() - t0, 0.0, messages)


class SimGroup(Group):
    """N virtual workers in one process; collectives are computed as the real ones would be."""

    def __init__(self, world: int, net: NetworkModel):
        self.world = world
        self.local_ranks = list(range(world))
        self.is_main = True
        self.net = net

    def _allreduce_sum(self, tensors):
        out = tensors[0].clone()
        for t in tensors[1:]:
            out.add_(t)
        return out

    def _allgather_sparse(self, payloads):
        padded = max(p.nnz for p in payloads)
        return [p.values for p in payloads], [p.indices for p in payloads], padded

    def _allgather_index(self, indices, index_dtype):
        return [i.long() for i in indices], max(1, max(i.numel() for i in indices))

    def _allgather_bytes(self, bufs):
        return list(bufs)

    def broadcast_object(self, obj):
        return obj

    def _gather_rows(self, rows):
        return [list(r) for r in rows]


class DistGroup(Group):
    """One worker per process over torch.distributed (gloo on CPU, NCCL on GPU)."""

    def __init__(self, net: NetworkModel, device: torch.device):
        import torch.distributed as dist
        self._dist = dist
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        self.local_ranks = [self.rank]
        self.is_main = self.rank == 0
        self.net = net
        self.device = device

    def _allreduce_sum(self, tensors):
        (t,) = tensors
        out = t.clone()
        self._dist.all_reduce(out)
        return out

    def _allgather_sparse(self, payloads):
        """Gather counts, pad every worker's (values, indices) to the maximum, gather once.

        gloo needs equal sizes on every rank, and a zero-element collective has crashed it, so
        counts go first and every buffer holds at least one element. Values (in their own dtype,
        so float64 stays exact and fp16 sends 2 bytes) and int32/int64 indices travel as the bytes
        of one buffer; padding is cut off by the gathered counts, so a padded slot can never add
        to a real index.
        """
        (p,) = payloads
        dist, n = self._dist, self.world
        count = torch.tensor([p.nnz], dtype=torch.int64, device=self.device)
        counts = [torch.zeros_like(count) for _ in range(n)]
        dist.all_gather(counts, count)
        counts_l = [int(c.item()) for c in counts]
        padded = max(1, max(counts_l))
        buf = pack_sparse(p, padded)
        bufs = [torch.empty_like(buf) for _ in range(n)]
        dist.all_gather(bufs, buf)
        values, indices = unpack_sparse(bufs, counts_l, padded, p)
        return values, indices, padded

    def _allgather_index(self, indices, index_dtype):
        """Counts first, then every worker's indices padded to the largest count (at least one
        slot, as gloo has crashed on empty tensors); the padding is cut off by the counts."""
        (idx,) = indices
        dist, n = self._dist, self.world
        count = torch.tensor([idx.numel()], dtype=torch.int64, device=self.device)
        counts = [torch.zeros_like(count) for _ in range(n)]
        dist.all_gather(counts, count)
        counts_l = [int(c.item()) for c in counts]
        padded = max(1, max(counts_l))
        buf = torch.zeros(padded, dtype=index_dtype, device=self.device)
        buf[: idx.numel()] = idx.to(index_dtype)
        bufs = [torch.empty_like(buf) for _ in range(n)]
        dist.all_gather(bufs, buf)
        return [b[:c].long() for b, c in zip(bufs, counts_l)], padded

    def _allgather_bytes(self, bufs):
        """One all-gather of equal-sized uint8 buffers (packed payloads: at least one byte)."""
        (buf,) = bufs
        out = [torch.empty_like(buf) for _ in range(self.world)]
        self._dist.all_gather(out, buf)
        return out

    def broadcast_object(self, obj):
        box = [obj]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def _gather_rows(self, rows):
        (row,) = rows
        t = torch.tensor(row, dtype=torch.float64, device=self.device)
        out = [torch.empty_like(t) for _ in range(self.world)]
        self._dist.all_gather(out, t)
        return [o.tolist() for o in out]

    def broadcast_tensors(self, tensors):
        for t in tensors:
            self._dist.broadcast(t, src=0)

    def barrier(self):
        self._dist.barrier()
