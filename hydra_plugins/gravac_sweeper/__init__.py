"""Hydra sweeper plug-in of gravac-bench (conf/hydra/sweeper/gravac.yaml, the default sweeper)."""
