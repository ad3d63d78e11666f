"""A tracer: one way of recording a rank (start, stop, export its raw trace) and of reading the
gathered raw traces back as events; and the registry of tracers by name, which
``taxmodel profile --tracer NAME`` chooses from. Implementations register themselves
(``capture.TorchTracer``, ``rocprofiler_capture.RocprofilerTracer``); import ``taxmodel.trace.capture``
to have the built-in ones registered."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from taxmodel.errors import UnavailableError


class Tracer:
    """One way of recording a rank. Subclasses implement ``start``/``stop``/``export`` (on every
    rank) and ``read`` (on rank 0, over all ranks' exported files of one repetition)."""

    name: str = ""
    file_suffix: str = ".json.gz"

    def __init__(self, device: Any) -> None:
        self.device = device

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def export(self) -> bytes:
        """This rank's raw trace of the last session."""
        raise NotImplementedError

    @staticmethod
    def read(paths: Sequence[Path]) -> tuple[pd.DataFrame, dict]:
        raise NotImplementedError

    def __enter__(self) -> "Tracer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


TRACERS: dict[str, type[Tracer]] = {}


def register_tracer(cls: type[Tracer]) -> type[Tracer]:
    """Make a tracer available to ``taxmodel profile --tracer NAME``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    TRACERS[cls.name] = cls
    return cls


def get_tracer(name: str) -> type[Tracer]:
    if name not in TRACERS:
        raise UnavailableError(f"unknown tracer '{name}'; available: {', '.join(sorted(TRACERS))}")
    reason = getattr(TRACERS[name], "unavailable_reason", lambda: None)()
    if reason:
        raise UnavailableError(f"tracer '{name}' is not available here: {reason}")
    return TRACERS[name]
