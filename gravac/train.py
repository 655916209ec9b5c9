"""The one training loop, for every method, model and backend.

Each step: every local worker computes its gradient on its own batch (timed) -> the method
compensates, compresses, communicates and averages (timed and modelled) -> one optimizer step on
the shared weights -> a record. The simulated cluster runs its N workers one after another on
the same weights; a torch.distributed process runs one. Rank 0 alone writes results.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
import torch

from gravac.checkpoint import Checkpointer, StopFlag
from gravac.comm import Group
from gravac.data import load_dataset
from gravac.errors import DivergedError, Interrupted
from gravac.evaluate import Evaluator
from gravac.methods import StepContext, build_method, method_state_bytes
from gravac.models import build_model, count_parameters
from gravac.schema import RunConfig
from gravac.summary import Summary
from gravac.workers import Workers


def lr_at(cfg: RunConfig, step: int) -> float:
    """Multi-step schedule: lr × gamma^(milestones passed)."""
    return cfg.train.lr * cfg.train.gamma ** sum(step >= m for m in cfg.train.milestones)


@dataclass
class Parts:
    """Everything a run is made of, built once from the config."""
    dataset: object
    model: torch.nn.Module
    workers: Workers
    method: object
    opt: torch.optim.Optimizer
    evaluator: Evaluator
    summary: Summary
    total: int                 # steps of the whole run
    spe: int                   # steps per epoch (of one worker's shard)

    def state_dict(self, net) -> dict:
        """All state a resumed run needs to continue exactly as an uninterrupted one."""
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                "method": self.method.state_dict(), "workers": self.workers.state_dict(),
                "summary": self.summary.state_dict(), "net_beta": net.beta_Bps, "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict, net) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.method.load_state_dict(state["method"])
        self.workers.load_state_dict(state["workers"])
        self.summary.load_state_dict(state["summary"])
        net.beta_Bps = state["net_beta"]
        torch.set_rng_state(state["rng"])


def build(cfg: RunConfig, group: Group, device: torch.device, say) -> Parts:
    """Data, model, workers, method, optimizer, evaluator and summary for this process."""
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
    evaluator = Evaluator(cfg, dataset, model, group, device)
    summary = Summary(cfg, dataset, count_parameters(model), total, group.net, evaluator.metric)
    summary.steps_per_epoch = spe
    return Parts(dataset, model, workers, method, opt, evaluator, summary, total, spe)


def train(cfg: RunConfig, group: Group, device: torch.device, writer, tracker_factory, say=print,
          ckpt: Checkpointer | None = None, resume_cmd: str = "") -> dict:
    """Train to the configured length (continuing from the latest checkpoint when resuming)."""
    parts = build(cfg, group, device, say)
    workers, method, opt, summary, evaluator = parts.workers, parts.method, parts.opt, parts.summary, parts.evaluator
    total, spe, net = parts.total, parts.spe, group.net
    start = ckpt.latest_step() if ckpt and cfg.experiment.resume else None
    if start is not None:
        parts.load_state_dict(ckpt.load(start), net)
        writer.truncate(start)
        say(f"resumed at step {start} from {cfg.experiment.resume}")
    else:
        start = 0
        if cfg.network.enabled and cfg.network.comm_ratio > 0:
            compute = workers.calibrate(cfg.network.calibrate_steps)
            net.calibrate(4 * workers.numel, group.world, compute, cfg.network.comm_ratio)
            say(f"network calibrated: dense all-reduce = {cfg.network.comm_ratio} x compute "
                f"({compute * 1e3:.1f} ms) -> {net.beta_Bps * 8 / 1e9:.4g} Gbit/s")

    def save(step: int) -> None:
        if ckpt is not None:
            ckpt.save(step, parts.state_dict(net))

    tracker = tracker_factory(total, writer.dir)
    tracker.start_at(start)
    writer.summary(summary.as_dict("running"))
    status = "failed"
    step = start
    try:
        with StopFlag() as stop:
            for step in range(start, total):
                lr = lr_at(cfg, step)
                for g in opt.param_groups:
                    g["lr"] = lr
                grads, compute_s, loss, stop_now = workers.compute(step, stop.requested)
                if stop_now:  # every worker saw the request at this same step boundary
                    save(step)
                    raise Interrupted(f"interrupted at step {step}; checkpoint saved. Resume with:\n  {resume_cmd}")
                if not math.isfinite(loss):
                    raise DivergedError(f"step {step}: loss is {loss} (method={cfg.method.name}); "
                                        "lower train.lr or enable train.grad_clip")
                ctx = StepContext(step=step, epoch=step / spe, lr=lr,
                                  lr_decayed=step > 0 and lr < lr_at(cfg, step - 1), compute_s=compute_s,
                                  samples=group.world * cfg.train.batch_size)
                res = method.step(grads, ctx)
                workers.apply(res.grad, step, cfg.method.name)
                opt.step()
                step_model = compute_s + res.compress_s + res.comm.modelled_s
                step_wall = compute_s + res.compress_s + res.comm.measured_s
                record = {"step": step, "epoch": round(step / spe, 6), "loss": loss, "lr": lr, "cf": res.cf,
                          "floats_sent": res.floats_sent, "wire_bytes": res.comm.wire_bytes,
                          "compute_s": compute_s, "compress_s": res.compress_s, "comm_s": res.comm.measured_s,
                          "comm_model_s": res.comm.modelled_s, "step_model_s": step_model,
                          "step_wall_s": step_wall, "time_s": summary.wall_s(), **res.extra}
                summary.add_step(record)
                writer.step(record)
                if (step + 1) % cfg.train.eval_every == 0 or step + 1 == total:
                    ev = evaluator.run(step + 1, summary)
                    summary.add_eval(ev)
                    writer.eval(ev)
                    tracker.eval(ev)
                    writer.summary(summary.as_dict("running"))
                tracker.step(record, {"loss": f"{loss:.3f}", evaluator.metric: summary.last_metric_str(),
                                      "cf": f"{res.cf:.4g}"})
                every = cfg.train.checkpoint_every
                if every and ((step + 1) % every == 0 or step + 1 == total):  # the last lets a run be extended
                    save(step + 1)
        status = "completed"
        writer.save_model(parts.model.state_dict())
    except DivergedError as e:
        status = "diverged"
        summary.error = str(e)
        raise
    except Interrupted as e:
        status = "interrupted"
        summary.error = str(e).splitlines()[0]
        raise
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        tracker.close()
        writer.summary(summary.as_dict(status))
    return summary.as_dict(status)
