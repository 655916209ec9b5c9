"""The one training loop, for every method, model and backend.

Each step: every local worker computes its gradient on its own batch (timed) -> the method
compensates, compresses, communicates and averages (timed and modelled) -> one optimizer step on
the shared weights -> a record. The simulated cluster runs its N workers one after another on
the same weights; a torch.distributed process runs one. Rank 0 alone writes results.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from gravac.loop.checkpoint import Checkpointer, StopFlag, stop_note
from gravac.cluster.clock import Clock
from gravac.cluster.comm import Group
from gravac.data import load_dataset
from gravac.core.errors import DivergedError, Interrupted, UserError
from gravac.loop.evaluate import Evaluator
from gravac.loop.heartbeat import beat
from gravac.methods import RunStats, StepContext, build_method, method_class
from gravac.models import build_model, count_parameters
from gravac.loop.scale import paper_warning
from gravac.core.schema import RunConfig, TrainCfg
from gravac.loop.summary import Summary
from gravac.loop.workers import Workers


def lr_at(cfg: TrainCfg, step: int) -> float:
    """Multi-step schedule lr × gamma^(milestones passed), scaled by (step + 1) / warmup_steps during
    a linear warm-up (Goyal et al. 2017): deep models such as ResNet101 diverge at first without it."""
    warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
    return cfg.lr * warm * cfg.gamma ** sum(step >= m for m in cfg.milestones)


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
    clock: Clock
    total: int                 # steps of the whole run
    spe: int                   # steps per epoch (of one worker's shard)
    prev_step_s: float | None = None   # the last step's time on the run's clock (GraVAC's T_system)

    def state_dict(self, net) -> dict:
        """All state a resumed run needs to continue exactly as an uninterrupted one."""
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                "method": self.method.state_dict(), "workers": self.workers.state_dict(),
                "summary": self.summary.state_dict(), "net_beta": net.beta_Bps, "rng": torch.get_rng_state(),
                "prev_step_s": self.prev_step_s, "clock": self.clock.state_dict()}

    def load_state_dict(self, state: dict, net) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.method.load_state_dict(state["method"])
        self.workers.load_state_dict(state["workers"])
        self.summary.load_state_dict(state["summary"])
        net.beta_Bps = state["net_beta"]
        torch.set_rng_state(state["rng"])
        self.prev_step_s = state.get("prev_step_s")
        if "clock" in state:
            self.clock.load_state_dict(state["clock"])


def build(cfg: RunConfig, group: Group, device: torch.device, say) -> Parts:
    """Data, model, workers, method, optimizer, evaluator and summary for this process."""
    torch.manual_seed(cfg.train.seed)
    dataset = load_dataset(cfg.dataset)
    model = build_model(cfg.model, dataset.num_classes, dataset.task, getattr(dataset, "image_size", None)).to(device)
    workers = Workers(cfg.train, cfg.cluster, model, dataset, group, device)
    workers.check_memory(method_class(cfg.method.name).state_bytes(cfg.method, cfg.compressor, workers.numel,
                                                                   cfg.train.momentum))
    clock = Clock.build(cfg, workers, group, say)
    method = build_method(cfg, group, workers.sizes, device, buckets=clock.buckets, costs=clock.costs,
                          shapes=workers.shapes, profile=clock.profile)
    say(f"model {cfg.model.name}: {count_parameters(model):,} parameters; dataset {dataset.name} "
        f"({dataset.train_size:,} train {'tokens' if dataset.task == 'lm' else 'samples'}); "
        f"{group.world} workers ({cfg.cluster.backend}, {torch.get_num_threads()} thread(s) per process); "
        f"method {cfg.method.name}"
        + (f" + {cfg.compressor.name}" if cfg.compressor.name != "none" else ""))
    momentum = method.optimizer_momentum     # DGC's momentum correction keeps momentum in its memory
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr, momentum=momentum,
                          weight_decay=cfg.train.weight_decay, nesterov=cfg.train.nesterov and momentum > 0)
    spe = workers.steps_per_epoch
    total = math.ceil(cfg.train.epochs * spe) if cfg.train.epochs > 0 else cfg.train.steps
    evaluator = Evaluator(cfg.train, dataset, model, group, device)
    summary = Summary(cfg, dataset, count_parameters(model), total, group.net, evaluator.metric, clock)
    summary.steps_per_epoch = spe
    return Parts(dataset, model, workers, method, opt, evaluator, summary, clock, total, spe)


def start_step(cfg: RunConfig, parts: Parts, net, ckpt: Checkpointer | None, writer, say) -> int:
    """Resume from the latest checkpoint (dropping later records), or calibrate a fresh run."""
    start = ckpt.latest_step() if ckpt and cfg.experiment.resume else None
    if cfg.experiment.resume and ckpt and start is None:   # never restart a run silently from step 0
        raise UserError(f"cannot resume {cfg.experiment.resume}: it has no checkpoint")
    if start is not None:
        if start > parts.total:
            raise UserError(f"cannot resume {cfg.experiment.resume}: its checkpoint is at step {start}, beyond "
                            f"this command's {parts.total} steps; give train.steps >= {start} (or drop it)")
        parts.load_state_dict(ckpt.load(start), net)
        writer.truncate(start)
        say(f"resumed at step {start} from {cfg.experiment.resume}")
        return start
    if cfg.network.enabled and cfg.network.comm_ratio > 0:
        compute = parts.clock.profile.compute_s
        net.calibrate(4 * parts.workers.numel, parts.workers.group.world, compute, cfg.network.comm_ratio)
        say(f"network calibrated: dense all-reduce = {cfg.network.comm_ratio} x compute "
            f"({compute * 1e3:.1f} ms) -> {net.beta_Bps * 8 / 1e9:.4g} Gbit/s")
    return 0


def explain(method, writer, spe: int) -> tuple[str | None, dict | None]:
    """The method's one-line account of what it did over the whole run and its own summary figures
    (on the writing process)."""
    records = writer.records()
    if not records:
        return None, None
    stats = RunStats(records, spe)
    return method.explain(stats), method.summarize(stats)


class Cadence:
    """What happens after a step besides the record: evaluations and checkpoints, on schedule."""

    def __init__(self, cfg: RunConfig, parts: Parts, writer, tracker, save):
        self.cfg, self.parts, self.writer, self.tracker, self.save = cfg, parts, writer, tracker, save

    def after(self, step: int) -> None:
        done, total, t = step + 1, self.parts.total, self.cfg.train
        if done % t.eval_every == 0 or done == total:
            summary = self.parts.summary
            ev = self.parts.evaluator.run(done, summary)
            summary.add_eval(ev)
            self.writer.eval(ev)
            self.tracker.eval(ev)
            self.writer.summary(summary.as_dict("running"))
        if t.checkpoint_every and (done % t.checkpoint_every == 0 or done == total):  # the last lets a run be extended
            self.save(done)


def train(cfg: RunConfig, group: Group, device: torch.device, writer, tracker_factory, say=print,
          ckpt: Checkpointer | None = None, resume_cmd: str = "") -> dict:
    """Train to the configured length (continuing from the latest checkpoint when resuming)."""
    parts = build(cfg, group, device, say)
    workers, method, opt, summary = parts.workers, parts.method, parts.opt, parts.summary
    net = group.net
    start = start_step(cfg, parts, net, ckpt, writer, say)
    prof = parts.clock.profile        # this process runs its local workers one after another
    for line in paper_warning(cfg, len(group.local_ranks) * prof.compute_s + prof.optimizer_s, parts.total - start):
        say(line)

    def save(step: int) -> None:
        if ckpt is not None:
            ckpt.save(step, parts.state_dict(net))

    tracker = tracker_factory(parts.total, writer.dir)
    tracker.start_at(start)
    cadence = Cadence(cfg, parts, writer, tracker, save)
    writer.summary(summary.as_dict("running"))
    status = "failed"
    with StopFlag() as stop:   # around the except clauses too: a third signal does not cut their records short
        try:
            for step in range(start, parts.total):
                beat(group.local_ranks[0], 2 * step)      # step started
                lr = lr_at(cfg.train, step)
                for g in opt.param_groups:
                    g["lr"] = lr
                comp = workers.compute(step, stop.requested)
                loss = comp.loss
                if not math.isfinite(loss):
                    raise DivergedError(f"step {step}: loss is {loss} (method={cfg.method.name}); "
                                        "lower train.lr or enable train.grad_clip")
                ctx = StepContext(step=step, epoch=step / parts.spe, lr=lr,
                                  lr_decayed=step > 0 and lr < lr_at(cfg.train, step - 1),
                                  compute_s=parts.clock.compute_s(comp), samples=group.world * cfg.train.batch_size,
                                  prev_step_s=parts.prev_step_s)
                res = method.step(comp.grads, ctx)
                t0 = time.perf_counter()
                workers.apply(res.grad, step, cfg.method.name)
                opt.step()
                record = parts.clock.record(ctx, comp, res, parts.spe, summary.wall_s(), time.perf_counter() - t0)
                parts.prev_step_s = record[parts.clock.decision_key]
                summary.add_step(record)
                writer.step(record)
                if cfg.clock.record_ready:
                    writer.ready(parts.clock.ready_record(step, comp))
                cadence.after(step)
                tracker.step(record, {"loss": f"{loss:.3f}", parts.evaluator.metric: summary.last_metric_str(),
                                      "cf": f"{res.cf:.4g}"})
                if comp.stop and step + 1 < parts.total:
                    # Every worker saw the request in this step's exchange. The step's batch is
                    # already drawn (loaders, RNG and BatchNorm moved on), so finish it and save at
                    # the next boundary: resuming from there is exact.
                    save(step + 1)
                    raise Interrupted(f"interrupted at step {step + 1}; checkpoint saved", resume_cmd)
            status = "completed"
            summary.explanation, summary.method_summary = explain(method, writer, parts.spe)
            writer.save_model(parts.model.state_dict())
        except DivergedError as e:
            status = "diverged"
            summary.error = str(e)
            raise
        except Interrupted as e:
            status = "interrupted"
            summary.error, summary.resume_command = str(e), e.resume
            raise
        except (KeyboardInterrupt, OSError) as e:
            if isinstance(e, OSError) and not stop.aborted:   # results cannot be written (full disk, read-only, ...)
                where = e.filename or writer.dir
                summary.error = f"cannot write {where}: {e.strerror or e}"
                raise UserError(f"{summary.error}; free space or fix permissions, then resume from the last "
                                f"checkpoint: {resume_cmd}") from None
            # a second signal: torch.save reports a write it cut short as an OSError, not a full disk
            status = "interrupted"
            saved = ckpt.resumable_step() if ckpt is not None else None
            what = "aborted by a second signal" if stop.aborted else "interrupted"
            summary.error = stop_note(what, summary.steps, saved)
            summary.resume_command = resume_cmd if saved is not None else None
            raise Interrupted(summary.error, summary.resume_command or "") from None
        finally:
            tracker.close()
            try:
                writer.summary(summary.as_dict(status))
            except OSError:   # still cannot write: the error above says why
                pass
    return summary.as_dict(status)
