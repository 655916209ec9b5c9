"""The warning a paper-scale model preset gets, before its first step, when it runs far from the
paper's setting (on a CPU, or with fewer workers than the paper): how long the run will take and
what differs. The paper's setting is declared on the model's registry entry (`paper=`, and the
CPU-scale study of its family as `cpu_preset=`; see gravac/models/paper.py).

Why the loss of `model=resnet101` climbs on 4 workers (2.6 -> 18 -> 39 in its first three steps
at lr 0.1): the paper's lr 0.1 goes with a global batch of 1024, and at 128 the averaged gradient is
noisier; and torchvision's default init gives this 101-layer network on 32 px inputs a gradient
norm of 1972 at step 0 (1855 of it the stem conv1; measured on a CIFAR-10 batch of 32, seed 0).
At the linearly scaled lr 0.0125 (= 0.1 x 128/1024) the loss still climbs (2.6 -> 6.2 in 8 dense
steps), and even a linear warm-up does not stop it (5-8 by step 60 at lr < 0.004). With
torchvision's zero-gamma init (`model.zero_init_residual=true`, Goyal et al. 2017) the gradient
norm at init is 17.9 and lr 0.0125 trains stably from the first step.
"""
from __future__ import annotations

from gravac.core.schema import RunConfig
from gravac.models.registry import MODELS


def paper_setting(run: RunConfig) -> dict | None:
    """The paper's setting declared for the run's model (workers, batch_size, lr, device), or None."""
    return MODELS.load()[run.model.name].spec.paper


def _global_batches(run: RunConfig, paper: dict) -> tuple[int, int]:
    """(this run's global batch, the paper's)."""
    return run.cluster.workers * run.train.batch_size, paper["workers"] * paper["batch_size"]


def paper_gap(run: RunConfig) -> list[str]:
    """What of device, workers and global batch differs from the paper's setting; [] when the model
    has none, or the run has the paper's device and at least its workers (nothing to warn about)."""
    paper = paper_setting(run)
    c, t = run.cluster, run.train
    if paper is None or (c.device == paper["device"] and c.workers >= paper["workers"]):
        return []
    gaps = [f"device {c.device} (paper: {paper['device']})"] if c.device != paper["device"] else []
    if c.workers != paper["workers"]:
        gaps.append(f"{c.workers} workers (paper: {paper['workers']})")
    batch, paper_batch = _global_batches(run, paper)
    if batch != paper_batch:
        gaps.append(f"global batch {batch} at lr {t.lr:g} (paper: {paper_batch} at lr {paper['lr']:g})")
    return gaps


def duration(seconds: float) -> str:
    """A human-sized duration: 45 s, 12 min, 3.4 h, 2.1 days."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 3 * 86400 else f"{seconds / 86400:.1f} days"


def paper_warning(run: RunConfig, step_s: float, steps: int) -> list[str]:
    """Two warning lines for a paper preset far from the paper's setting ([] otherwise): what
    differs, the estimated time of `steps` steps of `step_s` seconds, and what to run instead."""
    gaps = paper_gap(run)
    if not gaps:
        return []
    entry = MODELS.load()[run.model.name]
    instead = f"{entry.spec.cpu_preset} (its CPU-scale study)" if entry.spec.cpu_preset else "a smaller model"
    return [f"warning: model={run.model.name} is a paper-scale preset, here with {'; '.join(gaps)}: about "
            f"{duration(step_s * steps)} for {steps} steps ({step_s:.1f} s a step, from the device profile)",
            f"warning: {lr_note(run)}on a CPU run {instead}, or cluster.device=cuda on GPUs; going on"]


def lr_note(run: RunConfig) -> str:
    """When the global batch is smaller than the paper's, why the loss may climb at first and the
    linearly scaled learning rate (see the module docstring); else ""."""
    paper, t = paper_setting(run), run.train
    batch, paper_batch = _global_batches(run, paper)
    scaled = paper["lr"] * batch / paper_batch
    if batch >= paper_batch or t.lr <= scaled * (1 + 1e-9):
        return ""
    return (f"lr {paper['lr']:g} is the paper's for a global batch of {paper_batch}; at {batch} the averaged "
            f"gradient is noisier and the loss can climb at first (train.lr={scaled:.3g} scales it linearly); ")
