"""Run one benchmark job (or a sweep with -m): `python bench/run.py [group=option] [key=value]`.

Hydra composes conf/; gravac.config turns the result into a checked RunConfig; gravac.launch
starts the workers (simulated in-process, spawned torch.distributed processes, or torchrun's).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a plain checkout too, not only after `pip install -e .`

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from gravac.config import (ConfigError, build_config, check_composition, check_overrides, help_text,  # noqa: E402
                           register_base, same_run_line, sweep_key)
from gravac.errors import Interrupted, UserError  # noqa: E402

CONF_DIR = os.path.join(ROOT, "conf")


FAILED: list[str] = []   # jobs of a sweep that failed; the sweep goes on and exits non-zero
DONE: dict[str, tuple[int, list[str]]] = {}   # sweep: sweep_key of each job run -> (job number, overrides)


def repeats_earlier_job(run_cfg, num: int, overrides: list[str]) -> bool:
    """In a sweep, a job that is the same run as an earlier job (e.g. method=dense with another
    compressor) says so in one line and is skipped, leaving no results folder; it would repeat
    the earlier job's results, or its failure."""
    key = sweep_key(run_cfg)
    if key not in DONE:
        DONE[key] = (num, overrides)
        return False
    print(same_run_line(run_cfg, (num, overrides), DONE[key]))
    return True


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    """Build the typed config and run it; user errors end in one line and a non-zero exit."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    hc = HydraConfig.get()
    sweep = hc.mode == RunMode.MULTIRUN
    try:
        run_cfg = build_config(cfg, overrides=list(hc.overrides.task))
        if sweep and repeats_earlier_job(run_cfg, hc.job.num, list(hc.overrides.task)):
            return
        from gravac.launch import launch
        launch(run_cfg, overrides=list(hc.overrides.task))
        return
    except Interrupted as e:   # a stop the user asked for: a hint, not an error
        print(e.hint(), file=sys.stderr)
        sys.exit(130)  # a Ctrl-C ends the whole sweep
    except (ConfigError, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        if not sweep:
            sys.exit(2)
        FAILED.append(" ".join(hc.overrides.task))
    except KeyboardInterrupt:
        print("interrupted before the first step; nothing to resume", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        print(help_text(CONF_DIR))
        sys.exit(0)
    try:
        check_overrides(sys.argv[1:], CONF_DIR)
        register_base()
        if not any(a in ("--hydra-help", "--info") or a.startswith("--cfg") for a in sys.argv[1:]):
            check_composition(sys.argv[1:], CONF_DIR)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    main()
    if FAILED:
        print(f"error: {len(FAILED)} job(s) of the sweep failed: " + "; ".join(FAILED), file=sys.stderr)
        sys.exit(2)
