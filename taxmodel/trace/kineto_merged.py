"""Kineto files that hold several ranks: split them into one trace per rank, or refuse in one line.

Tools that put a distributed run's per-rank traces into one file for Perfetto keep every event
and tell the ranks apart in one of three ways:

- TraceLens' TraceFusion writes ``args.rank`` on every event and offsets process ids and
  correlation ids by ``rank x 10^k`` (GPU pids 2, 100000003, 200000004, ...);
- other mergers relabel processes: ``process_name`` metadata "RANK 3 - GPU" / "Rank 3", or string
  process ids "[TP03] 1234" (SGLang's merger);
- a plain concatenation keeps the processes' own ids: several host processes then launch GPU
  work, and each GPU activity belongs to the process whose launch call (same correlation id, the
  latest one before it started) enqueued it.

A single rank's trace has one host process that launches GPU work (data-loader workers launch
none), however many GPUs it drives; it is not split. A merged file whose GPU activity cannot be
told apart by any of these is refused, never read as one rank. Each split rank keeps its own
timestamps; the merge records no host per rank, so the clock offsets between ranks are estimated
(model/clock.py) rather than assumed shared.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from taxmodel.errors import InputError

_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver", "runtime"})
_LAUNCH_NAME = re.compile(r"(?i)launch|memcpy|memset")
_RANK_LABEL = re.compile(r"(?i)(?:\brank|\[\s*(?:tp|dp|pp|ep))\s*0*(\d{1,7})\b")
#: the top-level fields that describe one process's capture, dropped from the split ranks (they
#: came from one of the merged files, or were made up by the merger)
_PER_CAPTURE = ("distributedInfo", "host_name", "baseTimeNanoseconds")


def _int(v: Any) -> int | None:
    if type(v) is int:
        return v
    if type(v) is str and v.strip().isdigit() and len(v.strip()) < 19:
        return int(v)
    return None


def _cat(e: dict) -> str:
    c = e.get("cat")
    return c.lower() if type(c) is str else ""


def split_ranks(path: Path, doc: dict) -> list[tuple[int | None, dict, str]] | None:
    """The file's ranks as ``[(rank, trace document of that rank, how it was told apart)]``
    (rank None: numbered later by file order), or None for one process's trace. InputError when
    several processes launched GPU work and their GPU activity cannot be attributed."""
    events = [e for e in doc["traceEvents"] if type(e) is dict]
    by_label = _by_rank_label(events)
    if by_label is not None:
        groups, how = by_label
    else:
        by_pid = _by_process_label(events)
        if by_pid is not None:
            groups, how = by_pid
        else:
            attributed = _by_launching_process(path, events)
            if attributed is None:
                return None
            groups, how = attributed
    if len(groups) < 2:
        return None if by_label is None else [(r, _document(doc, evs), how) for r, evs in groups.items()]
    return [(r, _document(doc, evs), how) for r, evs in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))]


def _document(doc: dict, events: list[dict]) -> dict:
    out = {k: v for k, v in doc.items() if k not in _PER_CAPTURE and k != "traceEvents"}
    out["traceEvents"] = events
    return out


def _by_rank_label(events: list[dict]) -> tuple[dict[int, list[dict]], str] | None:
    """TraceFusion: ``args.rank`` on every event (metadata events without it go to every rank); a
    trace some of whose GPU activities lack it is not such a merge (an op may record a 'rank')."""
    ranks = [_int(e["args"].get("rank")) if type(e.get("args")) is dict else None for e in events]
    gpu = [r for r, e in zip(ranks, events) if e.get("ph") == "X" and _cat(e) in _GPU_CATS]
    if not gpu or any(r is None for r in gpu):
        return None
    labelled = {r for r, e in zip(ranks, events) if r is not None and e.get("ph") != "M"}
    groups: dict[int, list[dict]] = {r: [] for r in labelled}
    shared = [e for r, e in zip(ranks, events) if r is None]
    for r, e in zip(ranks, events):
        if r in groups:
            groups[r].append(e)
    for g in groups.values():
        g.extend(shared)
    return groups, "args.rank on every event (TraceLens TraceFusion)"


def _by_process_label(events: list[dict]) -> tuple[dict[int, list[dict]], str] | None:
    """Process ids labelled with a rank: ``process_name`` metadata ("RANK 3 - GPU", "Rank 3") or
    string process ids ("[TP03] 1234"); None unless every process with events has a label and
    there are at least two ranks."""
    label: dict[Any, int] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name" and type(e.get("args")) is dict:
            m = _RANK_LABEL.search(str(e["args"].get("name", "")))
            if m:
                label[e.get("pid")] = int(m.group(1))
    for pid in {e.get("pid") for e in events if type(e.get("pid")) is str}:
        m = _RANK_LABEL.search(pid)
        if m and pid not in label:
            label[pid] = int(m.group(1))
    pids = {e.get("pid") for e in events if e.get("ph") == "X"}
    if len(set(label.values())) < 2 or not pids <= set(label):
        return None
    groups: dict[int, list[dict]] = {}
    for e in events:
        r = label.get(e.get("pid"))
        if r is not None:
            groups.setdefault(r, []).append(e)
    return groups, "process names that carry the rank"


def _by_launching_process(path: Path, events: list[dict]) -> tuple[dict[int | None, list[dict]], str] | None:
    """Several host processes that launched GPU work (a concatenation of per-rank traces): each
    GPU activity goes to the process whose launch call with its correlation id started last before
    it; None when one process launched everything."""
    gpu = [e for e in events if e.get("ph") == "X" and _cat(e) in _GPU_CATS]
    callers = {e.get("pid") for e in events if e.get("ph") == "X" and _cat(e) in _LAUNCH_CATS
               and type(e.get("name")) is str and _LAUNCH_NAME.search(e["name"])}
    if len(callers) < 2:
        return None
    gpu_corr = {c for e in gpu if type(e.get("args")) is dict and (c := _int(e["args"].get("correlation"))) is not None}
    launches: dict[Any, dict[int, list[float]]] = {p: {} for p in callers}
    for e in events:
        if e.get("ph") == "X" and _cat(e) in _LAUNCH_CATS and type(e.get("args")) is dict and e.get("pid") in callers:
            c = _int(e["args"].get("correlation"))
            if c is not None and c in gpu_corr:
                launches[e.get("pid")].setdefault(c, []).append(_ts(e))
    owner: list[Any] = []
    for e in gpu:
        c = _int(e["args"].get("correlation")) if type(e.get("args")) is dict else None
        t = _ts(e)
        best, best_t = None, None
        for pid, by_corr in launches.items():
            for lt in by_corr.get(c, ()) if c is not None else ():
                if lt <= t and (best_t is None or lt > best_t):
                    best, best_t = pid, lt
        owner.append(best)
    by_gpu_pid: dict[Any, dict[Any, int]] = {}
    for e, o in zip(gpu, owner):
        if o is not None:
            votes = by_gpu_pid.setdefault(e.get("pid"), {})
            votes[o] = votes.get(o, 0) + 1
    unowned = [e for e, o in zip(gpu, owner) if o is None and not by_gpu_pid.get(e.get("pid"))]
    if unowned:
        raise InputError(f"{path}: {len(callers)} processes launched GPU work in this one file (pids "
                         f"{', '.join(map(str, sorted(callers, key=str)[:6]))}), without rank labels, and "
                         f"{len(unowned)} GPU activities match none of their launch calls; import each rank's own trace")
    owner = [o if o is not None else max(by_gpu_pid[e.get("pid")].items(), key=lambda kv: kv[1])[0]
             for e, o in zip(gpu, owner)]
    launches = {p: c for p, c in launches.items() if p in set(owner)}  # ranks are the processes that ran GPU work
    if len(launches) < 2:
        return None
    gpu_ids = {id(e) for e in gpu}
    first_device = {}
    for e, o in zip(gpu, owner):
        d = _int(e["args"].get("device")) if type(e.get("args")) is dict else None
        d = d if d is not None else _int(e.get("pid"))
        first_device[o] = min(first_device.get(o, 1 << 40), d if d is not None else 1 << 40)
    order = sorted(launches, key=lambda p: (first_device.get(p, 1 << 40), str(p)))
    groups: dict[int | None, list[dict]] = {}
    rank_of = {p: i for i, p in enumerate(order)}
    for e, o in zip(gpu, owner):
        groups.setdefault(rank_of[o], []).append(e)
    for e in events:
        if id(e) not in gpu_ids and e.get("pid") in rank_of:
            groups.setdefault(rank_of[e.get("pid")], []).append(e)
    how = ("the process that launched each GPU activity (no rank labels; ranks numbered by GPU index, then process id: "
           + ", ".join(f"rank {rank_of[p]} = pid {p}" for p in order) + ")")
    return groups, how


def _ts(e: dict) -> float:
    v = e.get("ts")
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")
