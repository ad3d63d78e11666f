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
