"""Periodic evaluation on the full eval split: top-1/top-5 accuracy or perplexity.

In a torch.distributed run every rank evaluates its share of the split with rank 0's BatchNorm
statistics and the sums are gathered, so the result equals a single-process evaluation.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from gravac.cluster.comm import Group
from gravac.core.schema import TrainCfg


class Evaluator:
    """Computes the run's metric; `metric` names it and `higher_is_better` orders it."""

    def __init__(self, train: TrainCfg, dataset, model: torch.nn.Module, group: Group, device: torch.device):
        self.train, self.dataset, self.model, self.group, self.device = train, dataset, model, group, device
        self.lm = dataset.task == "lm"
        self.metric = train.target_metric
        self.higher_is_better = self.metric != "perplexity"

    @torch.no_grad()
    def _sums(self, rank: int, world: int) -> list[float]:
        """[loss sum, top-1 hits, top-5 hits, count] over this rank's share of the eval split."""
        loss = top1 = top5 = count = 0.0
        hidden = None
        bs = self.train.eval_batch_size if not self.lm else min(self.train.eval_batch_size, 10)
        for x, y in self.dataset.eval_batches(bs, rank, world):
            x, y = x.to(self.device), y.to(self.device)
            if self.lm:
                if hidden is None:
                    hidden = self.model.init_hidden(x.shape[1])
                logits, hidden = self.model(x, hidden)
                logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
            else:
                logits = self.model(x)
            loss += float(F.cross_entropy(logits, y, reduction="sum"))
            if not self.lm:
                k = min(5, logits.shape[1])
                pred = logits.topk(k, dim=1).indices
                hits = pred.eq(y[:, None])
                top1 += float(hits[:, 0].sum())
                top5 += float(hits.any(dim=1).sum())
            count += y.numel()
        return [loss, top1, top5, count]

    def run(self, step: int, summary) -> dict:
        """Evaluate now and return the eval record (step, metric values, seconds taken)."""
        t0 = time.perf_counter()
        self.group.broadcast_tensors([b for b in self.model.buffers()])
        self.model.eval()
        if self.group.world > 1 and len(self.group.local_ranks) == 1:  # ddp: each rank its share
            rows = self.group.bookkeeping([self._sums(self.group.local_ranks[0], self.group.world)])
        else:
            rows = [self._sums(0, 1)]
        loss, top1, top5, count = (sum(r[i] for r in rows) for i in range(4))
        self.model.train()
        rec = {"step": step, "epoch": round(step / max(1, summary.steps_per_epoch), 6), "loss": loss / count}
        if self.lm:
            rec["perplexity"] = math.exp(min(loss / count, 50.0))
        else:
            rec["top1"], rec["top5"] = top1 / count, top5 / count
        rec["metric"] = rec[self.metric]
        rec["eval_s"] = time.perf_counter() - t0
        return rec
