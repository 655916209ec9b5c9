"""Errors a user can cause: the entry point prints their one-line message, never a traceback."""


class UserError(Exception):
    """Base class for expected mistakes (missing data, memory too small, diverged run...)."""


class DivergedError(UserError):
    """A NaN or Inf appeared in the loss or a gradient."""


class WorkerFailed(UserError):
    """A distributed worker died or raised; the message names the rank."""


class Interrupted(UserError):
    """The run was stopped by SIGINT/SIGTERM at a step boundary and checkpointed."""
