"""Multi-rank Kineto files built the ways public tools build them, from real per-rank traces
(issue 36 item 4). Each function writes one merged file and returns its path.

- ``trace_fusion``: as TraceLens' TraceFusion documents and does (``TraceFusion/trace_fuse.py``):
  ``args.rank`` on every event, process and correlation ids offset by ``rank x 10^k`` (k one more
  than the digits of the largest value), the raw values kept as ``args.pid_raw`` /
  ``args.correlation_raw``, the per-file top-level fields dropped, ``process_name`` metadata
  rewritten as "RANK r - CPU/GPU";
- ``renamed_processes``: every event of rank r given pid r + 1 and a "Rank r" process name (a
  merger from Megatron-LM-AutoTuner, ``tools/merge_profiler_traces.py``);
- ``concatenated``: the events put together as they are, processes keeping their own ids.
"""
from __future__ import annotations

import copy
import gzip
import json
import math
from pathlib import Path

_GPU = {"kernel", "gpu_memcpy", "gpu_memset"}


def _events(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _write(path: Path, doc: dict) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def trace_fusion(paths: list[Path], out: Path) -> Path:
    docs = [_events(p) for p in paths]
    first = docs[0]["traceEvents"]
    has_corr = any(e.get("cat") in ("cuda_runtime", "cuda_driver") and "launch" in e.get("name", "").lower()
                   and "correlation" in (e.get("args") or {}) for e in first)
    key = "correlation" if has_corr else "External id"

    def top(field: str) -> int:
        vals = [(e.get("args") or {}).get(field) if field == key else e.get(field) for e in first]
        return max((v for v in vals if isinstance(v, int)), default=0)
    mult = {f: 10 ** (math.ceil(math.log10(top(f) + 1)) + 1) for f in ("id", "pid", key)}
    merged = []
    for rank, doc in enumerate(docs):
        for e in copy.deepcopy(doc["traceEvents"]):
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_sort_index", "process_labels"):
                continue
            if e.get("cat") in ("Trace", "python_function"):
                continue
            args = e.setdefault("args", {})
            args["rank"] = rank
            for f, m in mult.items():
                if f == key and f in args:
                    args[f"{f}_raw"] = args[f]
                    args[f] += rank * m
                elif f != key and f in e:
                    args[f"{f}_raw"] = e[f]
                    if isinstance(e[f], int):
                        e[f] += rank * m
            merged.append(e)
    labels = {}
    for e in merged:
        if e.get("ph") != "M" and isinstance(e.get("pid"), int):
            gpu = e.get("cat") in _GPU
            labels[e["pid"]] = (e["args"]["rank"], labels.get(e["pid"], (0, False))[1] or gpu)
    for pid, (rank, gpu) in labels.items():
        merged.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": f"RANK {rank} - {'GPU' if gpu else 'CPU'}"}})
    return _write(out, {"traceEvents": merged})


def renamed_processes(paths: list[Path], out: Path) -> Path:
    merged = []
    for rank, p in enumerate(paths):
        for e in _events(p)["traceEvents"]:
            e = dict(e)
            e["pid"] = rank + 1
            merged.append(e)
        merged.append({"name": "process_name", "ph": "M", "pid": rank + 1, "tid": 0, "args": {"name": f"Rank {rank}"}})
    return _write(out, {"traceEvents": merged})


def concatenated(paths: list[Path], out: Path, drop_correlation: bool = False) -> Path:
    docs = [_events(p) for p in paths]
    merged = [dict(e) for d in docs for e in d["traceEvents"]]
    if drop_correlation:
        for e in merged:
            if e.get("cat") in _GPU and isinstance(e.get("args"), dict):
                e["args"] = {k: v for k, v in e["args"].items() if k != "correlation"}
    head = {k: v for k, v in docs[0].items() if k != "traceEvents"}
    return _write(out, {**head, "traceEvents": merged})
