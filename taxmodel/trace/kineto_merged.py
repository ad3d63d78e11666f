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
(ledger/clock.py) rather than assumed shared.

The split works on the columns the streaming reader keeps (``kineto._scan``), never on the
document: per event that becomes a row, and per cpu_op, the process it ran in as an index into the
file's distinct (pid, ``args.rank``) pairs; the ``process_name`` metadata by pid. A rank is a set
of row and op positions, read from the same columns as a file of its own.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from taxmodel.errors import InputError
from taxmodel.trace import ints

_LAUNCH_NAME = re.compile(r"(?i)launch|memcpy|memset")
_RANK_LABEL = re.compile(r"(?i)(?:\brank|\[\s*(?:tp|dp|pp|ep))\s*0*(\d{1,7})\b")
#: the top-level fields that describe one process's capture, dropped from the split ranks (they
#: came from one of the merged files, or were made up by the merger)
PER_CAPTURE = ("distributedInfo", "host_name", "baseTimeNanoseconds")
_NONE = 1 << 40  # "no device": after every real one


class Scanned(NamedTuple):
    """What the split reads of one scanned file. Per selected event (a row to be): ``proc``, its
    process as an index into ``procs``; whether it is GPU activity (``gpu``) or a runtime call
    (``runtime``); its ``name``, ``start`` (ns), ``correlation`` and ``device`` (args.device; -1
    unknown). Per cpu_op: ``ops_proc``. ``procs``: the distinct (pid, args.rank) pairs of those
    events (``ints.nonneg``; None unrecorded); ``process_names``: ``process_name`` metadata by pid."""
    proc: np.ndarray
    gpu: np.ndarray
    runtime: np.ndarray
    name: np.ndarray
    start: np.ndarray
    correlation: np.ndarray
    device: np.ndarray
    ops_proc: np.ndarray
    procs: list[tuple[Any, int | None]]
    process_names: dict[Any, str]


class Rank(NamedTuple):
    """One rank of a merged file: the positions of its rows (``rows``) and cpu_ops (``ops``) in
    the scanned columns, and how it was told apart from the others."""
    rank: int
    rows: np.ndarray
    ops: np.ndarray
    how: str


def split_ranks(path: Path, scanned: Scanned) -> list[Rank] | None:
    """The file's ranks, in rank order, or None for one process's trace. InputError when several
    processes launched GPU work and their GPU activity cannot be attributed."""
    by_label = _by_rank_label(scanned)
    if by_label is not None:  # a TraceFusion file of one rank still names it
        return by_label
    ranks = _by_process_label(scanned)
    if ranks is None:
        ranks = _by_launching_process(path, scanned)
    return ranks if ranks is not None and len(ranks) >= 2 else None


def _ranks(row_label: np.ndarray, op_label: np.ndarray, labels: list[int], how: str,
           shared_rows: np.ndarray | None = None, shared_ops: np.ndarray | None = None) -> list[Rank]:
    """One ``Rank`` per label: the rows and ops so labelled, and those ``shared`` by every rank."""
    out = []
    for r in sorted(labels):
        rows, ops = row_label == r, op_label == r
        if shared_rows is not None:
            rows, ops = rows | shared_rows, ops | shared_ops
        out.append(Rank(int(r), np.flatnonzero(rows), np.flatnonzero(ops), how))
    return out


def _by_rank_label(s: Scanned) -> list[Rank] | None:
    """TraceFusion: ``args.rank`` on every event (events without it go to every rank); a trace
    some of whose GPU activities lack it is not such a merge (an op may record a 'rank')."""
    rank_of = np.array([-1 if r is None else r for _, r in s.procs], np.int64)
    if not (rank_of >= 0).any():
        return None
    row_rank, op_rank = rank_of[s.proc], rank_of[s.ops_proc]
    if not s.gpu.any() or (row_rank[s.gpu] < 0).any():
        return None
    labels = set(np.unique(row_rank[row_rank >= 0]).tolist()) | set(np.unique(op_rank[op_rank >= 0]).tolist())
    return _ranks(row_rank, op_rank, list(labels), "args.rank on every event (TraceLens TraceFusion)",
                  row_rank < 0, op_rank < 0)


def _by_process_label(s: Scanned) -> list[Rank] | None:
    """Process ids labelled with a rank: ``process_name`` metadata ("RANK 3 - GPU", "Rank 3") or
    string process ids ("[TP03] 1234"); None unless every process with rows or ops has a label and
    there are at least two ranks."""
    label: dict[Any, int] = {}
    for pid, name in s.process_names.items():
        m = _RANK_LABEL.search(name)
        if m:
            label[pid] = int(m.group(1))
    pids = {pid for pid, _ in s.procs}
    for pid in pids:
        m = _RANK_LABEL.search(pid) if type(pid) is str else None
        if m and pid not in label:
            label[pid] = int(m.group(1))
    if len(set(label.values())) < 2 or not pids <= set(label):
        return None
    proc_label = np.array([label[pid] for pid, _ in s.procs], np.int64)
    return _ranks(proc_label[s.proc], proc_label[s.ops_proc], list(set(label[p] for p in pids)),
                  "process names that carry the rank")


def _by_launching_process(path: Path, s: Scanned) -> list[Rank] | None:
    """Several host processes that launched GPU work (a concatenation of per-rank traces): each
    GPU activity goes to the process whose launch call with its correlation id started last before
    it (else to the process that launched most of the rest of its GPU's work); None when one
    process launched everything."""
    pids = list(dict.fromkeys(pid for pid, _ in s.procs))
    pid_code = {p: i for i, p in enumerate(pids)}
    proc_pid = np.array([pid_code[p] for p, _ in s.procs], np.int64)
    row_pid = proc_pid[s.proc]
    codes, names = pd.factorize(pd.Series(s.name[s.runtime], dtype=object))
    hits = np.array([type(n) is str and bool(_LAUNCH_NAME.search(n)) for n in names], bool)
    launch = np.flatnonzero(s.runtime)[hits[codes]] if len(codes) else np.zeros(0, np.int64)
    callers = np.unique(row_pid[launch])
    if len(callers) < 2:
        return None
    g = np.flatnonzero(s.gpu)
    launch = launch[s.correlation[launch] >= 0]
    left = pd.DataFrame({"start": s.start[g], "corr": s.correlation[g], "pos": np.arange(len(g))})
    right = pd.DataFrame({"start": s.start[launch], "corr": s.correlation[launch], "owner": row_pid[launch]})
    left = left[left["corr"] >= 0].sort_values("start", kind="stable")
    matched = pd.merge_asof(left, right.sort_values("start", kind="stable"), on="start", by="corr", direction="backward")
    owner = np.full(len(g), -1, np.int64)
    owner[matched["pos"].to_numpy()] = matched["owner"].fillna(-1).to_numpy(np.int64)
    gpu_pid = row_pid[g]
    votes = pd.DataFrame({"gpu_pid": gpu_pid, "owner": owner})[owner >= 0]
    usual = votes.groupby(["gpu_pid", "owner"]).size().sort_values(ascending=False, kind="stable") \
        .reset_index().drop_duplicates("gpu_pid").set_index("gpu_pid")["owner"]
    fill = pd.Series(gpu_pid).map(usual).fillna(-1).to_numpy(np.int64)
    unowned = int(((owner < 0) & (fill < 0)).sum())
    if unowned:
        shown = ", ".join(map(str, sorted((pids[c] for c in callers), key=str)[:6]))
        raise InputError(f"{path}: {len(callers)} processes launched GPU work in this one file (pids {shown}), without "
                         f"rank labels, and {unowned} GPU activities match none of their launch calls; import each "
                         "rank's own trace")
    owner = np.where(owner >= 0, owner, fill)
    owners = np.unique(owner)  # ranks are the processes that ran GPU work
    if len(owners) < 2:
        return None
    pid_int = np.array([_NONE if (v := ints.nonneg(p, None)) is None else v for p in pids], np.int64)
    dev = s.device[g]
    dev = np.where(dev >= 0, dev, pid_int[gpu_pid])
    first = pd.Series(dev).groupby(owner).min()
    order = sorted(owners.tolist(), key=lambda p: (int(first.get(p, _NONE)), str(pids[p])))
    rank_of = np.full(len(pids), -1, np.int64)
    rank_of[order] = np.arange(len(order))
    row_rank = rank_of[row_pid]
    row_rank[g] = rank_of[owner]
    op_rank = rank_of[proc_pid[s.ops_proc]]
    how = ("the process that launched each GPU activity (no rank labels; ranks numbered by GPU index, then process id: "
           + ", ".join(f"rank {r} = pid {pids[p]}" for r, p in enumerate(order)) + ")")
    return _ranks(row_rank, op_rank, list(range(len(order))), how)
