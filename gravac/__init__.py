"""gravac-bench: adaptive gradient compression methods, communication, training loop and results."""

__version__ = "0.1.0"
