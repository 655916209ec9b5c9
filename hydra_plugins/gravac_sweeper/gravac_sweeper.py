"""gravac-bench's sweeper: Hydra's basic grid sweeper whose batches go through gravac.run.sweep.Plan,
so that duplicate cells, thread counts, stops and the closing report work under every launcher
(in-process, joblib, submitit). Hydra accepts plug-in classes only from the hydra_plugins package."""
from pathlib import Path
from typing import Any, List

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf


class GravacSweeper(BasicSweeper):
    """The grid of discrete choices, as BasicSweeper expands it, run by gravac.run.sweep.Plan."""

    def sweep(self, arguments: List[str]) -> Any:
        from gravac.run.sweep import Plan
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides(self._parse_config() + list(arguments))
        batches = self.split_arguments(overrides, self.max_batch_size)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")

        def load(job_overrides):
            return self.hydra_context.config_loader.load_sweep_config(self.config, job_overrides)
        return Plan(self.launcher, load, str(sweep_dir), total=sum(map(len, batches))).run(batches)
