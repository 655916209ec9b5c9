"""Run one benchmark job (or a sweep with -m): `python bench/run.py [group=option] [key=value]`.

Hydra composes conf/; gravac.config.compose turns the result into a checked RunConfig; gravac.run.launch
starts the workers (simulated in-process, spawned torch.distributed processes, or torchrun's).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a plain checkout too, not only after `pip install -e .`

import hydra  # noqa: E402

from gravac.core.registry import PluginError  # noqa: E402
from gravac.run import sweep  # noqa: E402
from gravac.config.cli import check_composition, check_overrides, help_text  # noqa: E402
from gravac.config.compose import ConfigError, expand_seeds, register_base  # noqa: E402
from gravac.config.plugins import registries  # noqa: E402

CONF_DIR = os.path.join(ROOT, "conf")
# jobs started elsewhere (joblib workers, SLURM jobs) find gravac and the sweeper plug-in too
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])

# the task function lives in gravac.run.sweep: jobs in other processes import it from there
main = hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")(sweep.job)


def cli() -> int:
    """Check the command line in one line per mistake, then run (or sweep); the exit code."""
    try:
        registries()   # the built-in and the user's plug-ins, loaded before anything reads them
        if any(a in ("--help", "-h") for a in sys.argv[1:]):
            print(help_text(CONF_DIR))
            return 0
        sys.argv[1:] = expand_seeds(sys.argv[1:])   # experiment.seeds=N: N seed replicas
        check_overrides(sys.argv[1:], CONF_DIR)
        register_base()
        if not any(a in ("--hydra-help", "--info") or a.startswith("--cfg") for a in sys.argv[1:]):
            check_composition(sys.argv[1:], CONF_DIR)
    except (ConfigError, PluginError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    main()
    return sweep.finish(sweep.LAST)   # a sweep's closing report; 0 after a single run


if __name__ == "__main__":
    try:
        sys.exit(cli())
    except KeyboardInterrupt:   # a run stops itself; this is a Ctrl-C before it began, or one aborting a sweep
        print(sweep.ABORTED if sweep.LAST is not None else "interrupted before the run started; nothing to resume",
              file=sys.stderr)
        sys.exit(130)
