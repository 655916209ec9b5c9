"""The training loop every method, model and backend shares: train, workers, evaluation,
checkpoints, run files (results, summary), tracking, heartbeats, fault injection and scale warnings."""
