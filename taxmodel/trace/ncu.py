"""Per-kernel hardware counters from Nsight Compute: ``ncu --csv`` exports and ``.ncu-rep`` reports.

Why: the data-locality tax is DRAM traffic beyond a kernel's compulsory bytes; only hardware
counters see it (the L2 absorbs part of a round trip and write-backs land in later kernels).
This module reads what ncu wrote into one row per profiled kernel; ``counter_match`` attaches
the rows to a bundle's kernels.

Read: the ``details`` page in long form (one row per kernel and metric, the default of
``ncu --csv``: ``"ID","Process ID",...,"Kernel Name",...,"Metric Name","Metric Unit","Metric
Value"``) and the ``raw`` page (``--page raw``: one row per kernel, a units row under the
header). Lines that are not CSV rows (``==PROF==``/``==WARNING==`` lines, the program's own
output when ncu's output went to the same stream) are skipped. Values may carry thousands
separators and scaled units (``Kbyte``, ``Mbyte``, ``usecond``, ...); they are converted to
bytes and nanoseconds. A ``.ncu-rep`` is read through Nsight Compute's Python module
``ncu_report`` when it can be imported, else the error says how to export a CSV.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd

from taxmodel.errors import InputError
from taxmodel.trace import inflate

METRICS = {
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "lts__t_sector_hit_rate.pct": "l2_hit_pct",
    "gpu__time_duration.sum": "duration_ns",
}
"""The metrics taxmodel asks for, and the column each becomes."""

METRICS_ARG = ",".join(METRICS)
"""The value of ``ncu --metrics`` that collects them."""

COLUMNS = ("process_id", "device", "stream", "kernel_id", "name", "grid", "block",
           "dram_read_bytes", "dram_write_bytes", "l2_hit_pct", "duration_ns")
"""Columns of ``read_counters``: one row per profiled kernel, in ncu's (launch) order."""

_UNIT_SCALE = {
    # bytes: ncu scales by powers of 1000 (Kbyte, Mbyte, ...); binary forms for safety
    "byte": 1.0, "bytes": 1.0, "b": 1.0,
    "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kibyte": 1024.0, "mibyte": 1024.0**2, "gibyte": 1024.0**3, "kib": 1024.0, "mib": 1024.0**2, "gib": 1024.0**3,
    # time to ns
    "nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9,
    # percent
    "%": 1.0, "pct": 1.0,
}
_ID_COLS = {"ID": "kernel_id", "Process ID": "process_id", "Kernel Name": "name", "Device": "device",
            "Stream": "stream", "Grid Size": "grid", "Block Size": "block"}


MAX_COUNTER = float(2 ** 62)
"""Counter values at or above this (bytes, ns) are refused: stored as int64 they would wrap."""


def read_counters(path: str | Path) -> pd.DataFrame:
    """One row per kernel of an ncu export (``COLUMNS``); InputError naming the file otherwise.

    Metrics that were not collected are -1 (bytes, duration) or NaN (L2 hit rate)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such counters file")
    if path.suffix == ".ncu-rep":  # (a .csv may also be gzipped: .csv.gz)
        return _read_report(path)
    try:  # a .csv.gz inflated in chunks under the one input budget: a small one cannot take the memory
        data = b"".join(inflate.input_chunks(path, "the counters file"))
    except (OSError, EOFError) as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    text = data.decode("utf-8", errors="replace")
    del data
    rows = [ln for ln in text.splitlines() if ln.startswith('"')]
    header = next((i for i, ln in enumerate(rows) if ln.startswith('"ID"')), None)
    if header is None:
        raise InputError(f"{path}: no ncu CSV table in it (expected a header line starting with \"ID\"); export with "
                         f"`ncu --csv --metrics {METRICS_ARG} ...` (its output, not its log)")
    try:
        table = pd.read_csv(io.StringIO("\n".join(rows[header:])), dtype=str, keep_default_na=False,
                            quoting=csv.QUOTE_MINIMAL)
    except (ValueError, pd.errors.ParserError) as exc:
        raise InputError(f"{path}: the ncu CSV table cannot be read ({' '.join(str(exc).split())[:160]})") from exc
    missing = [c for c in ("ID", "Kernel Name") if c not in table.columns]
    if missing:
        raise InputError(f"{path}: the ncu CSV has no column {missing[0]!r}; export it with `ncu --csv`")
    out = _from_long(table, path) if "Metric Name" in table.columns else _from_raw(table, path)
    if out.empty:
        raise InputError(f"{path}: the ncu CSV lists no kernels; was the program's work inside the profiled range?")
    if (out[["dram_read_bytes", "dram_write_bytes"]] < 0).all(axis=None):
        raise InputError(f"{path}: the ncu CSV has no DRAM byte counters; collect them with "
                         f"`--metrics {METRICS_ARG}`")
    return out


def _from_long(table: pd.DataFrame, path: Path) -> pd.DataFrame:
    """The details page: one row per (kernel, metric)."""
    for col in ("Metric Unit", "Metric Value"):
        if col not in table.columns:
            raise InputError(f"{path}: the ncu CSV has 'Metric Name' but no {col!r} column")
    wanted = table[table["Metric Name"].isin(list(METRICS))]
    values = _to_number(wanted["Metric Value"], wanted["Metric Unit"], path)
    ids = table.drop_duplicates("ID")[[c for c in _ID_COLS if c in table.columns]].set_index("ID")
    wide = pd.DataFrame({"ID": wanted["ID"].to_numpy(), "metric": wanted["Metric Name"].map(METRICS).to_numpy(),
                         "value": values}).pivot_table(index="ID", columns="metric", values="value", aggfunc="first")
    return _finish(ids.join(wide), path)


def _from_raw(table: pd.DataFrame, path: Path) -> pd.DataFrame:
    """The raw page: one row per kernel, metric columns, the second row holds the units."""
    units = table.iloc[0] if len(table) and str(table.iloc[0]["ID"]).strip() == "" else None
    body = table.iloc[1:] if units is not None else table
    ids = body[[c for c in _ID_COLS if c in body.columns]].set_index("ID")
    for metric, col in METRICS.items():
        if metric in body.columns:
            unit = pd.Series(units[metric] if units is not None else "", index=body.index)
            ids[col] = _to_number(body[metric], unit, path)
    return _finish(ids, path)


def _to_number(values: pd.Series, units: pd.Series, path: Path) -> np.ndarray:
    """Metric values as floats in base units (bytes, ns, percent); 'n/a' and blanks are NaN."""
    clean = values.astype(str).str.replace(",", "", regex=False).str.strip()
    num = pd.to_numeric(clean.where(~clean.str.lower().isin(["", "n/a", "nan"])), errors="coerce")
    bad = num.isna() & ~clean.str.lower().isin(["", "n/a", "nan"])
    if bad.any():
        raise InputError(f"{path}: metric value {values[bad].iloc[0]!r} is not a number")
    key = units.astype(str).str.strip().str.lower()
    scale = key.map(_UNIT_SCALE)
    unknown = scale.isna() & (key != "")
    if unknown.any():
        raise InputError(f"{path}: unknown metric unit {units[unknown].iloc[0]!r}; export with `--print-units base`")
    return (num * scale.fillna(1.0)).to_numpy(dtype=float)


def _finish(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    df = df.reset_index().rename(columns=_ID_COLS)
    for col in ("dram_read_bytes", "dram_write_bytes", "duration_ns", "l2_hit_pct"):
        if col not in df.columns:
            df[col] = np.nan
    out = pd.DataFrame({
        "process_id": pd.to_numeric(df.get("process_id", pd.Series(-1, index=df.index)), errors="coerce").fillna(-1).astype("int64"),
        "device": pd.to_numeric(df.get("device", pd.Series(-1, index=df.index)), errors="coerce").fillna(-1).astype("int32"),
        "stream": pd.to_numeric(df.get("stream", pd.Series(-1, index=df.index)), errors="coerce").fillna(-1).astype("int64"),
        "kernel_id": pd.to_numeric(df["kernel_id"], errors="coerce"),
        "name": df["name"].astype(str),
        "grid": df.get("grid", pd.Series("", index=df.index)).astype(str),
        "block": df.get("block", pd.Series("", index=df.index)).astype(str),
    })
    if out["kernel_id"].isna().any():
        raise InputError(f"{path}: a kernel ID in the ncu CSV is not a number")
    out["kernel_id"] = out["kernel_id"].astype("int64")
    for col in ("dram_read_bytes", "dram_write_bytes", "duration_ns"):
        value = pd.to_numeric(df[col], errors="coerce").astype(float)
        # a counter is a count: never negative, never infinite, and stored as int64 (beyond 2**62
        # it would wrap into a negative "measurement")
        absurd = value.notna() & ~((value >= 0) & (value < MAX_COUNTER))
        if absurd.any():
            i = int(np.flatnonzero(absurd.to_numpy())[0])
            raise InputError(f"{path}: kernel {df['name'].iloc[i]!r}: {col} is {value.iloc[i]!r}, not a count a kernel "
                             f"can have (finite, not negative, below {MAX_COUNTER:.1e}); the export is damaged")
        out[col] = value.round().fillna(-1).astype("int64").to_numpy()
    out["l2_hit_pct"] = df["l2_hit_pct"].astype(float).to_numpy()
    return out.sort_values(["process_id", "kernel_id"], kind="stable").reset_index(drop=True)[list(COLUMNS)]


def _read_report(path: Path) -> pd.DataFrame:
    """A ``.ncu-rep`` through Nsight Compute's ``ncu_report`` module (ships with Nsight Compute)."""
    try:
        import ncu_report  # type: ignore[import-not-found]
    except ImportError as exc:
        raise InputError(f"{path}: reading .ncu-rep needs Nsight Compute's Python module ncu_report (add its "
                         "extras/python folder to PYTHONPATH), or export a CSV: "
                         f"`ncu --import {path.name} --csv > counters.csv`") from exc
    rows = []
    ctx = ncu_report.load_report(str(path))
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            act = rng.action_by_idx(a)
            row = {"ID": len(rows), "Kernel Name": act.name()}
            for metric, col in METRICS.items():
                m = act.metric_by_name(metric)
                row[col] = float(m.as_double()) if m is not None else np.nan
            rows.append(row)
    if not rows:
        raise InputError(f"{path}: the report holds no profiled kernels")
    return _finish(pd.DataFrame(rows).set_index("ID"), path)
