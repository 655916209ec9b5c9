"""The one training loop, for every method, model and backend.

Each step: every local worker computes its gradient on its own batch (timed) -> the method
compensates, compresses, communicates and averages (timed and modelled) -> one optimizer step on
the shared weights -> a record. The simulated cluster runs its N workers one after another on
the same weights; a torch.distributed process runs one. Rank 0 alone writes results.
"""
from __future__ import annotations

import math
import time

import torch

from gravac.comm import Group
from gravac.data import load_dataset
from gravac.errors import DivergedError
from gravac.evaluate import Evaluator
from gravac.methods import StepContext, build_method, method_state_bytes
from gravac.models import build_model, count_parameters
from gravac.netmodel import NetworkModel
from gravac.schema import RunConfig
from gravac.summary import Summary
from gravac.workers import Workers


def lr_at(cfg: RunConfig, step: int) -> float:
    """Multi-step schedule: lr × gamma^(milestones passed)."""
    return cfg.train.lr * cfg.train.gamma ** sum(step >= m for m in cfg.train.milestones)


def train(cfg: RunConfig, group: Group, device: torch.device, writer, tracker_factory, say=print) -> dict:
    """Train to the configured length and return the summary (also written by rank 0)."""
    torch.manual_seed(cfg.train.seed)
    dataset = load_dataset(cfg.dataset)
    model = build_model(cfg.model, dataset.num_classes, dataset.task).to(device)
    workers = Workers(cfg, model, dataset, group, device)
    workers.check_memory(method_state_bytes(cfg, workers.numel))
    method = build_method(cfg, group, workers.sizes, device)
    say(f"model {cfg.model.name}: {count_parameters(model):,} parameters; dataset {dataset.name} "
        f"({dataset.train_size:,} train {'tokens' if dataset.task == 'lm' else 'samples'}); "
        f"{group.world} workers ({cfg.cluster.backend}); method {cfg.method.name}"
        + (f" + {cfg.compressor.name}" if cfg.compressor.name != "none" else ""))

    momentum = 0.0 if cfg.compressor.momentum_correction else cfg.train.momentum  # DGC moves it into memory
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr, momentum=momentum,
                          weight_decay=cfg.train.weight_decay, nesterov=cfg.train.nesterov and momentum > 0)
    spe = workers.steps_per_epoch
    total = math.ceil(cfg.train.epochs * spe) if cfg.train.epochs > 0 else cfg.train.steps
    net = group.net
    if cfg.network.enabled and cfg.network.comm_ratio > 0:
        compute = workers.calibrate(cfg.network.calibrate_steps)
        net.calibrate(4 * workers.numel, group.world, compute, cfg.network.comm_ratio)
        say(f"network calibrated: dense all-reduce = {cfg.network.comm_ratio} x compute "
            f"({compute * 1e3:.1f} ms) -> {net.beta_Bps * 8 / 1e9:.4g} Gbit/s")
    use_model_time = cfg.network.enabled and cfg.network.time_source != "wall"

    evaluator = Evaluator(cfg, dataset, model, group, device)
    summary = Summary(cfg, dataset, count_parameters(model), total, net, evaluator.metric)
    summary.steps_per_epoch = spe
    tracker = tracker_factory(total, writer.dir)
    writer.summary(summary.as_dict("running"))
    status = "failed"
    try:
        for step in range(total):
            lr = lr_at(cfg, step)
            for g in opt.param_groups:
                g["lr"] = lr
            grads, compute_s, loss = workers.compute(step)
            if not math.isfinite(loss):
                raise DivergedError(f"step {step}: loss is {loss} (method={cfg.method.name}); "
                                    "lower train.lr or enable train.grad_clip")
            ctx = StepContext(step=step, epoch=step / spe, lr=lr,
                              lr_decayed=step > 0 and lr < lr_at(cfg, step - 1), compute_s=compute_s,
                              samples=group.world * cfg.train.batch_size)
            res = method.step(grads, ctx)
            workers.apply(res.grad, step, cfg.method.name)
            opt.step()
            comm_wall = res.comm.measured_s
            step_model = compute_s + res.compress_s + res.comm.modelled_s
            step_wall = compute_s + res.compress_s + comm_wall
            record = {"step": step, "epoch": round(step / spe, 6), "loss": loss, "lr": lr, "cf": res.cf,
                      "floats_sent": res.floats_sent, "wire_bytes": res.comm.wire_bytes,
                      "compute_s": compute_s, "compress_s": res.compress_s, "comm_s": comm_wall,
                      "comm_model_s": res.comm.modelled_s, "step_model_s": step_model,
                      "step_wall_s": step_wall, **res.extra}
            summary.add_step(record, step_model if use_model_time else step_wall)
            writer.step(record)
            if (step + 1) % cfg.train.eval_every == 0 or step + 1 == total:
                ev = evaluator.run(step + 1, summary)
                summary.add_eval(ev)
                writer.eval(ev)
                tracker.eval(ev)
                writer.summary(summary.as_dict("running"))
            tracker.step(record, {"loss": f"{loss:.3f}", evaluator.metric: summary.last_metric_str(),
                                  "cf": f"{res.cf:.4g}"})
        status = "completed"
    except DivergedError as e:
        status = "diverged"
        summary.error = str(e)
        raise
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        tracker.close()
        writer.summary(summary.as_dict(status))
    return summary.as_dict(status)
