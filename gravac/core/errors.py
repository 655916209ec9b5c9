"""Errors a user can cause: the entry point prints their one-line message, never a traceback."""


class UserError(Exception):
    """Base class for expected mistakes (missing data, memory too small, diverged run...)."""


class DivergedError(UserError):
    """A NaN or Inf appeared in the loss or a gradient."""


class WorkerFailed(UserError):
    """A distributed worker died or raised; the message names the rank. `why` is that part alone,
    without where the results are (the launcher drops a folder the run left empty)."""

    def __init__(self, message: str, why: str = ""):
        super().__init__(message)
        self.why = why or message


class Interrupted(UserError):
    """The run was stopped by SIGINT/SIGTERM at a step boundary and checkpointed; `resume` is the
    full command that continues it ("" when there is nothing to resume)."""

    def __init__(self, message: str, resume: str = ""):
        super().__init__(message)
        self.resume = resume

    def hint(self) -> str:
        """What the user reads: a stop is not an error, and the command goes on a line of its own
        so that it can be copied whole."""
        return f"{self}. Resume with:\n  {self.resume}" if self.resume else str(self)
