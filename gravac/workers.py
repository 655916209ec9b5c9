"""The local workers of one process: their data shards, their gradients, and the shared weights.

Gradients live in one flat buffer per worker; before a worker's backward pass the parameters'
`.grad` are pointed at views of its buffer, so backward writes the flat gradient directly (no
copy), and after the method averages, `.grad` is pointed at the averaged flat tensor for the
optimizer. In the simulated cluster BatchNorm running statistics are those of worker 0, as
torch's DDP does by broadcasting rank 0's buffers.
"""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn.functional as F

from gravac.comm import Group
from gravac.errors import DivergedError, UserError
from gravac.faults import maybe_fail
from gravac.schema import ClusterCfg, TrainCfg


class Workers:
    """Per-worker loaders, hidden states and gradient buffers around one model."""

    def __init__(self, train: TrainCfg, cluster: ClusterCfg, model: torch.nn.Module, dataset, group: Group,
                 device: torch.device):
        self.train, self.cluster = train, cluster
        self.model, self.dataset, self.group, self.device = model, dataset, group, device
        self.lm = dataset.task == "lm"
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        self.loaders = [dataset.train_loader(r, group.world, train.batch_size, train.seed)
                        for r in group.local_ranks]
        self.steps_per_epoch = self.loaders[0].steps_per_epoch
        self.hidden: list = [None] * len(self.loaders)
        self.buffers: list[torch.Tensor] | None = None   # allocated after the memory check

    # --- memory ------------------------------------------------------------------------------
    def check_memory(self, method_bytes_per_worker: int) -> None:
        """Refuse a simulated cluster whose per-worker state would not fit, before allocating it."""
        n_local = len(self.loaders)
        need = n_local * (4 * self.numel + method_bytes_per_worker) + 4 * 4 * self.numel
        limit = self.cluster.max_memory_gb * 2**30 or 0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if need > limit:
            raise UserError(
                f"the {n_local}-worker cluster needs about {need / 2**30:.1f} GiB for gradients and per-worker "
                f"state of {self.numel:,} parameters, over the {limit / 2**30:.1f} GiB limit; use fewer workers "
                "(cluster.workers=), a mini model (model=resnet_mini), or cluster=ddp")
        self.buffers = [torch.zeros(self.numel, device=self.device) for _ in self.loaders]

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

    def compute(self, step: int, stop: bool = False) -> tuple[list[torch.Tensor], float, float, bool]:
        """Every local worker's flat gradient, the cluster's compute time (slowest), mean loss,
        and whether any worker was asked to stop (so all stop at the same step)."""
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
            loss.backward()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            rows.append([time.perf_counter() - t0, float(loss.detach()), float(stop)])
            if w == 0 and len(self.loaders) > 1:
                saved = [b.detach().clone() for b in self.model.buffers()]
        if saved is not None:  # BatchNorm statistics follow worker 0, as DDP's broadcast_buffers
            for b, s in zip(self.model.buffers(), saved):
                b.copy_(s)
        rows = self.group.bookkeeping(rows)
        return (self.buffers, max(r[0] for r in rows), sum(r[1] for r in rows) / len(rows),
                any(r[2] for r in rows))

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

    def calibrate(self, steps: int) -> float:
        """Median forward+backward seconds of worker 0 on fresh batches, leaving no trace.

        Used to size a comm_ratio network before training; the model's buffers are restored
        and a separate loader is used, so the run itself is unchanged.
        """
        saved = [b.detach().clone() for b in self.model.buffers()]
        loader = self.dataset.train_loader(self.group.local_ranks[0], self.group.world,
                                           self.train.batch_size, self.train.seed + 7777)
        buf = torch.zeros(self.numel, device=self.device)
        times = []
        self.model.train()
        for _ in range(steps + 1):
            x, y = (t.to(self.device) for t in loader.next_batch())
            t0 = time.perf_counter()
            buf.zero_()
            self._point_grads(buf)
            loss, _ = self._forward_loss(x, y)
            loss.backward()
            times.append(time.perf_counter() - t0)
        for b, s in zip(self.model.buffers(), saved):
            b.copy_(s)
        local = statistics.median(times[1:])  # the first pass pays one-off allocation costs
        rows = self.group.bookkeeping([[local]] * len(self.loaders))
        return max(r[0] for r in rows)

    # --- checkpoint support --------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Data positions and the LM's carried hidden states, per local worker."""
        return {"loaders": [ld.state_dict() for ld in self.loaders], "hidden": self.hidden}

    def load_state_dict(self, state: dict) -> None:
        for ld, s in zip(self.loaders, state["loaders"]):
            ld.load_state_dict(s)
        self.hidden = [None if h is None else tuple(t.to(self.device) for t in h) for h in state["hidden"]]
