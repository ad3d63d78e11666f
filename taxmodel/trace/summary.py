"""What is in a bundle, as tables: for ``taxmodel show``, the import summary and notebooks.

Every function returns plain pandas objects (the CLI decides how to print them); times are
integer ns in the frames, and only ``describe`` turns them into words.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from taxmodel.trace.bundle import Bundle


def overview(bundle: Bundle) -> dict[str, Any]:
    """Counts a reader wants first: ranks, iterations, repetitions, GPU rows by kind."""
    ev = bundle.events
    gpu = bundle.gpu_events(["kind", "collective_id", "start_ns", "end_ns"])
    iters = sorted(int(i) for i in ev.loc[ev["iteration"] >= 0, "iteration"].unique())
    reps = sorted(int(r) for r in ev["repetition"].unique())
    comm = gpu.loc[gpu["collective_id"] != "", "collective_id"]
    return {
        "label": bundle.label,
        "source": bundle.meta.get("source"),
        "world_size": bundle.world_size,
        "ranks": bundle.ranks,
        "repetitions": len(reps) if reps else int(bundle.meta.get("repetitions") or 1),
        "iterations": iters,
        "gpu_events": int(len(gpu)),
        "kernels": int((gpu["kind"] == "kernel").sum()),
        "memcpy": int((gpu["kind"] == "memcpy").sum()),
        "memset": int((gpu["kind"] == "memset").sum()),
        "launches": int((ev["kind"] == "launch").sum()),
        "collectives": int(comm.nunique()),
        "gpu_busy_ns": int((gpu["end_ns"] - gpu["start_ns"]).sum()),
    }


def meta_table(bundle: Bundle) -> pd.DataFrame:
    """The bundle's description: workload, variant, device, versions... as (field, value) rows."""
    meta = bundle.meta
    hw = meta.get("hardware") or {}
    rows: list[tuple[str, Any]] = [
        ("workload", meta.get("workload") or "-"),
        ("variant", meta.get("variant") or "-"),
        ("shape", ", ".join(f"{k}={v}" for k, v in (meta.get("shape") or {}).items()) or "-"),
        ("source", meta.get("source") or "-"),
        ("world size", bundle.world_size),
        ("device", _device(hw)),
    ]
    launches = launch_mode(meta, detail=True)
    if launches:
        rows.append(("launches", launches))
    for name, version in sorted((meta.get("software") or {}).items()):
        rows.append((name, version))
    if meta.get("created"):
        rows.append(("created", meta["created"]))
    for note in meta.get("notes") or []:
        rows.append(("note", note))
    return pd.DataFrame(rows, columns=["field", "value"]).astype({"value": str})


def launch_mode(meta: dict, detail: bool = False) -> str | None:
    """How a ``taxmodel profile`` bundle's iterations were launched: "CUDA graph" (one replay per
    iteration, ``--graph``) or "eager"; None when the capture does not say (imported traces)."""
    capture = meta.get("capture") or {}
    if "graph" not in capture:  # captures made before --graph existed were all eager
        return "eager" if meta.get("source") == "capture" else None
    if capture["graph"]:
        return "CUDA graph (one replay per iteration)" if detail else "CUDA graph"
    note = capture.get("graph_note")
    return f"eager (--graph fell back: {note})" if detail and note else "eager"


def _device(hw: dict) -> str:
    if not hw:
        return "-"
    parts = [str(hw.get("name") or "?")]
    if hw.get("num_sms"):
        parts.append(f"{hw['num_sms']} SMs")
    if hw.get("memory_bytes"):
        parts.append(f"{int(hw['memory_bytes']) / 2**30:.0f} GiB")
    if hw.get("compute_capability"):
        parts.append(f"sm {hw['compute_capability']}")
    return ", ".join(parts)


def role_table(bundle: Bundle) -> pd.DataFrame:
    """GPU rows by rank and role: count, total and mean time (ns). One row per (rank, role)."""
    gpu = bundle.gpu_events(["rank", "role", "start_ns", "end_ns"])
    dur = gpu["end_ns"] - gpu["start_ns"]
    table = (gpu.assign(dur_ns=dur).groupby(["rank", "role"], sort=True)["dur_ns"]
             .agg(count="count", total_ns="sum").reset_index())
    table["mean_ns"] = (table["total_ns"] // table["count"].clip(lower=1)).astype("int64")
    return table.astype({"rank": "int64", "count": "int64", "total_ns": "int64"})


def top_kernels(bundle: Bundle, n: int = 10) -> pd.DataFrame:
    """The GPU activities taking the most time over all ranks: name, role, count, total, mean,
    and share of all GPU time (pct)."""
    gpu = bundle.gpu_events(["name", "role", "start_ns", "end_ns"])
    dur = gpu["end_ns"] - gpu["start_ns"]
    table = (gpu.assign(dur_ns=dur).groupby(["name", "role"], sort=False)["dur_ns"]
             .agg(count="count", total_ns="sum").reset_index())
    total = int(dur.sum())
    table["mean_ns"] = (table["total_ns"] // table["count"].clip(lower=1)).astype("int64")
    table["pct"] = 100.0 * table["total_ns"] / total if total else 0.0
    table = table.sort_values(["total_ns", "name"], ascending=[False, True], kind="stable").head(n)
    return table.reset_index(drop=True)


def describe(bundle: Bundle, fmt: str | None = None) -> str:
    """One paragraph about an imported bundle, for the end of ``taxmodel import``."""
    o = overview(bundle)
    iters = o["iterations"]
    it_text = (f"{len(iters)} iterations ({iters[0]}..{iters[-1]})" if len(iters) > 1
               else f"1 iteration ({iters[0]})" if iters else "no iteration markers")
    ranks = o["ranks"]
    rank_text = f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
    if len(ranks) != o["world_size"]:
        rank_text += f" of world size {o['world_size']}"
    device = _device(bundle.meta.get("hardware") or {})
    roles = role_table(bundle).groupby("role")["total_ns"].sum()
    busy = o["gpu_busy_ns"] or 1
    shares = ", ".join(f"{role} {100.0 * ns / busy:.0f}%" for role, ns in roles.sort_values(ascending=False).items())
    src = fmt or o["source"] or "trace"
    return (f"Imported {rank_text} from {src} traces: {o['kernels']} kernels, {o['memcpy']} memcpy, "
            f"{o['memset']} memset ({o['launches']} launch calls, {o['collectives']} distinct collectives) in "
            f"{it_text}, {o['repetitions']} repetition{'s' if o['repetitions'] != 1 else ''}; "
            f"GPU busy {o['gpu_busy_ns'] / 1e6:.3f} ms summed over ranks ({shares or 'no GPU time'}); device: {device}.")


def to_json(bundle: Bundle, n: int = 10) -> dict[str, Any]:
    """Everything ``show`` prints, as JSON-ready data."""
    return {
        "overview": overview(bundle),
        "meta": {k: bundle.meta.get(k) for k in ("workload", "variant", "shape", "source", "world_size",
                                                 "hardware", "software", "created", "notes", "capture")},
        "roles": role_table(bundle).to_dict(orient="records"),
        "top_kernels": top_kernels(bundle, n).to_dict(orient="records"),
    }
