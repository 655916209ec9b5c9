"""What every compression hook shares: the state base class (process group, one Slot per bucket,
step count, cross-rank option check), the hook factory `make_hook`, and `compressor_cfg`, the
checked compressor config of a hook's keywords. The hooks themselves: gravac/hooks/hooks.py.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from typing import Callable

import torch
import torch.distributed as dist

from compressors import COMPRESSORS, COUNT_BYTES, ErrorFeedback, Payload, from_config
from compressors.base import mix_seed
from gravac.core.registry import option
from gravac.core.check import checked
from gravac.cluster.comm import half_wire, pack_sparse, packed_mean, sparse_mean, unpack_sparse
from gravac.methods.base import CompressingMethod, step_seed

def compressor_cfg(name: str, **values):
    """The registered compressor `name`'s config filled with `values`; a wrong name, option,
    type or value raises one ValueError line saying what is valid (gravac.core.check.checked)."""
    if name not in COMPRESSORS:
        raise ValueError(f"unknown compressor {name!r}; choose one of: {', '.join(COMPRESSORS.names())}")
    cls = COMPRESSORS[name].config
    valid = sorted(f.name for f in fields(cls) if f.name != "name")
    bad = sorted(set(values) - set(valid))
    if bad:
        raise ValueError(f"unknown option(s) {', '.join(bad)} for compressor {name!r}; valid: {', '.join(valid)}")
    return checked(cls, {"name": name, **values}, "compressor")


@dataclass
class HookOptions:
    """The states' own keywords, declared and checked like config fields."""
    seed: int = 0
    momentum: float = option(0.0, check=lambda v: 0 <= v < 1, valid="in [0, 1)")
    batch_size: int = option(1, check=lambda v: v >= 1, valid=">= 1")


@dataclass
class Slot:
    """One bucket's state: its layout (parameter sizes, dtype), compressor and residual."""
    layout: tuple
    sizes: list[int]
    compressor: object
    memory: ErrorFeedback


class CompressionState:
    """What every compression hook shares: the process group, one Slot per bucket, the step
    count, and what each step sent (`last`, `floats_total`)."""

    def __init__(self, process_group, comp_cfg, *, seed: int = 0, momentum: float = 0.0):
        if process_group is None:
            if not dist.is_initialized():
                raise ValueError("no process group: call torch.distributed.init_process_group first, "
                                 "or pass one")
            process_group = dist.group.WORLD
        opts = checked(HookOptions, {"seed": seed, "momentum": momentum}, type(self).__name__)
        self.group, self.rank, self.world = process_group, process_group.rank(), process_group.size()
        self.comp_cfg, self.seed, self.momentum = comp_cfg, opts.seed, opts.momentum
        self.agreed = self.world == 1            # options checked across ranks (at the first bucket)
        # comp_cfg None: a state that uses no registered compressor (COVAP, gravac/hooks/covap_hook.py)
        self.memory_momentum = CompressingMethod.memory_momentum_of(comp_cfg, self.momentum) if comp_cfg else 0.0
        self.per_rank_seed = bool(comp_cfg) and COMPRESSORS[comp_cfg.name].target.from_config(comp_cfg).per_rank_seed
        self.slots: dict[int, Slot] = {}
        self.iteration = 0
        self.last: dict | None = None
        self.floats_total = 0.0
        self._reset_step()

    def _reset_step(self) -> None:
        self._floats, self._wire, self._numel = 0.0, 0, 0

    def slot(self, bucket) -> Slot:
        """The bucket's Slot, built afresh when DDP changed the bucket's layout."""
        grads = bucket.gradients()
        sizes = [g.numel() for g in grads]
        buf = bucket.buffer()
        if sum(sizes) != buf.numel():
            raise ValueError(f"bucket {bucket.index()} holds {buf.numel()} elements but its gradients "
                             f"{sum(sizes)}: padded buckets are not supported")
        layout = (tuple(sizes), buf.dtype, buf.device)
        s = self.slots.get(bucket.index())
        if s is None or s.layout != layout:
            memory = ErrorFeedback(buf.numel(), device=buf.device, dtype=buf.dtype,
                                   enabled=self.comp_cfg.error_feedback, momentum=self.memory_momentum)
            s = Slot(layout, sizes, from_config(self.comp_cfg, sizes), memory)
            self.slots[bucket.index()] = s
        return s

    def options(self) -> dict:
        """Everything that must be the same on every rank: the state's kind, the compressor and
        its options, the seed (a seeded compressor draws the same positions on every rank from it;
        one that draws per rank mixes in the rank itself) and the momentum."""
        out = {"state": type(self).__name__, "seed": self.seed, "momentum": self.momentum}
        if self.comp_cfg is not None:
            out["compressor"] = self.comp_cfg.name
            out.update((f.name, getattr(self.comp_cfg, f.name)) for f in fields(self.comp_cfg) if f.name != "name")
        return out

    def agree(self, bucket) -> None:
        """Once, before the first bucket is sent: all-gather a hash of options(); where ranks
        differ (their collectives would not match: a hang, a gloo abort, or model copies drifting
        apart), gather the options themselves and raise one ValueError line naming the option."""
        self.agreed = True
        text = json.dumps(self.options(), sort_keys=True, default=repr).encode()
        digest = int.from_bytes(hashlib.sha256(text).digest()[:8], "little", signed=True)
        rows = [r.tolist() for r in
                _allgather(self.group, self.world, torch.tensor([digest, len(text)], device=bucket.buffer().device))]
        if all(r[0] == digest for r in rows):
            return
        buf = torch.zeros(max(r[1] for r in rows), dtype=torch.uint8, device=bucket.buffer().device)
        buf[:len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        every = [json.loads(bytes(b[:r[1]].tolist())) for b, r in zip(_allgather(self.group, self.world, buf), rows)]
        raise ValueError(differing_options(every, type(self).__name__))

    def seed_for(self, index: int, level: int = 0) -> int:
        """Seed of bucket `index` at this step and `level`: common to all ranks unless the
        compressor draws per rank (as the methods' seed_for, with a per-bucket run seed)."""
        return step_seed(mix_seed(self.seed, index), self.iteration, level,
                         self.rank + 1 if self.per_rank_seed else 0)

    def begin(self, bucket) -> None:
        """Called before every bucket (a state that decides per step resolves its decision here)."""

    def choose(self, slot: Slot, grad: torch.Tensor, bucket) -> Payload:
        """The payload to send for this bucket; updates the residual to what it leaves out."""
        raise NotImplementedError

    def end_step(self) -> None:
        """After the last bucket: record what the step sent, count the step."""
        self.last = {"step": self.iteration, "floats_sent": self._floats, "wire_bytes": self._wire,
                     "numel": self._numel, "cf": self._numel / self._floats}
        self.floats_total += self._floats
        self.iteration += 1
        self._reset_step()

    # --- communication -------------------------------------------------------------------------
    def send(self, p: Payload, out: torch.Tensor) -> torch.futures.Future:
        """Start averaging `p` over all ranks; the Future yields `out` holding the mean."""
        self._numel += out.numel()
        if getattr(p, "packed", False):
            return self._allgather_packed(p, out)
        if getattr(p, "half", False):
            return self._allreduce_half(p, out)
        if p.indices is None:
            return self._allreduce(p.values, out, lambda mean: out.copy_(mean))
        if p.shared:
            def scatter(mean):
                out.zero_()
                return out.index_copy_(0, p.indices, mean)
            return self._allreduce(p.values, out, scatter, k=p.nnz)
        return self._allgather(p, out)

    def _allreduce(self, t: torch.Tensor, out: torch.Tensor, finish: Callable, k: int | None = None):
        """All-reduce `t` (its values are consumed), then finish(mean)."""
        n = t.numel() if k is None else k
        self._floats += n
        self._wire += n * t.element_size()
        world = self.world
        fut = self.group.allreduce([t]).get_future()
        return fut.then(lambda f: finish(f.value()[0].div_(world)))

    def _allreduce_half(self, p, out: torch.Tensor):
        """All-reduce of a 16-bit cast payload divided by the world size before the sum, cast back
        (the Method's Group.aggregate_half, so the bucket's mean is the same bit for bit)."""
        self._floats += p.floats
        self._wire += p.wire_bytes()
        fut = self.group.allreduce([half_wire(p, self.world)]).get_future()
        return fut.then(lambda f: out.copy_(f.value()[0]))

    def _allgather_packed(self, p, out: torch.Tensor):
        """All-gather of a quantized payload's bytes (the same size on every rank: no count, no
        padding); every rank's payload decoded and averaged as the Method does (packed_mean)."""
        buf = p.to_bytes()
        bufs = [torch.empty_like(buf) for _ in range(self.world)]
        self._floats += p.floats
        self._wire += buf.numel()
        world = self.world
        return self.group.allgather([bufs], [buf]).get_future().then(
            lambda f: out.copy_(packed_mean(f.value(), p, world)))

    def _allgather(self, p: Payload, out: torch.Tensor):
        """Padded all-gather of a sparse payload: counts first (blocking, see the module
        docstring), then the values and indices of every rank in one buffer."""
        count = torch.tensor([p.nnz], dtype=torch.int64, device=p.values.device)
        counts = [torch.zeros_like(count) for _ in range(self.world)]
        self.group.allgather([counts], [count]).wait()
        counts_l = [int(c.item()) for c in counts]
        padded = max(1, max(counts_l))
        buf = pack_sparse(p, padded)
        bufs = [torch.empty_like(buf) for _ in range(self.world)]
        self._floats += sum(counts_l) / self.world
        self._wire += buf.numel() + COUNT_BYTES
        world, numel = self.world, p.numel

        def finish(f):
            values, indices = unpack_sparse(f.value(), counts_l, padded, p)
            return out.copy_(sparse_mean(values, indices, numel, world))
        return self.group.allgather([bufs], [buf]).get_future().then(finish)


def _allgather(group, world: int, t: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(world)]
    group.allgather([out], [t]).wait()
    return out


def differing_options(every: list[dict], state: str) -> str:
    """One line naming the options that differ between ranks (`every`: each rank's options),
    with rank 0's value and those of (up to 3) ranks that differ from it."""
    parts = []
    for k in dict.fromkeys(k for opts in every for k in opts):
        values = [json.dumps(opts.get(k, "(not given)")) for opts in every]
        odd = [r for r, v in enumerate(values) if v != values[0]]
        if odd:
            shown = ", ".join(f"rank {r}: {values[r]}" for r in [0, *odd[:3]]) + (", ..." if len(odd) > 3 else "")
            parts.append(f"{k} ({shown})")
    seed = " (the seed too: a seeded compressor draws the same positions on every rank from it)" \
        if any(p.startswith("seed ") for p in parts) else ""
    return (f"hook options differ between ranks: {'; '.join(parts)}; give every rank's {state} the same "
            f"options{seed}")


def make_hook(state_cls: type) -> Callable:
    """The DDP comm hook for states of `state_cls`: per bucket begin, choose, send; end_step
    after the last bucket."""
    def hook(state, bucket):
        if not isinstance(state, state_cls):
            raise TypeError(f"this hook needs a {state_cls.__name__}, got {type(state).__name__}")
        if not state.agreed:
            state.agree(bucket)
        state.begin(bucket)
        buf = bucket.buffer()
        p = state.choose(state.slot(bucket), buf, bucket)
        fut = state.send(p, buf)
        if bucket.is_last():
            state.end_step()
        return fut
    hook.__name__ = hook.__qualname__ = f"{state_cls.__name__[:-5].lower()}_hook"
    # real objects, not strings: register_comm_hook compares the annotations with these
    hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    hook.__doc__ = f"DDP comm hook of {state_cls.__name__} (see gravac.hooks)."
    return hook
