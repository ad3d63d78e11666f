"""Errors a user can act on. The CLI prints their message on one line and exits with ``exit_code``."""
from __future__ import annotations


class TaxmodelError(Exception):
    """Base class: the message says what went wrong and what to do next."""

    exit_code = 2


class InputError(TaxmodelError):
    """A file given on the command line cannot be used (missing, truncated, not a trace...)."""


class BundleError(TaxmodelError):
    """A profile bundle is malformed: the message names the offending field."""


class AnalysisError(TaxmodelError):
    """The data cannot be analyzed as asked (iterations that do not match across ranks...)."""


class RunError(TaxmodelError):
    """A workload run failed: a rank crashed, hung, or a kernel gave up waiting on a flag."""

    exit_code = 3


class UnavailableError(TaxmodelError):
    """An optional capability (a tracer, a GPU, a vendor library) is not present here."""


class Interrupted(KeyboardInterrupt):
    """The command was stopped by a signal: Ctrl-C, or SIGTERM / SIGHUP (a CI cancel, ``timeout``,
    a batch system's preemption), handled alike. Exit code 128 + the signal's number (130 for
    SIGINT, 143 for SIGTERM), as shells report it, never 1 (which ``compare`` uses for a regression).
    A KeyboardInterrupt, so code that cleans up after Ctrl-C cleans up after these too."""

    def __init__(self, signum: int = 2, message: str = "interrupted") -> None:
        super().__init__(message)
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
