"""The local workers of one process: their data shards, their gradients, and the shared weights.

Gradients live in one flat buffer per worker; before a worker's backward pass the parameters'
`.grad` are pointed at views of its buffer, so backward writes the flat gradient directly (no
copy), and after the method averages, `.grad` is pointed at the averaged flat tensor for the
optimizer. In the simulated cluster BatchNorm running statistics are those of worker 0, as
torch's DDP does by broadcasting rank 0's buffers.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gravac.cluster.comm import Group
from gravac.core.errors import DivergedError, UserError
from gravac.loop.faults import maybe_fail
from gravac.loop.heartbeat import beat
from gravac.cluster.profile import measure_profile
from gravac.core.schema import ClusterCfg, TrainCfg


@dataclass
class Computed:
    """One step's gradients and what computing them took (per worker where it says so)."""
    grads: list[torch.Tensor]
    compute_s: float                 # slowest worker's forward + backward, measured
    loss: float                      # mean over workers
    stop: bool                       # some worker was asked to stop
    forward_s: list[float]           # per worker
    backward_s: list[float]          # per worker
    ready_s: list[list[float]]       # per worker, per parameter: gradient ready, from backward start


class Workers:
    """Per-worker loaders, hidden states and gradient buffers around one model."""

    def __init__(self, train: TrainCfg, cluster: ClusterCfg, model: torch.nn.Module, dataset, group: Group,
                 device: torch.device):
        self.train, self.cluster = train, cluster
        self.model, self.dataset, self.group, self.device = model, dataset, group, device
        self.lm = dataset.task == "lm"
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.sizes = [p.numel() for p in self.params]
        self.shapes = [tuple(p.shape) for p in self.params]
        self.numel = sum(self.sizes)
        self._check_bytes(len(group.local_ranks), 0)   # a lower bound first: before building N shards
        per = dataset.train_size // group.world
        if per < train.batch_size:   # cheap necessary condition; the loaders check the exact one
            raise UserError(f"{dataset.name}: a shard of {per} samples ({dataset.train_size} over {group.world} "
                            f"workers) holds no full batch of {train.batch_size}: lower train.batch_size or "
                            "cluster.workers")
        self.loaders = [dataset.train_loader(r, group.world, train.batch_size, train.seed)
                        for r in group.local_ranks]
        self.steps_per_epoch = self.loaders[0].steps_per_epoch
        self.hidden: list = [None] * len(self.loaders)
        self.buffers: list[torch.Tensor] | None = None   # allocated after the memory check

    # --- memory ------------------------------------------------------------------------------
    def check_memory(self, method_bytes_per_worker: int) -> None:
        """Refuse a simulated cluster whose per-worker state would not fit, before allocating it."""
        self._check_bytes(len(self.loaders), method_bytes_per_worker)
        self.buffers = [torch.zeros(self.numel, device=self.device) for _ in self.loaders]
        self._stamp_hooks()

    def _check_bytes(self, n_local: int, method_bytes_per_worker: int) -> None:
        need = n_local * (4 * self.numel + method_bytes_per_worker) + 4 * 4 * self.numel
        limit = self.cluster.max_memory_gb * 2**30 or 0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if need > limit:
            raise UserError(
                f"the {n_local}-worker cluster needs about {need / 2**30:.1f} GiB for gradients and per-worker "
                f"state of {self.numel:,} parameters, over the {limit / 2**30:.1f} GiB limit; use fewer workers "
                "(cluster.workers=), a mini model (model=resnet_mini), or cluster=ddp")

    # --- gradients ---------------------------------------------------------------------------
    def _point_grads(self, flat: torch.Tensor) -> None:
        """Make every parameter's .grad a view into `flat` (same layout as the method sees)."""
        off = 0
        for p, n in zip(self.params, self.sizes):
            p.grad = flat[off: off + n].view_as(p)
            off += n

    def _forward_loss(self, x: torch.Tensor, y: torch.Tensor, hidden=None):
        """Cross-entropy of one batch; the LM also takes and returns its hidden state."""
        if not self.lm:
            return F.cross_entropy(self.model(x), y), None
        logits, hidden = self.model(x, hidden if hidden is not None else self.model.init_hidden(x.shape[1]))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)), hidden

    def _loss(self, w: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward pass of worker `w` on its batch; the LM carries its hidden state across steps."""
        hidden = self.hidden[w]
        if hidden is not None and not self.loaders[w].new_epoch:
            hidden = self.model.detach_hidden(hidden)
        else:
            hidden = None  # a new epoch starts from a fresh state
        loss, self.hidden[w] = self._forward_loss(x, y, hidden)
        return loss

    def _stamp_hooks(self) -> None:
        """Record, during each backward, when every parameter's gradient is ready (the overlap
        timeline's input). One Python call per parameter: within the loop's overhead budget."""
        self._stamps = [0.0] * len(self.params)
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda _p, i=i: self._stamps.__setitem__(i, time.perf_counter()))

    def compute(self, step: int, stop: bool = False) -> Computed:
        """Every local worker's flat gradient, the cluster's compute time (slowest), forward and
        gradient-ready times, mean loss, and whether any worker was asked to stop (so all stop at
        the same step)."""
        self.model.train()
        rows, saved = [], None
        for w, loader in enumerate(self.loaders):
            x, y = loader.next_batch()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            buf = self.buffers[w]
            t0 = time.perf_counter()
            buf.zero_()
            self._point_grads(buf)
            loss = self._loss(w, x, y)
            if maybe_fail(self.group.local_ranks[w], step):
                loss = loss * float("nan")
            t_fwd = time.perf_counter()
            loss.backward()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            t1 = time.perf_counter()
            rows.append([t1 - t0, float(loss.detach()), float(stop), t_fwd - t0, t1 - t_fwd,
                         *(st - t_fwd for st in self._stamps)])
            if w == 0 and len(self.loaders) > 1:
                saved = [b.detach().clone() for b in self.model.buffers()]
        if saved is not None:  # BatchNorm statistics follow worker 0, as DDP's broadcast_buffers
            for b, s in zip(self.model.buffers(), saved):
                b.copy_(s)
        beat(self.group.local_ranks[0], 2 * step + 1)   # local work done: now waiting for the peers
        rows = self.group.bookkeeping(rows)
        return Computed(self.buffers, max(r[0] for r in rows), sum(r[1] for r in rows) / len(rows),
                        any(r[2] for r in rows), [r[3] for r in rows], [r[4] for r in rows],
                        [r[5:] for r in rows])

    def apply(self, avg: torch.Tensor, step: int, method: str) -> None:
        """Clip and check the averaged gradient, then hand it to the optimizer via .grad."""
        clip = self.train.grad_clip
        total = float(avg.norm()) if clip > 0 else float(avg.sum())
        if not torch.isfinite(torch.tensor(total)):
            raise DivergedError(f"step {step}: averaged gradient contains NaN/Inf (method={method}); "
                                "lower train.lr or enable train.grad_clip")
        if clip > 0 and total > clip:
            avg.mul_(clip / total)
        self._point_grads(avg)

    def measure_profile(self, repeats: int) -> dict:
        """Worker 0's forward, backward, per-parameter ready and optimizer-step seconds on fresh
        batches (median of `repeats` after a warm-up), leaving no trace: a separate loader, the
        model's buffers, the RNG and the weights are as before (gravac/cluster/profile.py)."""
        saved = [b.detach().clone() for b in self.model.buffers()]
        rng = torch.get_rng_state()
        loader = self.dataset.train_loader(self.group.local_ranks[0], self.group.world,
                                           self.train.batch_size, self.train.seed + 7777)
        buf = torch.zeros(self.numel, device=self.device)
        shadow = [p.detach().clone() for p in self.params]      # the optimizer step runs on copies
        for q, p in zip(shadow, self.params):
            q.grad = torch.zeros_like(p)
        opt = torch.optim.SGD(shadow, lr=0.1, momentum=self.train.momentum, weight_decay=self.train.weight_decay)
        self.model.train()

        def step_fn(mark):
            x, y = (t.to(self.device) for t in loader.next_batch())
            buf.zero_()
            self._point_grads(buf)
            loss, _ = self._forward_loss(x, y)
            mark()
            loss.backward()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        try:
            return measure_profile(step_fn, self.params, opt.step, repeats)
        finally:
            for b, s in zip(self.model.buffers(), saved):
                b.copy_(s)
            torch.set_rng_state(rng)

    def input_shape(self) -> list[int]:
        """Shape of one worker's input batch (part of a device profile's key)."""
        b = self.train.batch_size
        if self.lm:
            return [self.dataset.bptt, b]
        return [b, 3, self.dataset.image_size, self.dataset.image_size]

    # --- checkpoint support --------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Data positions and the LM's carried hidden states, per local worker."""
        return {"loaders": [ld.state_dict() for ld in self.loaders], "hidden": self.hidden}

    def load_state_dict(self, state: dict) -> None:
        for ld, s in zip(self.loaders, state["loaders"]):
            ld.load_state_dict(s)
        self.hidden = [None if h is None else tuple(t.to(self.device) for t in h) for h in state["hidden"]]
