"""Progress display and optional Weights & Biases logging; both do nothing when off or not rank 0."""
from __future__ import annotations

import sys
import threading
import time

from gravac.core.schema import LoggerCfg


class Tracker:
    """Progress bar plus optional wandb run. Construct with enabled=False on non-main ranks."""

    def __init__(self, cfg: LoggerCfg, total: int, config: dict, run_dir: str | None, enabled: bool):
        self.bar = None
        self.wandb = None
        if not enabled:
            return
        if cfg.progress:
            from tqdm import tqdm
            # tqdm's default write lock includes a multiprocessing RLock, a named semaphore that a
            # ddp worker leaving by os._exit never unregisters ("leaked semaphore" at the end of
            # the run); one process draws the only bar, so a thread lock is all it needs
            tqdm.set_lock(threading.RLock())
            if sys.stderr.isatty():
                self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, mininterval=0.2)
            else:   # a log file: tqdm's carriage returns would make the whole run one line
                self.bar = LineProgress(total, cfg.progress_every_s)
        if cfg.name == "wandb":
            import wandb  # imported only when asked for: it is slow and optional
            self.wandb = wandb.init(project=cfg.project, entity=cfg.entity or None, mode=cfg.mode,
                                    config=config, dir=run_dir, reinit=True)

    def start_at(self, step: int) -> None:
        if self.bar is not None:
            getattr(self.bar, "start_at", self.bar.update)(step)

    def step(self, record: dict, postfix: dict) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(postfix, refresh=False)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=record["step"])

    def eval(self, record: dict) -> None:
        if self.wandb is not None:
            self.wandb.log({f"eval/{k}": v for k, v in record.items() if isinstance(v, (int, float))},
                           step=record["step"])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.wandb is not None:
            self.wandb.finish()


def duration(seconds: float) -> str:
    """"12 s", "4 min 46 s", "2 h 05 min"."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class LineProgress:
    """tqdm's update/set_postfix/close for a log file: one plain line every `every_s` seconds and at
    the last step, with the rate so far and the time the run still needs (ETA)."""

    def __init__(self, total: int, every_s: float, clock=time.monotonic, out=None):
        self.total, self.every_s, self.clock = total, every_s, clock
        self.out = out if out is not None else sys.stderr
        self.done = self.first = 0
        self.postfix: dict = {}
        self.t0 = self.last = clock()

    def start_at(self, step: int) -> None:
        """Steps done before a resume: they count toward the total, not the rate."""
        self.done = self.first = step
        self.t0 = self.last = self.clock()

    def update(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.every_s or self.done >= self.total:
            self.last = now
            self.out.write(self.line(now) + "\n")
            self.out.flush()

    def set_postfix(self, postfix: dict, refresh: bool = False) -> None:
        self.postfix = dict(postfix)

    def line(self, now: float) -> str:
        ran = self.done - self.first
        rate = (now - self.t0) / ran if ran else 0.0
        left = "" if self.done >= self.total else f", ETA {duration(rate * (self.total - self.done))}"
        extra = "".join(f", {k} {v}" for k, v in self.postfix.items())
        return f"step {self.done}/{self.total} ({100 * self.done / self.total:.0f}%), {rate:.3g} s/step{left}{extra}"

    def close(self) -> None:
        pass
