"""Export a bundle and its ledger as a Chrome/Perfetto trace (JSON), with the taxes as tracks.

Open the file in Perfetto's UI (or chrome://tracing): one process per rank; inside it one
track per GPU stream (kernels, copies), one per ledger sub-part (the ledger's intervals, so a
reader sees e.g. "Skew wait" under the collective that caused it), then host threads,
iteration markers and in-kernel CTA records. Everything is on the ledger's aligned clock.

Time format: the trace-event format counts ``ts``/``dur`` in microseconds; we write them with
three decimals, relative to the earliest event (``otherData.ts_base_ns`` gives the absolute
start), so every value is an exact nanosecond: relative times stay far below 2**53 ns, and the
shortest float text of ``k/1000`` is exactly the decimal ``k/1000``. No ``displayTimeUnit`` is
written (some readers take it as the unit of ``ts``).

Slices on one track must nest or be disjoint in this format; events that overlap others on
their track move to an extra "[overlap lane N]" track instead of being mangled by the viewer.
This happens for nested user ranges, and on ledger tracks because iteration windows are global:
when ranks drift, one rank's idle tail of iteration i and the start of iteration i+1 cover the
same time, and both iterations' ledgers count it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from taxmodel.version import __version__
from taxmodel.fsutil import atomic_write
from taxmodel.ledger.categories import LABELS, PARENT, SUBCATEGORY_ORDER
from taxmodel.report import compare
from taxmodel.report.compare import LedgerLike
from taxmodel.trace.bundle import Bundle
from taxmodel.trace.schema import GPU_KINDS

# Track order inside a rank's process (thread_sort_index): streams, ledger, host, markers, CTAs.
_SORT_STREAM, _SORT_LEDGER, _SORT_HOST, _SORT_MARKER, _SORT_CTA = 0, 1000, 2000, 3000, 4000
_MAX_OVERLAP_LEVELS = 8
_EVENT_ARGS = ("correlation", "stream", "iteration", "repetition", "collective_id", "collective_op", "graph_id",
               "grid", "block", "bytes", "flops", "cta", "phase")
_MISSING = {"correlation": -1, "stream": -1, "iteration": -1, "collective_id": "", "collective_op": "", "graph_id": -1,
            "grid": "", "block": "", "bytes": -1, "flops": -1, "cta": -1, "phase": ""}


def rank_pid(rank: int) -> int:
    """Process id of a rank in the trace (rank + 1: pid 0 means 'idle/swapper' to some readers)."""
    return int(rank) + 1


def _track_of_events(ev: pd.DataFrame) -> pd.DataFrame:
    """(track key, sort index, track name) for each event row: GPU rows by stream, in-kernel
    records by CTA, markers on one track, other host rows by thread."""
    kind = ev["kind"].astype(str)
    stream = ev["stream"].astype("int64")
    cta = ev["cta"].astype("int64")
    gpu, record, marker = kind.isin(GPU_KINDS), kind == "record", kind == "marker"
    host = ~(gpu | record | marker)
    key = pd.Series("markers", index=ev.index, dtype=object)
    name = pd.Series("markers", index=ev.index, dtype=object)
    sort = pd.Series(_SORT_MARKER, index=ev.index, dtype="int64")
    for mask, prefix, label, ids, base in ((gpu, "stream:", "GPU stream ", stream, _SORT_STREAM),
                                           (record, "cta:", "CTA ", cta, _SORT_CTA),
                                           (host, "host:", "host thread ", stream, _SORT_HOST)):
        text = ids[mask].astype(str)
        key[mask] = prefix + text
        name[mask] = label + text
        sort[mask] = base + (ids[mask].clip(0, 999) if base != _SORT_HOST else 0)
    return pd.DataFrame({"track": key, "sort": sort, "track_name": name}, index=ev.index)


def _split_overlaps(df: pd.DataFrame) -> pd.Series:
    """Lane number per row so that within (rank, track, lane) slices never partially overlap.

    Vectorized per level: sorted by start, a slice that starts before the running maximum end
    of the earlier ones on its track overlaps something, and goes one lane down.
    """
    lane = pd.Series(0, index=df.index, dtype="int64")
    todo = df.index
    for level in range(_MAX_OVERLAP_LEVELS):
        sub = df.loc[todo].sort_values(["rank", "track", "start_ns", "end_ns"], kind="stable")
        prev_end = sub.groupby(["rank", "track"])["end_ns"].transform(lambda s: s.cummax().shift(1))
        clash = (sub["start_ns"] < prev_end.fillna(np.iinfo("int64").min)).to_numpy()
        if not clash.any():
            break
        todo = sub.index[clash]
        lane.loc[todo] = level + 1
    return lane


def chrome_trace(bundle: Bundle, ledger: LedgerLike) -> dict[str, Any]:
    """The trace as a JSON-ready dict: ``{"traceEvents": [...], "otherData": {...}}``."""
    offsets = compare.clock_offsets(ledger)
    ev = compare.aligned_events(bundle.events, ledger)
    ev = pd.concat([ev, _track_of_events(ev)], axis=1)
    iv = ledger.intervals
    iv = iv.assign(
        track="ledger:" + iv["subcategory"].astype(str),
        sort=_SORT_LEDGER + iv["subcategory"].map({s: i for i, s in enumerate(SUBCATEGORY_ORDER)}).fillna(99).astype("int64"),
        track_name="ledger · " + iv["subcategory"].map(lambda s: LABELS.get(s, s)),
    )
    starts = [int(ev["start_ns"].min())] if len(ev) else []
    if len(iv):
        starts.append(int(iv["start_ns"].min()))
    base = min(starts) if starts else 0

    both = pd.concat([ev[["rank", "track", "start_ns", "end_ns"]], iv[["rank", "track", "start_ns", "end_ns"]]],
                     keys=["ev", "iv"])
    lanes = _split_overlaps(both)
    ev = ev.assign(lane=lanes.loc["ev"].to_numpy())
    iv = iv.assign(lane=lanes.loc["iv"].to_numpy())

    # Thread ids: one per (rank, track, lane), numbered from 1 in sort order.
    tracks = pd.concat([ev[["rank", "track", "sort", "track_name", "lane"]], iv[["rank", "track", "sort", "track_name", "lane"]]])
    tracks = tracks.drop_duplicates(["rank", "track", "lane"]).sort_values(["rank", "sort", "track", "lane"])
    tracks["tid"] = tracks.groupby("rank").cumcount() + 1
    tid_of = tracks.set_index(["rank", "track", "lane"])["tid"]

    out: list[dict[str, Any]] = []
    for r in sorted(set(tracks["rank"].astype(int))):
        out.append({"ph": "M", "name": "process_name", "pid": rank_pid(r), "tid": 0, "args": {"name": f"rank {r}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank_pid(r), "tid": 0, "args": {"sort_index": r}})
    for row in tracks.itertuples(index=False):
        name = row.track_name + (f" [overlap lane {row.lane}]" if row.lane else "")
        pid = rank_pid(row.rank)
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": int(row.tid), "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": int(row.tid),
                    "args": {"sort_index": int(row.sort) * 10 + int(row.lane)}})

    out.extend(_event_slices(ev, tid_of, base))
    out.extend(_launch_flows(ev, tid_of, base))
    out.extend(_ledger_slices(iv, tid_of, base))
    clock = getattr(ledger, "clock", None)
    other = {
        "generator": f"taxmodel {__version__}",
        "bundle": ledger.label,
        "ts_base_ns": base,
        "clock_method": getattr(clock, "method", None),
        "clock_uncertainty_ns": getattr(clock, "uncertainty_ns", None),
        "clock_offsets_ns": {str(k): v for k, v in offsets.items()},
    }
    return {"traceEvents": out, "otherData": other}


def _us(ns: np.ndarray) -> np.ndarray:
    return np.round(np.asarray(ns, dtype="int64") / 1000.0, 3)


def _event_slices(ev: pd.DataFrame, tid_of: pd.Series, base: int) -> list[dict[str, Any]]:
    if ev.empty:
        return []
    tids = tid_of.reindex(pd.MultiIndex.from_arrays([ev["rank"], ev["track"], ev["lane"]])).to_numpy()
    dur = (ev["end_ns"] - ev["start_ns"]).to_numpy()
    frame = pd.DataFrame({
        "name": ev["name"].astype(str).to_numpy(),
        "cat": (ev["kind"].astype(str) + "," + ev["role"].astype(str)).to_numpy(),
        "ph": np.where(dur > 0, "X", "i"),
        "pid": ev["rank"].astype("int64").to_numpy() + 1,
        "tid": tids.astype("int64"),
        "ts": _us(ev["start_ns"].to_numpy() - base),
        "dur": _us(dur),
    })
    args = _args_records(ev)
    records = frame.to_dict("records")
    for rec, a in zip(records, args):
        if rec["ph"] == "i":
            del rec["dur"]
            rec["s"] = "t"
        rec["args"] = a
    return records


def _args_records(ev: pd.DataFrame) -> list[dict[str, Any]]:
    """Per event, the schema fields that are set (sentinels left out, so the details pane stays short)."""
    cols = {c: ev[c].to_numpy() for c in _EVENT_ARGS if c in ev.columns}
    set_mask = {c: (v != _MISSING[c]) if c in _MISSING else np.ones(len(v), bool) for c, v in cols.items()}
    out = []
    for i in range(len(ev)):
        out.append({c: (v[i].item() if hasattr(v[i], "item") else v[i]) for c, v in cols.items() if set_mask[c][i]})
    return out


def _launch_flows(ev: pd.DataFrame, tid_of: pd.Series, base: int) -> list[dict[str, Any]]:
    """Arrows from each launch call to the GPU work it enqueued (matched by rank and correlation),
    as flow start/finish events bound to the two slices, like Kineto's "ac2g" flows."""
    cols = ["rank", "correlation", "track", "lane", "start_ns"]
    launch = ev[(ev["kind"] == "launch") & (ev["correlation"] >= 0)][cols]
    gpu = ev[ev["kind"].isin(GPU_KINDS) & (ev["correlation"] >= 0)][cols]
    pairs = launch.merge(gpu, on=["rank", "correlation"], suffixes=("_l", "_g"))
    if pairs.empty:
        return []
    flow_id = np.arange(1, len(pairs) + 1)  # dense ids: unique across ranks and small (JSON readers in JS use doubles)
    pid = pairs["rank"].astype("int64").to_numpy() + 1
    out = []
    for end, ph in (("_l", "s"), ("_g", "f")):
        tids = tid_of.reindex(pd.MultiIndex.from_arrays([pairs["rank"], pairs["track" + end], pairs["lane" + end]]))
        frame = pd.DataFrame({"ph": ph, "name": "launch", "cat": "ac2g", "id": flow_id, "pid": pid,
                              "tid": tids.to_numpy().astype("int64"), "ts": _us(pairs["start_ns" + end].to_numpy() - base)})
        if ph == "f":
            frame["bp"] = "e"  # bind to the slice that starts at ts (the kernel), not the enclosing one
        out.extend(frame.to_dict("records"))
    return out


def _ledger_slices(iv: pd.DataFrame, tid_of: pd.Series, base: int) -> list[dict[str, Any]]:
    iv = iv[iv["end_ns"] > iv["start_ns"]]
    if iv.empty:
        return []
    tids = tid_of.reindex(pd.MultiIndex.from_arrays([iv["rank"], iv["track"], iv["lane"]])).to_numpy()
    sub = iv["subcategory"].astype(str)
    frame = pd.DataFrame({
        "name": sub.map(lambda s: LABELS.get(s, s)).to_numpy(),
        "cat": ("ledger," + sub.map(lambda s: PARENT.get(s, "unknown"))).to_numpy(),
        "ph": "X",
        "pid": iv["rank"].astype("int64").to_numpy() + 1,
        "tid": tids.astype("int64"),
        "ts": _us(iv["start_ns"].to_numpy() - base),
        "dur": _us((iv["end_ns"] - iv["start_ns"]).to_numpy()),
    })
    records = frame.to_dict("records")
    for rec, s, rep, it in zip(records, sub, iv["repetition"].to_numpy(), iv["iteration"].to_numpy()):
        rec["args"] = {"subcategory": s, "category": PARENT.get(s, "unknown"), "repetition": int(rep), "iteration": int(it)}
    return records


def write_chrome_trace(bundle: Bundle, ledger: LedgerLike, path: str | os.PathLike) -> Path:
    """Write the trace atomically (temp file + rename); ``.gz`` names are gzip-compressed."""
    path = Path(path)
    data = json.dumps(chrome_trace(bundle, ledger), separators=(",", ":")).encode("utf-8")
    if path.suffix == ".gz":
        import gzip

        data = gzip.compress(data, mtime=0)
    return atomic_write(path, data, what="trace")
