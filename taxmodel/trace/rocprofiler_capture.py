"""``taxmodel profile --tracer rocprofiler``: capture through AMD's rocprofiler-sdk, where it can.

What rocprofiler-sdk ships for Python (ROCm 7, rocprofiler-sdk ``source/lib/python``):
- ``rocpd``: reads and converts rocpd databases (``rocpd.connect(paths)``);
- ``rocprofiler``: ``rocprofiler.profile(metrics=[...])`` collects *hardware counters* per
  dispatch -- its records carry no timestamps, so no timeline can be built from them;
- ``roctx``: ROCTx ranges and ``profilerPause``/``profilerResume`` for a running rocprofv3.
A kernel *trace* comes only from ``rocprofv3`` (the tool library preloaded into the process),
which writes its database when the process exits -- after the runtime needs the events. So an
in-process tracer with ``start``/``stop``/``export`` cannot be built on these packages today.
:func:`available` says exactly why, and the ``rocprofiler`` tracer refuses to start with that
reason and the alternatives: ``--tracer torch`` (torch.profiler records HIP kernels on ROCm
builds of PyTorch, as it does CUDA kernels), or running the ranks under
``rocprofv3 --kernel-trace --hip-runtime-trace --memory-copy-trace --marker-trace
--output-format rocpd`` and importing the ``*_results.db`` files with ``taxmodel import``.

When rocprofiler-sdk gains an in-process trace API, :func:`_trace_api` is the one place to
detect it and :class:`RocprofilerTracer` the one class to complete.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from taxmodel.errors import UnavailableError
from taxmodel.trace.tracer import Tracer, register_tracer

INSTEAD = ("use --tracer torch (torch.profiler records HIP kernels on ROCm and CUDA kernels on NVIDIA), or run the "
           "ranks under `rocprofv3 --kernel-trace --hip-runtime-trace --memory-copy-trace --marker-trace "
           "--output-format rocpd` and `taxmodel import` the *_results.db files")


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except Exception:  # the SDK's modules load shared libraries and raise more than ImportError
        return False


def _trace_api() -> Any | None:
    """The rocprofiler-sdk Python object that records a kernel timeline in-process, if any.

    The ``rocprofiler`` module's ``profile`` records counters only (CounterRecord has no start
    or end time), so none exists yet."""
    return None


def available() -> str | None:
    """None when capture through rocprofiler-sdk works here, else the reason it does not."""
    if not _importable("rocpd") and not _importable("rocprofiler"):
        return "rocprofiler-sdk's Python packages (modules `rocpd`, `rocprofiler`) are not importable here"
    if _trace_api() is None:
        return ("rocprofiler-sdk's Python API cannot record a kernel timeline inside a running process "
                "(module `rocprofiler` collects counters without timestamps; rocprofv3 writes its trace at process exit)")
    return None


@register_tracer
class RocprofilerTracer(Tracer):
    """Tracer registry entry for rocprofiler-sdk; refuses to start where :func:`available`
    gives a reason (today: everywhere), naming what to use instead."""

    name = "rocprofiler"
    file_suffix = ".db"

    @staticmethod
    def unavailable_reason() -> str | None:
        reason = available()
        return None if reason is None else f"{reason}; {INSTEAD}"

    def __init__(self, device: Any) -> None:
        reason = self.unavailable_reason()
        if reason:
            raise UnavailableError(f"tracer 'rocprofiler' is not available: {reason}")
        super().__init__(device)

    def start(self) -> None:  # pragma: no cover - needs an in-process rocprofiler trace API
        raise UnavailableError(f"tracer 'rocprofiler': no in-process trace API; {INSTEAD}")

    def stop(self) -> None:  # pragma: no cover
        raise UnavailableError(f"tracer 'rocprofiler': no in-process trace API; {INSTEAD}")

    def export(self) -> bytes:  # pragma: no cover
        raise UnavailableError(f"tracer 'rocprofiler': no in-process trace API; {INSTEAD}")

    @staticmethod
    def read(paths: Sequence[Path]) -> tuple[pd.DataFrame, dict]:
        """rocpd databases (what rocprofv3 writes) -> events, through the rocpd importer."""
        from taxmodel.trace import rocpd

        return rocpd.read([Path(p) for p in paths])
