"""Capture: record one rank's iterations with a tracer, and turn the gathered traces into events.

Recording stays apart from analysis: on every rank a tracer session wraps the timed loop and
exports its raw trace as bytes (gathered to rank 0 by the runtime, never through a shared
filesystem); on rank 0 the tracer's importer turns the raw files into schema events, and
``finish_events`` sets what only the capture knows: the repetition, each kernel's role from the
variant, and -- on CPU, where no GPU exists -- kernel rows made from the ranges that stand for
kernels.

CPU ("emulated GPU") captures: ``RankContext.kernel(name)`` records a
``record_function("kernel::<name>")`` range around work that runs synchronously, and gloo runs
each collective as a ``gloo:<op>`` range on its own thread. Those ranges become ``kernel`` rows
(device = rank; stream 0 for kernels, stream 1 for collectives, like a communication stream),
collectives with ``collective_op`` and ``collective_id`` = ``"<group>:<n>"`` (the n-th
collective on that rank: every rank issues the same collectives in the same order). The whole
pipeline (ledger, reports) then works on CPU bundles; meta marks them ``emulated_gpu``.

Tracers are pluggable by name (``tracer.register_tracer``); ``torch`` (torch.profiler / Kineto) is
built in here, ``rocprofiler`` in ``rocprofiler_capture``; importing this module registers both.
"""
from __future__ import annotations

import gzip
import os
import re
import tempfile
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from taxmodel.trace.tracer import TRACERS, Tracer, get_tracer, register_tracer  # noqa: F401  (the tracers' registry)
from taxmodel.vocabulary import is_comm_kernel, normalize_collective
from taxmodel.workload import classify_role

KERNEL_RANGE_PREFIX = "kernel::"  # the same prefix RankContext.kernel writes
COLLECTIVE_RANGE_PREFIX = "gloo:"
EMULATED_COMPUTE_STREAM = 0
EMULATED_COMM_STREAM = 1
DEFAULT_GROUP = "0"


@register_tracer
class TorchTracer(Tracer):
    """torch.profiler (Kineto): CPU ranges always, CUDA/HIP activity when the device is a GPU."""

    name = "torch"
    file_suffix = ".json.gz"

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.device(self.device).type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities, record_shapes=False, with_stack=False)
        self._prof.__enter__()

    def stop(self) -> None:
        self._prof.__exit__(None, None, None)

    def export(self) -> bytes:
        fd, tmp = tempfile.mkstemp(prefix="taxmodel-trace-", suffix=".json")
        os.close(fd)
        try:
            self._prof.export_chrome_trace(tmp)
            return gzip.compress(Path(tmp).read_bytes(), compresslevel=3)
        finally:
            os.unlink(tmp)

    @staticmethod
    def read(paths: Sequence[Path]) -> tuple[pd.DataFrame, dict]:
        from taxmodel.trace import kineto

        return kineto.read([Path(p) for p in paths])


# --- turning imported rows into what the ledger needs ------------------------------------------


def emulated_gpu_rows(events: pd.DataFrame) -> pd.DataFrame:
    """Replace the ``kernel::`` and ``gloo:`` ranges of a CPU capture by kernel rows (see module doc).

    Other rows are kept unchanged. Vectorized; rows need rank, kind, name, start_ns, end_ns.
    """
    events = events.copy()
    names = events["name"].astype(str)
    is_range = (events["kind"] == "marker").to_numpy()
    is_kernel = is_range & names.str.startswith(KERNEL_RANGE_PREFIX).to_numpy()
    is_coll = is_range & names.str.startswith(COLLECTIVE_RANGE_PREFIX).to_numpy()
    # Zero-length ranges (a kernel that did nothing measurable) still occupy one nanosecond.
    for mask in (is_kernel, is_coll):
        flat = mask & (events["end_ns"].to_numpy() <= events["start_ns"].to_numpy())
        if flat.any():
            events.loc[flat, "end_ns"] = events.loc[flat, "start_ns"] + 1
    gpu = is_kernel | is_coll
    events.loc[gpu, "kind"] = "kernel"
    events.loc[gpu, "device"] = events.loc[gpu, "rank"]
    events.loc[is_kernel, "stream"] = EMULATED_COMPUTE_STREAM
    events.loc[is_coll, "stream"] = EMULATED_COMM_STREAM
    events.loc[is_kernel, "name"] = names[is_kernel].str.slice(len(KERNEL_RANGE_PREFIX))
    events.loc[is_coll, "role"] = "comm"
    if is_coll.any():
        ops = names[is_coll].str.slice(len(COLLECTIVE_RANGE_PREFIX))
        events.loc[is_coll, "collective_op"] = ops.map(normalize_collective).to_numpy()
        # Sequence numbers count per rank (and restart with each repetition's trace).
        keys = [c for c in ("repetition",) if c in events.columns] + ["rank"]
        coll = events.loc[is_coll, keys + ["start_ns"]].copy()
        coll["order"] = np.arange(len(coll))
        coll = coll.sort_values(keys + ["start_ns", "order"], kind="stable")
        coll["seq"] = coll.groupby(keys).cumcount()
        seq = coll.sort_values("order")["seq"].to_numpy()
        events.loc[is_coll, "collective_id"] = [f"{DEFAULT_GROUP}:{int(s)}" for s in seq]
    return events


def assign_roles(events: pd.DataFrame, roles: Mapping[str, str]) -> pd.DataFrame:
    """Set ``role`` of every kernel row from the variant's name patterns (one lookup per distinct
    name); a kernel no pattern names is ``comm`` when it belongs to a communication library
    (``vocabulary.is_comm_kernel``), else ``compute``.

    memcpy/memset rows keep the importer's role (copy, or comm for peer copies); host rows stay
    ``other``.
    """
    events = events.copy()
    kernel = (events["kind"] == "kernel").to_numpy()
    if kernel.any():
        names = events.loc[kernel, "name"].astype(str)
        unique = names.unique()
        by_name = {n: classify_role(n, roles, "comm" if is_comm_kernel(n) else "compute") for n in unique}
        # The importer already knows NCCL/collective kernels are comm; an explicit variant
        # pattern may refine that, but the fallback guess ("compute") must not override it.
        explicit = {n: any(re.search(p, n) for p in roles) for n in unique}
        prior = events.loc[kernel, "role"].to_numpy()
        keep_prior = (prior == "comm") & ~names.map(explicit).to_numpy(dtype=bool)
        events.loc[kernel, "role"] = np.where(keep_prior, prior, names.map(by_name).to_numpy())
    return events


def renumber_iterations(events: pd.DataFrame) -> pd.DataFrame:
    """Iterations numbered 0, 1, ... within each repetition (the profiler's step numbers may
    start anywhere); rows outside any iteration keep -1."""
    events = events.copy()
    it = events["iteration"].to_numpy()
    inside = it >= 0
    if inside.any():
        keys = events.loc[inside, ["repetition", "iteration"]]
        ranks = keys.groupby("repetition")["iteration"].rank(method="dense").to_numpy() - 1
        # At the column's own dtype: pandas 3 refuses to set int64 values into an int32 column.
        events.loc[inside, "iteration"] = ranks.astype(events["iteration"].dtype)
    return events


def finish_events(per_repetition: Sequence[pd.DataFrame], roles: Mapping[str, str], *, emulated: bool) -> pd.DataFrame:
    """Concatenate each repetition's imported events and set repetition, kernel rows and roles."""
    frames = []
    for rep, ev in enumerate(per_repetition):
        ev = ev.copy()
        ev["repetition"] = rep
        if emulated:
            ev = emulated_gpu_rows(ev)
        frames.append(ev)
    events = pd.concat(frames, ignore_index=True)
    events = assign_roles(events, roles)
    return renumber_iterations(events)


def iter_trace_files(directory: Path, rank_traces: Sequence[Sequence[bytes]], suffix: str) -> Iterator[list[Path]]:
    """Write every rank's raw traces (``rank_traces[rank][repetition]``) under ``directory`` and
    yield, per repetition, the list of that repetition's files (one per rank)."""
    repetitions = len(rank_traces[0]) if rank_traces else 0
    for rep in range(repetitions):
        paths = []
        for rank, traces in enumerate(rank_traces):
            p = directory / f"rank{rank}.rep{rep}{suffix}"
            p.write_bytes(traces[rep])
            paths.append(p)
        yield paths


from taxmodel.trace import rocprofiler_capture  # noqa: E402,F401  (registers the 'rocprofiler' tracer)
