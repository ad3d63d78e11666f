"""The one event schema every importer writes and everything downstream reads.

One row per GPU activity (kernel, memcpy, memset), host launch call, synchronization, marker,
or in-kernel trace record. Times are integer nanoseconds on the rank's own clock as captured;
clock offsets between ranks live in the bundle's metadata (``clock_offsets_ns``), never baked
into the events, so that alignment can be re-estimated.

Missing values use sentinels rather than nulls so that every column has one plain dtype and
interval arithmetic stays vectorized: -1 for integers, "" for strings.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from taxmodel.errors import BundleError

SCHEMA_VERSION = 1

KINDS = ("kernel", "memcpy", "memset", "launch", "sync", "marker", "record", "wait")
"""kernel/memcpy/memset: GPU activities. launch: a host runtime call that enqueued GPU work
(linked to it by ``correlation``). sync: a host call that waited on the GPU. marker: an
iteration or user range (e.g. ``ProfilerStep#3``). record: an in-kernel trace record of one
CTA's phase inside a fused kernel (``cta``, ``phase`` set). wait: a cross-stream dependency
enqueued on GPU stream ``stream`` at ``start_ns`` (``cudaStreamWaitEvent``: the stream's later
work waits for an event of another stream)."""

ROLES = ("compute", "comm", "fused", "copy", "other")
"""What a GPU activity does for the workload: compute (GEMM, attention, combine), comm (a
collective or a copy between GPUs), fused (compute with in-kernel communication), copy (local
memcpy/memset), other (anything else, and every non-GPU row)."""

GPU_KINDS = ("kernel", "memcpy", "memset")


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str
    missing: object
    doc: str


COLUMNS: tuple[Column, ...] = (
    Column("rank", "int32", None, "global rank of the process that recorded the row"),
    Column("device", "int32", -1, "GPU index on its host; -1 for host rows"),
    Column("stream", "int64", -1, "GPU stream (or host thread id for host rows)"),
    Column("kind", "string", None, "one of KINDS"),
    Column("role", "string", "other", "one of ROLES"),
    Column("name", "string", "", "kernel or call name as the tracer reported it"),
    Column("start_ns", "int64", None, "start, integer ns, rank-local clock"),
    Column("end_ns", "int64", None, "end, integer ns, rank-local clock; end > start"),
    Column("correlation", "int64", -1, "links a launch row to the GPU rows it enqueued"),
    Column("repetition", "int32", 0, "independent repetition (separate timed loop) of the run"),
    Column("iteration", "int32", -1, "iteration within the repetition; -1 outside any"),
    Column("collective_id", "string", "", "'<process group>:<sequence>' for collectives"),
    Column("collective_op", "string", "", "allgather, allreduce, reduce_scatter, ..."),
    Column("graph_id", "int64", -1, "CUDA/HIP graph id when launched from a graph"),
    Column("grid", "string", "", "grid dims 'x,y,z' in blocks"),
    Column("block", "string", "", "block dims 'x,y,z' in threads"),
    Column("bytes", "int64", -1, "bytes moved (memcpy/memset/collective message)"),
    Column("flops", "int64", -1, "floating-point operations, when declared or costed from the launching op's shapes"),
    Column("op", "string", "", "the framework op that launched a GPU row (e.g. aten::mm), when the trace links it"),
    Column("dtype", "string", "", "dtype class of the peak a GPU row's flops run at (bf16, fp16, fp8, tf32, fp32)"),
    Column("floor_bytes", "int64", -1, "compulsory HBM bytes of a GPU row (inputs read once, outputs written once); "
                                       "for a collective the bytes its rank's link carries"),
    Column("uncosted", "string", "", "why a GPU row has no per-kernel cost (empty when costed or not tried)"),
    Column("op_id", "int64", -1, "the op call that launched a GPU row (kernels of one call share it and its flops and "
                                 "floor_bytes), numbered per rank; -1 when no op is linked"),
    Column("shapes_from", "string", "", "where a GPU row's work came from when not from its own op: 'eager step' for a "
                                        "CUDA-graph replay's kernel matched to the same kernel of an eager step"),
    Column("dram_read_bytes", "int64", -1, "DRAM bytes a kernel read, measured by hardware counters; -1 not measured"),
    Column("dram_write_bytes", "int64", -1, "DRAM bytes a kernel wrote, measured by hardware counters; -1 not measured"),
    Column("l2_hit_pct_x100", "int32", -1, "L2 sector hit rate of a kernel in hundredths of a percent (8406 = 84.06%), "
                                         "measured by hardware counters; -1 not measured"),
    Column("cta", "int32", -1, "CTA (program) id of an in-kernel record"),
    Column("phase", "string", "", "phase of an in-kernel record: flag_wait, remote_load, ..."),
)

COLUMN_NAMES = tuple(c.name for c in COLUMNS)
_BY_NAME = {c.name: c for c in COLUMNS}
REQUIRED = tuple(c.name for c in COLUMNS if c.missing is None)


def empty_events() -> pd.DataFrame:
    """A zero-row events frame with every column at its schema dtype."""
    return pd.DataFrame({c.name: pd.Series([], dtype=_pandas_dtype(c)) for c in COLUMNS})


def _pandas_dtype(col: Column) -> str:
    return "object" if col.dtype == "string" else col.dtype


def normalize_events(df: pd.DataFrame) -> pd.DataFrame:
    """Return ``df`` with every schema column present (sentinels filled in) at its dtype,
    in schema order, sorted by (rank, start_ns, end_ns). Extra columns are dropped.

    Raises BundleError naming the column when a required one is missing or a value cannot be
    converted.
    """
    if _is_normalized(df):
        return df  # already in schema order, at the schema's dtypes, sorted: no copy
    return _normalized({name: df[name] for name in df.columns}, len(df))


def events_from_columns(columns: dict[str, Any], rows: np.ndarray | None = None) -> pd.DataFrame:
    """``normalize_events`` of the frame whose columns are ``columns`` (name -> array or Series, all
    of one length), of its ``rows`` only (positions, in order; all rows by default). The columns are
    taken over: ``columns`` is emptied, each column released once converted, so that the rows are
    held once (plus one column) rather than twice, the frame's and the result's."""
    n = len(next(iter(columns.values()))) if columns else 0
    return _normalized(columns, n, rows)


def concat_events(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``normalize_events`` of normalized ``frames`` put together, which it takes over: ``frames``
    is emptied, and each column is joined and its parts released in turn, so that the rows are held
    once (plus one column) rather than twice, the parts' and the result's. Frames of one rank each
    are joined in rank order (stable), which leaves the result sorted: it is not sorted again."""
    if all(len(f) == 0 or f["rank"].iat[0] == f["rank"].iat[-1] for f in frames):
        frames.sort(key=lambda f: int(f["rank"].iat[0]) if len(f) else -1)
    parts = {name: [f[name].to_numpy() for f in frames] for name in COLUMN_NAMES}
    frames.clear()
    joined = {name: np.concatenate(parts.pop(name)) for name in COLUMN_NAMES}
    return normalize_events(pd.DataFrame(joined, copy=False))


_SORT_KEYS = ("rank", "start_ns", "end_ns")


def _normalized(columns: dict[str, Any], n: int, rows: np.ndarray | None = None) -> pd.DataFrame:
    """``normalize_events``' work on ``columns`` (of ``n`` rows; emptied as read), keeping ``rows``:
    the sort keys are converted first, then every other column is gathered once, already in order."""
    missing = next((c.name for c in COLUMNS if c.missing is None and c.name not in columns), None)
    if missing:
        raise BundleError(f"events: required column '{missing}' is missing")
    keys = {name: _taken(columns, _BY_NAME[name], rows) for name in _SORT_KEYS}
    order = np.lexsort((keys["end_ns"], keys["start_ns"], keys["rank"]))  # stable: equal keys keep their order
    take = order if rows is None else rows[order]
    out = {}
    for col in COLUMNS:  # one column at a time
        out[col.name] = keys.pop(col.name)[order] if col.name in keys else _taken(columns, col, take, len(take))
    columns.clear()  # extra columns are dropped
    return pd.DataFrame(out, copy=False)  # one block per column, as a loaded bundle's: no consolidating copy


def _taken(columns: dict[str, Any], col: Column, rows: np.ndarray | None, size: int = 0) -> np.ndarray:
    """Column ``col`` taken over from ``columns`` (released there), at ``rows`` (all when None),
    converted (``_converted``); the sentinel ``size`` times when ``columns`` lacks it."""
    if col.name not in columns:
        return np.full(size, col.missing, dtype=object if col.dtype == "string" else col.dtype)
    s = columns.pop(col.name)
    s = s if isinstance(s, pd.Series) else pd.Series(s, copy=False)
    return _converted(s if rows is None else s.iloc[rows], col)


def _converted(s: pd.Series, col: Column) -> np.ndarray:
    """One column's values at the schema's dtype (strings as str objects), missing ones at the sentinel."""
    try:
        if col.dtype == "string":
            s = s.fillna(col.missing if col.missing is not None else "").astype(str)
            s = s.astype(object)
        else:
            if s.isna().any():
                if col.missing is None:
                    raise BundleError(f"events: column '{col.name}' has missing values")
                s = s.fillna(col.missing)
            s = s.astype(col.dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BundleError(f"events: column '{col.name}' cannot be read as {col.dtype}: {exc}") from exc
    return s.to_numpy()


def _is_normalized(df: pd.DataFrame) -> bool:
    """Whether ``df`` is what ``normalize_events`` returns: the schema's columns in order at their
    dtypes (strings as str objects), a default index, sorted by (rank, start_ns, end_ns)."""
    if tuple(df.columns) != COLUMN_NAMES or not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 \
            or df.index.step != 1:
        return False
    for col in COLUMNS:
        if str(df[col.name].dtype) != _pandas_dtype(col):
            return False
        if col.dtype == "string" and len(df) and not pd.api.types.infer_dtype(df[col.name], skipna=False) in ("string", "empty"):
            return False
    rank, start, end = (df[c].to_numpy() for c in ("rank", "start_ns", "end_ns"))
    if len(df) < 2:
        return True
    dr, ds, de = np.diff(rank), np.diff(start), np.diff(end)
    return bool(((dr > 0) | ((dr == 0) & ((ds > 0) | ((ds == 0) & (de >= 0))))).all())


def add_missing_columns(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every optional column it lacks added at its sentinel (bundles written before a
    column existed load unchanged: per-kernel costs -1 / "", DRAM counters -1 = not measured)."""
    missing = [c for c in COLUMNS if c.name not in df.columns and c.missing is not None]
    if not missing:
        return df
    extra = {c.name: pd.Series(np.full(len(df), c.missing, dtype=object if c.dtype == "string" else c.dtype), index=df.index)
             for c in missing}
    return df.assign(**extra)[[c.name for c in COLUMNS if c.name in df.columns or c.name in extra] +
                              [c for c in df.columns if c not in _BY_NAME]]


def validate_events(df: pd.DataFrame) -> None:
    """Check a normalized events frame; raise BundleError naming the first offending field."""
    missing = [c for c in COLUMN_NAMES if c not in df.columns]
    if missing:
        raise BundleError(f"events: missing column '{missing[0]}'")
    for col in COLUMNS:
        want = _pandas_dtype(col)
        if str(df[col.name].dtype) != want and not (want == "object" and pd.api.types.is_string_dtype(df[col.name])):
            raise BundleError(f"events: column '{col.name}' has dtype {df[col.name].dtype}, expected {col.dtype}")
    bad_kind = ~df["kind"].isin(KINDS)
    if bad_kind.any():
        raise BundleError(f"events: column 'kind' has unknown value {df.loc[bad_kind, 'kind'].iloc[0]!r}; expected one of {KINDS}")
    bad_role = ~df["role"].isin(ROLES)
    if bad_role.any():
        raise BundleError(f"events: column 'role' has unknown value {df.loc[bad_role, 'role'].iloc[0]!r}; expected one of {ROLES}")
    # Markers (iteration ranges) and host calls may be instantaneous; GPU work may not.
    gpu = df["kind"].isin(GPU_KINDS + ("record",)).to_numpy()
    dur = df["end_ns"].to_numpy() - df["start_ns"].to_numpy()
    bad = (dur < 0) | (gpu & (dur <= 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        row = df.iloc[i]
        raise BundleError(
            f"events: field 'end_ns' is not after 'start_ns' for {row['kind']} {row['name']!r} "
            f"on rank {row['rank']} (start {row['start_ns']}, end {row['end_ns']})"
        )
    if (df["rank"].to_numpy() < 0).any():
        raise BundleError("events: column 'rank' has a negative value")


def column_docs() -> pd.DataFrame:
    """The schema as a table (for docs and ``taxmodel show --schema``)."""
    return pd.DataFrame([{"column": c.name, "dtype": c.dtype, "missing": c.missing, "meaning": c.doc} for c in COLUMNS])
