"""Progress display and optional Weights & Biases logging; both do nothing when off or not rank 0."""
from __future__ import annotations

import sys
import threading

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
            tty = sys.stderr.isatty()
            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, mininterval=0.2 if tty else 10.0)
        if cfg.name == "wandb":
            import wandb  # imported only when asked for: it is slow and optional
            self.wandb = wandb.init(project=cfg.project, entity=cfg.entity or None, mode=cfg.mode,
                                    config=config, dir=run_dir, reinit=True)

    def start_at(self, step: int) -> None:
        if self.bar is not None:
            self.bar.update(step)

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
