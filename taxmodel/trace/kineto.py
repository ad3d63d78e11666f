"""Import torch.profiler (Kineto) Chrome-trace JSON, one file per rank.

Why a hand-written reader rather than a generic Chrome-trace loader: Kineto writes ``ts``/``dur``
in microseconds with nanosecond decimals (``4440859589094.303``). Reading those as binary
floats loses digits (a 1e12 us timestamp has ~1e-4 us float resolution, and sums of rounded
values drift), so fractions are kept as decimal text by the parser and converted exactly to
integer nanoseconds (``_to_ns``); the per-event work after the parse is vectorized pandas.

What becomes a row (everything else -- cpu_op, python_function, flows, metadata -- is dropped):

- ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` -> kind kernel / memcpy / memset. Role: comm for
  NCCL/RCCL kernels (name or collective metadata), copy for memcpy/memset (comm for peer
  ``PtoP`` copies, which move data between GPUs), compute for other kernels.
- ``cuda_runtime`` / ``cuda_driver`` (and ``hip_*``) calls that enqueued GPU work (their
  ``correlation`` matches a GPU row, or the name is a launch/copy/graph-launch call) -> launch;
  calls that block the host on the GPU (``*Synchronize``) -> sync.
- ``cuda_sync`` "Stream Wait Event" records (PyTorch 2.1+: a ``cudaStreamWaitEvent``) -> wait,
  on the stream that waits (``args.stream``).
- ``user_annotation`` ranges (``record_function``; ``ProfilerStep#N``) -> marker. Old PyTorch
  versions filed ProfilerStep under ``cpu_op``; those are markers too.

Iterations come from the markers matching the iteration pattern (default ``ProfilerStep#N``),
see ``importers.assign_iterations``. Collectives carry ``collective_op`` (normalized),
``collective_id`` ``"<process group>:<sequence>"`` (the ``Seq`` argument where PyTorch records
it, else the order of that process group's collective kernels on the rank, see
``_fill_collectives`` -- which matches across ranks when every rank's trace covers the same
collectives) and ``bytes`` (the larger of the input and output message, in bytes).
"""
from __future__ import annotations

import copy
import re
from collections import Counter
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from taxmodel.errors import InputError
from taxmodel.trace import importers, ints, json_stream, kineto_merged, kineto_ops, memory, schema, vendor_common
from taxmodel.trace.op_costs import COLLECTIVE_CALL_ARGS, COMM_DTYPE_BYTES, recorded_group_size
from taxmodel.vocabulary import COMM_KERNEL as _COMM_KERNEL, kernel_collectives, normalize_collective

FORMAT = "kineto"

DEFAULT_ITERATION_PATTERN = r"^ProfilerStep#(\d+)$"
MAX_RANKS = 1 << 20  # a rank or world size beyond this is a damaged trace, not a cluster

_GPU_KIND = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"})
_HOST_RANGE_CATS = frozenset({"user_annotation"})
_GPU_RANGE_CATS = frozenset({"gpu_user_annotation"})
_WAIT_CATS = frozenset({"cuda_sync"})  # Kineto's records of waits (PyTorch 2.1+); stream waits become rows
_STREAM_WAIT = re.compile(r"(?i)^stream wait event$")

# ``\b(?=(\w*?X))\1`` takes the first X of a word once and for all (an atomic group that Python
# 3.10 can run): ``X\w*Y`` alone retries from every X of a long word, quadratic in its length.
_LAUNCH_CALL = re.compile(r"(?i)(?:\b(?=(\w*?launch))\1\w*kernel|graphlaunch|memcpy|memset)")
_SYNC_CALL = re.compile(r"(?i)synchronize")
_GRAPH_LAUNCH = re.compile(r"(?i)graphlaunch")
_PEER_COPY = re.compile(r"(?i)\bPtoP\b")

# Markers a sniffer can rely on in the first 64 KiB of a Kineto trace; a bare Chrome trace from
# another tool (rocprof's JSON, a browser trace) has none of them.
_SNIFF_MARKERS = (
    b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"', b'"cpu_op"',
    b'"user_annotation"', b'"cuda_runtime"', b'"cuda_driver"', b'"ac2g"', b'"python_function"',
    b'"PyTorch Profiler', b'"gpu_user_annotation"',
)


# --- exact JSON --------------------------------------------------------------------------------


def _to_ns(value: Any) -> int | None:
    """A time in microseconds (an int, or the decimal text of a fraction) as exact integer ns,
    or None when it is not a usable number."""
    t = type(value)
    if t is str:
        whole, _, frac = value.partition(".")
        v = None
        if len(frac) <= 3:
            try:  # the common case "123.456": the digits without the dot are the ns
                v = int(whole + frac.ljust(3, "0"))
            except ValueError:
                pass
        if v is None:  # sub-ns digits or an exponent: exact via Decimal, round half even
            try:
                d = Decimal(value)
            except InvalidOperation:
                return None
            if not d.is_finite() or d.adjusted() > 18:  # beyond int64 ns (and never expand 1e999999)
                return None
            v = round(d * 1000)
    elif t is int:
        v = value * 1000
    elif t is float and np.isfinite(value):
        v = round(Decimal(repr(value)) * 1000)
    else:
        return None
    return v if -(2**62) < v < 2**62 else None


# --- sniffing ----------------------------------------------------------------------------------


def sniff(path: Path, head: bytes, tables: set[str]) -> bool:
    """A Kineto trace: a JSON object or array with ``traceEvents`` and Kineto's own markers."""
    stripped = head.lstrip()
    if stripped[:1] not in (b"{", b"["):
        return False
    if b'"traceEvents"' not in head and not stripped.startswith(b"["):
        return False
    return any(m in head for m in _SNIFF_MARKERS)


# --- reading -----------------------------------------------------------------------------------


def read(paths: list[Path], *, iteration_pattern: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Read one Kineto trace per rank into events and partial meta (see the module docstring).

    Ranks come from ``distributedInfo.rank``. When no file records one, ranks are given in the
    order the files were passed (noted in ``meta['notes']``); when only some do, that is an
    error, since guessing would silently mislabel ranks.
    """
    return combine([parse(p, i, iteration_pattern=iteration_pattern) for i, p in enumerate(paths)],
                   iteration_pattern=iteration_pattern)


def parse(path: Path, index: int, *, iteration_pattern: str | None = None) -> list[tuple[Path, pd.DataFrame, dict]]:
    """One file of ``read`` (``importers``' per-file step): its ranks' rows (rank:
    distributedInfo's, else ``index``) and what ``combine`` needs of each. One rank per file,
    except a file several ranks were merged into (``kineto_merged``): one part per rank. The file
    streams by (``_scan``): only the columns of the events that become rows are kept, never the
    document; a merged file's ranks are split from those columns."""
    pattern = importers.compile_iteration_pattern(iteration_pattern or DEFAULT_ITERATION_PATTERN)
    path = Path(path)
    scan = _scan(path, pattern)
    dist = _dist_info(scan.top)
    rank, world = ints.whole_in_text(dist.get("rank")), ints.whole_in_text(dist.get("world_size"))
    for key, value in (("rank", rank), ("world_size", world)):  # recorded but unreadable: never guessed
        if value is None and dist.get(key) is not None:
            raise InputError(f"{path}: distributedInfo.{key} is {str(dist.get(key))[:40]!r}, not a whole number; the "
                             "trace is damaged")
    if rank is not None and not 0 <= rank < MAX_RANKS:
        raise InputError(f"{path}: distributedInfo.rank is {rank}, not a valid rank; the trace is damaged")
    if world is not None and not 0 < world <= MAX_RANKS:
        raise InputError(f"{path}: distributedInfo.world_size is {world}, not a valid world size; the trace is damaged")
    ranks = kineto_merged.split_ranks(path, _scanned(scan))
    if ranks is None:
        return [_parse_rank(path, scan, rank, index if rank is None else rank, world, pattern)]
    world = world if world is not None and world > max(r.rank for r in ranks) else None
    # one rank's columns at a time: each is taken from the file's and read before the next is
    return [_parse_rank(path, _rank_scan(scan, r, first=i == 0), r.rank, r.rank, world, pattern, merged=r.how)
            for i, r in enumerate(ranks)]


def _parse_rank(path: Path, scan: _Scan, rank: int | None, row_rank: int, world: int | None, pattern: re.Pattern,
                merged: str = "") -> tuple[Path, pd.DataFrame, dict]:
    """(path, rows, info) of one rank's scanned trace (its columns are taken over and released);
    ``merged``: how it was told apart from the other ranks of a merged file ("" for a file of its own)."""
    frame, keep, ranges_host, ranges_gpu, info = _read_one(path, scan, row_rank, pattern)
    # every row's iteration, those not kept too: none of them is a launch or a GPU row, so none
    # changes another's
    iteration = importers.assign_iterations(frame, ranges_host, ranges_gpu)
    own = frame.pop("_own_iteration").to_numpy()
    iteration[own >= 0] = own[own >= 0]
    info.update(rank=rank, world=world, iterations=int(ranges_host["iteration"].nunique()),
                markers=len(ranges_host) + len(ranges_gpu), merged=merged)
    columns = {name: frame[name].to_numpy() for name in frame.columns}
    columns["iteration"] = iteration
    del frame, iteration
    # the kept rows normalized here, one rank at a time, each column released as it is converted
    events = schema.events_from_columns(columns, np.flatnonzero(keep))
    memory.release_freed()  # the scan's columns and batches: not kept while the next file is read and joined
    return path, events, info


def combine(parts: list, *, iteration_pattern: str | None = None) -> tuple[pd.DataFrame, dict]:
    """``read``'s events and meta from every file's ``parse``, in the order given. ``parts`` is
    taken over: it is flattened in place to one entry per rank, whose frames are joined column by
    column (``schema.concat_events``: each rank's rows are held once)."""
    pattern = importers.compile_iteration_pattern(iteration_pattern or DEFAULT_ITERATION_PATTERN)
    parts[:] = [p for part in parts for p in (part if isinstance(part, list) else [part])]
    per_file = parts
    notes: list[str] = []
    merged = {p.name: (info["merged"], sum(1 for q, _, i in per_file if q == p and i.get("merged")))
              for p, _, info in per_file if info.get("merged")}
    for name, (how, n) in merged.items():
        notes.append(f"kineto: {name} holds {n} ranks merged into one file, told apart by {how}; each rank keeps its "
                     "own timestamps, and the clock offsets between them are estimated (the merge does not say which "
                     "host each rank ran on)")
    known = [info["rank"] is not None for _, _, info in per_file]
    if all(known):
        rank_source = "distributedInfo"
    elif not any(known):  # each frame already carries its position in the file order as rank
        rank_source = "file order"
        if len(per_file) > 1:
            order = ", ".join(f"{p.name}={i}" for i, (p, _, _) in enumerate(per_file))
            notes.append(f"kineto: traces record no rank (no distributedInfo); ranks assigned in the order given: {order}")
    else:
        missing = next(p for (p, _, _), k in zip(per_file, known) if not k)
        raise InputError(f"{missing}: the trace records no rank (distributedInfo.rank) while the others do; "
                         "import traces of one distributed run together")

    inputs, hardware, software = [], [], {}
    frames = [f for _, f, _ in per_file]
    per_file[:] = [(path, None, info) for path, _, info in per_file]  # the frames are concat_events' (below)
    for index, (path, _, info) in enumerate(per_file):
        rank = index if info["rank"] is None else info["rank"]
        source = "merged file" if info.get("merged") else rank_source
        inputs.append({"file": path.name, "ranks": [rank], "world_size": info["world"], "rank_source": source,
                       "iterations": info["iterations"], "gpu": (info["hardware"] or {}).get("name"),
                       "nccl": info["software"].get("nccl"),
                       "start_ns": int(frames[index]["start_ns"].min()) if len(frames[index]) else None})
        if info["hardware"]:
            hardware.append(info["hardware"])
        for k, v in info["software"].items():
            software.setdefault(k, v)
        if info["no_args"]:
            notes.append(f"kineto: {path.name}: {info['no_args']} of {info['gpu_rows']} GPU activities have no 'args' "
                         "object (null or missing): their launch call (correlation) is unknown, so their iteration comes "
                         "from GPU-side annotations only (-1 without them) and they carry no grid, bytes or collective")
        if info.get("without_group"):
            notes.append(f"kineto: {path.name}: {info['without_group']} collective kernel(s) record a message size but no "
                         "group size; their link floor is the fewest bytes any group of 2 or more ranks carries (a lower bound)")
        if info["markers"] == 0:
            notes.append(f"kineto: {path.name}: no iteration markers match {pattern.pattern!r}; its rows have iteration -1 "
                         "(pass --iteration-pattern to use your own record_function ranges)")

    events = schema.concat_events(frames) if frames else pd.DataFrame()
    worlds = {i["world_size"] for i in inputs if i["world_size"] is not None}
    meta = {
        "source": FORMAT,
        "world_size": worlds.pop() if len(worlds) == 1 else (None if worlds else len(per_file)),
        "ranks": sorted({i["ranks"][0] for i in inputs}),
        "hardware": _merge_hardware(hardware),
        "software": software,
        "capture": {"tracer": "torch.profiler (kineto)", "iteration_pattern": pattern.pattern,
                    "profiler": kineto_ops.merge_profiler_options([info["profiler"] for _, _, info in per_file])},
        "clock_domain": kineto_ops.clock_domain([info["host"] for _, _, info in per_file], [i["ranks"][0] for i in inputs]),
        "inputs": inputs,
        "notes": notes,
    }
    return events, meta


def _dist_info(top: dict) -> dict:
    info = top.get("distributedInfo")
    return info if isinstance(info, dict) else {}


# Categories as PyTorch 1.8-1.9 (2021) Kineto named them, mapped to today's names.
_LEGACY_CATS = {"operator": "cpu_op", "runtime": "cuda_runtime", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


def _category(cat: Any) -> str:
    if type(cat) is not str:
        return ""
    cat = cat.lower()
    return _LEGACY_CATS.get(cat, cat)


_WANTED_CATS = frozenset(_GPU_KIND) | _RUNTIME_CATS | _HOST_RANGE_CATS | _GPU_RANGE_CATS | _WAIT_CATS
_OP_ARGS = tuple(dict.fromkeys(("Input Dims", "Input type", "Concrete Inputs", "flops", "Input Strides", *COLLECTIVE_CALL_ARGS)))
"""The args of a cpu_op that its cost needs (``kineto_ops``), a collective's size included; the
rest of each op is dropped."""
_FLAG_CATS = frozenset({"python_function", "overhead"})  # what ``kineto_ops.EventFlags`` looks at
_GPU_INTS = ("device", "stream", "bytes", "graph id", "Seq", "In msg nelems", "Out msg nelems")


class _Scan:
    """What one trace file holds for the importer, gathered while it streams by (``_scan``):
    per selected event (the rows and iteration ranges to be) its columns; the cpu_ops (slim:
    name, tid and the args their cost needs) with exact times; the top-level keys; flags. What
    a merged file's split needs (``kineto_merged``): each event's and op's process (``proc``,
    ``ops_proc``: an index into ``procs``, the distinct (pid, args.rank) pairs) and the
    ``process_name`` metadata by pid."""

    def __init__(self) -> None:
        self.cols: dict[str, list] = {k: [] for k in (
            "cat", "name", "start", "end", "has_args", "tid", "proc", "correlation", *_GPU_INTS,
            "grid", "block", "graph_node", "coll_name", "pg", "dtype_bytes", "group_size")}
        self.ops: list[dict] = []
        self.ops_start: list[int] = []
        self.ops_end: list[int] = []
        self.ops_proc: list[int] = []
        self.procs: list[tuple[Any, int | None]] = []
        self._proc_codes: dict[tuple, int] = {}
        self.process_names: dict[Any, str] = {}
        self.flags = kineto_ops.EventFlags()
        self.pids: set[int] = set()
        self.top: dict = {}

    def proc(self, pid: Any, rank: Any) -> int:
        """The index in ``procs`` of an event's process: its pid (an int or a string; else None)
        and ``args.rank`` (``ints.nonneg``)."""
        key = (pid if type(pid) is int or type(pid) is str else None, rank if type(rank) is int or type(rank) is str else None)
        code = self._proc_codes.get(key)
        if code is None:
            code = self._proc_codes[key] = len(self.procs)
            self.procs.append((key[0], ints.nonneg(key[1], None)))
        return code

    def see_process_name(self, e: dict) -> None:
        a, pid = e.get("args"), e.get("pid")
        if type(a) is dict and type(a.get("name")) is str and (type(pid) is int or type(pid) is str):
            self.process_names[pid] = a["name"]


def _scan(path: Path, pattern: re.Pattern) -> _Scan:
    """Stream ``path`` (``json_stream``) once, keeping per batch only the columns of the events
    that matter (``_WANTED_CATS``, iteration markers filed as cpu_op) and the cpu_ops, as arrays:
    memory in proportion to the rows, not to the document."""
    stream = json_stream.TraceStream(path)
    out = _Scan()
    cols = out.cols
    flags = out.flags
    cat_cache: dict = {}
    marker_cache: dict = {}
    dims_cache: dict = {}
    names_seen: dict = {}
    empty: dict = {}
    seen = 0
    for batch in stream.batches():
        b: dict[str, list] = {k: [] for k in cols}
        raw_ts, raw_dur = [], []
        for e in batch:
            seen += 1
            if type(e) is not dict:
                continue
            raw_cat = e.get("cat")
            cat = cat_cache.get(raw_cat) if type(raw_cat) is str else ""
            if cat is None:
                cat = cat_cache[raw_cat] = _category(raw_cat)
            name = e.get("name")
            if raw_cat in _FLAG_CATS or name == "[memory]":
                flags.see(e)
            if cat == "cpu_op" and seen <= 2000 and (v := ints.whole_in_text(e.get("pid"))) is not None:
                out.pids.add(v)
            ph = e.get("ph")
            if ph != "X":
                if ph == "M" and name == "process_name":
                    out.see_process_name(e)
                continue
            if cat not in _WANTED_CATS:
                if cat != "cpu_op":
                    continue
                is_marker = marker_cache.get(name) if type(name) is str else False
                if is_marker is None:
                    is_marker = marker_cache[name] = bool(pattern.search(name))
                if not is_marker:  # an op: its cost may be needed for the kernels it launched
                    a = e.get("args")
                    slim = {"name": name, "tid": e.get("tid")}
                    if type(a) is dict:
                        slim["args"] = {k: a[k] for k in _OP_ARGS if k in a}
                    out.ops.append(slim)
                    out.ops_proc.append(out.proc(e.get("pid"), a.get("rank") if type(a) is dict else None))
                    out.ops_start.append(_to_ns(e.get("ts")) or 0)
                    out.ops_end.append(max(_to_ns(e.get("dur")) or 0, 0))
                    continue
            a = e.get("args")
            has_args = type(a) is dict
            if not has_args:
                a = empty
            b["cat"].append(cat)
            if type(name) is str:  # one object per distinct name: a trace repeats few
                name = names_seen.setdefault(name, name)
            else:
                name = ""
            b["name"].append(name)
            raw_ts.append(e.get("ts"))
            raw_dur.append(e.get("dur"))
            b["has_args"].append(has_args)
            v = ints.whole_in_text(e.get("tid"))
            b["tid"].append(-1 if v is None else v)
            b["proc"].append(out.proc(e.get("pid"), a.get("rank")))
            v = ints.whole_in_text(a.get("correlation"))
            b["correlation"].append(-1 if v is None else v)
            if cat in _GPU_KIND:
                for k in _GPU_INTS:
                    v = a.get(k)
                    if v is not None:  # most are absent: no call for those
                        v = ints.whole_in_text(v)
                    b[k].append(-1 if v is None else v)
                b["grid"].append(_dims(a.get("grid"), dims_cache))
                b["block"].append(_dims(a.get("block"), dims_cache))
                b["graph_node"].append(a.get("graph node id") is not None)
                cname = a.get("Collective name")
                b["coll_name"].append(cname if type(cname) is str else "")
                pg = a.get("Process Group Name")
                b["pg"].append(str(pg) if pg is not None else None)
                b["dtype_bytes"].append(COMM_DTYPE_BYTES.get(str(a.get("dtype", "")).lower(), 0))
                grouped = "Group size" in a or "Process Group Ranks" in a  # what recorded_group_size reads
                b["group_size"].append(recorded_group_size(a) if grouped else -1)
            else:
                stream_arg = ints.whole_in_text(a.get("stream")) if cat in _WAIT_CATS else None
                for k in _GPU_INTS:
                    b[k].append(-1)
                b["stream"][-1] = -1 if stream_arg is None else stream_arg
                b["grid"].append("")
                b["block"].append("")
                b["graph_node"].append(False)
                b["coll_name"].append("")
                b["pg"].append(None)
                b["dtype_bytes"].append(0)
                b["group_size"].append(-1)
        start = [_to_ns(t) for t in raw_ts]
        dur = [_to_ns(d) for d in raw_dur]
        bad = next((i for i, (t, d) in enumerate(zip(start, dur)) if t is None or d is None), None)
        if bad is not None:
            field = "ts" if start[bad] is None else "dur"
            raise InputError(f"{path}: {b['cat'][bad] or 'event'} {b['name'][bad]!r} has no usable '{field}' "
                             f"({(raw_ts if field == 'ts' else raw_dur)[bad]!r}); the trace is damaged, export it again")
        b["start"] = start
        b["end"] = dur
        _append_columns(cols, b)
        del batch
    out.top = stream.top
    if not stream.found_events:
        raise InputError(f"{path}: no 'traceEvents' list; is this a torch.profiler (Chrome trace) JSON file?")
    return out


_OBJECT_COLUMNS = ("cat", "name", "grid", "block", "coll_name", "pg")
_BOOL_COLUMNS = ("has_args", "graph_node")


def _append_columns(cols: dict[str, list], batch: dict[str, list]) -> None:
    """One batch's columns as arrays (ints as int64: 8 bytes a value, not a Python int's 36)."""
    start = np.asarray(batch["start"], dtype=np.int64)
    batch["end"] = start + np.asarray(batch["end"], dtype=np.int64)
    batch["start"] = start
    for k, values in batch.items():
        if isinstance(values, np.ndarray):
            cols[k].append(values)
        elif k in _OBJECT_COLUMNS:
            cols[k].append(np.array(values, dtype=object) if values else np.zeros(0, dtype=object))
        elif k in _BOOL_COLUMNS:
            cols[k].append(np.asarray(values, dtype=bool))
        else:
            cols[k].append(np.asarray(values, dtype=np.int64))


def _column(scan: _Scan, key: str) -> np.ndarray:
    parts = scan.cols[key]
    if not parts:
        return np.zeros(0, dtype=object if key in _OBJECT_COLUMNS else bool if key in _BOOL_COLUMNS else np.int64)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _join_columns(scan: _Scan) -> None:
    """Each of the scan's columns as one array (one column at a time: never a second copy of
    them all), and the ops' times as arrays."""
    for k in scan.cols:
        scan.cols[k] = [_column(scan, k)]
    scan.ops_start = np.asarray(scan.ops_start, dtype=np.int64)
    scan.ops_end = np.asarray(scan.ops_end, dtype=np.int64)


def _proc_pids(scan: _Scan) -> np.ndarray:
    """The pid of each of ``scan.procs`` as a number (-1 where it is none)."""
    return np.array([-1 if (v := ints.whole_in_text(p)) is None else v for p, _ in scan.procs], dtype=np.int64)


def _scanned(scan: _Scan) -> kineto_merged.Scanned:
    """What ``kineto_merged.split_ranks`` reads of a scanned file (the columns joined, not copied)."""
    _join_columns(scan)
    col = {k: _column(scan, k) for k in ("cat", "name", "start", "correlation", "device", "proc")}
    codes, cats = pd.factorize(col["cat"])
    return kineto_merged.Scanned(
        proc=col["proc"], gpu=np.isin(codes, [i for i, c in enumerate(cats) if c in _GPU_KIND]),
        runtime=np.isin(codes, [i for i, c in enumerate(cats) if c in _RUNTIME_CATS]), name=col["name"],
        start=col["start"], correlation=col["correlation"], device=col["device"],
        ops_proc=np.asarray(scan.ops_proc, dtype=np.int64), procs=scan.procs, process_names=scan.process_names)


def _rank_scan(scan: _Scan, part: kineto_merged.Rank, first: bool) -> _Scan:
    """One rank of a merged file as a scan of its own: its rows' and ops' columns; the file's
    top-level keys but those of one capture (``kineto_merged.PER_CAPTURE``); of the first pids
    (``_Scan.pids``) those of its processes; the profiler's overhead counted once, with the first
    rank (``kineto_ops.merge_profiler_options`` adds up the ranks')."""
    sub = _Scan()
    sub.cols = {k: [_column(scan, k)[part.rows]] for k in scan.cols}
    sub.ops = [scan.ops[i] for i in part.ops]
    sub.ops_start, sub.ops_end = scan.ops_start[part.ops], scan.ops_end[part.ops]
    sub.procs, sub.process_names = scan.procs, scan.process_names
    sub.flags = copy.copy(scan.flags)
    if not first:
        sub.flags.overhead_ns = 0
    own = set(np.unique(_column(scan, "proc")[part.rows]).tolist()) | set(np.unique(np.asarray(scan.ops_proc)[part.ops]).tolist())
    sub.pids = scan.pids & {v for v in _proc_pids(scan)[sorted(own)].tolist() if v >= 0}
    sub.top = {k: v for k, v in scan.top.items() if k not in kineto_merged.PER_CAPTURE}
    return sub


def _read_one(path: Path, scan: _Scan, rank: int, pattern: re.Pattern
              ) -> tuple[pd.DataFrame, np.ndarray, pd.DataFrame, pd.DataFrame, dict]:
    """Rows of one rank's trace with the mask of those that become events (every GPU row among
    them), its host and GPU iteration ranges, and its hardware/software."""
    col = {k: _column(scan, k) for k in scan.cols}
    scan.cols.clear()
    cats = pd.Series(col["cat"], dtype=object)
    names = _clean_names(col["name"])
    start_ns, end_ns = col["start"], col["end"]
    n = len(cats)

    gpu_kind = cats.map(_GPU_KIND)
    is_gpu = gpu_kind.notna().to_numpy()
    gpu_idx = np.flatnonzero(is_gpu)
    no_args = int((~col["has_args"][gpu_idx]).sum())
    correlation = col["correlation"]
    is_runtime = cats.isin(_RUNTIME_CATS).to_numpy()
    is_host_range = cats.isin(_HOST_RANGE_CATS | {"cpu_op"}).to_numpy()
    is_gpu_range = cats.isin(_GPU_RANGE_CATS).to_numpy()

    kind = np.full(n, "", dtype=object)
    kind[is_gpu] = gpu_kind.to_numpy()[is_gpu]
    gpu_corr = np.unique(correlation[is_gpu & (correlation >= 0)])
    linked = np.isin(correlation, gpu_corr) & (correlation >= 0)
    is_launch = is_runtime & (linked | _name_matches(names, _LAUNCH_CALL))
    is_sync = is_runtime & ~is_launch & _name_matches(names, _SYNC_CALL)
    kind[is_launch] = "launch"
    kind[is_sync] = "sync"
    kind[is_host_range] = "marker"
    is_wait = cats.isin(_WAIT_CATS).to_numpy() & _name_matches(names, _STREAM_WAIT)
    kind[is_wait] = "wait"
    keep = kind != ""

    tid = col["tid"]
    device = np.full(n, -1, dtype=np.int64)
    stream = tid.copy()
    if len(gpu_idx):
        pid = _proc_pids(scan)[col["proc"][gpu_idx]]
        dev_arg, stream_arg = col["device"][gpu_idx], col["stream"][gpu_idx]
        dev = np.where(dev_arg >= 0, dev_arg, pid)
        device[gpu_idx] = np.where((dev >= 0) & (dev < 2**31), dev, -1)
        stream[gpu_idx] = np.where(stream_arg >= 0, stream_arg, tid[gpu_idx])
    if is_wait.any():  # the stream whose later work waits (args.stream; wait_on_stream is the other)
        stream[is_wait] = col["stream"][is_wait]

    frame = pd.DataFrame({
        "rank": np.full(n, rank, dtype=np.int64), "device": device, "stream": stream,
        "kind": kind, "role": "other", "name": names.to_numpy(), "start_ns": start_ns, "end_ns": end_ns,
        "correlation": correlation, "collective_id": "", "collective_op": "",
        "graph_id": -1, "grid": "", "block": "", "bytes": -1,
    }, copy=False)  # one block per column: each can be released on its own (``_parse_rank``)
    for k in ("cat", "name", "start", "end", "proc", "device", "has_args"):  # in the frame now
        del col[k]
    del cats, start_ns, end_ns
    if len(gpu_idx):
        _fill_gpu_details(frame, gpu_idx, col)
        _fill_graph_ids(frame, gpu_idx, is_launch, col)

    # Iteration ranges: host markers and GPU-side annotations whose name matches the pattern.
    number = importers.iteration_numbers(names, pattern)
    host = is_host_range & (number >= 0)
    gpu_range = is_gpu_range & (number >= 0)
    host_ranges = frame.loc[host, ["rank", "start_ns", "end_ns"]].assign(iteration=number[host])
    gpu_ranges = frame.loc[gpu_range, ["rank", "start_ns", "end_ns"]].assign(iteration=number[gpu_range])
    frame["_own_iteration"] = np.where(is_host_range, number, -1)

    launched = np.isin(correlation[gpu_idx], correlation[is_launch]) & (correlation[gpu_idx] >= 0)
    _fill_collectives(frame, gpu_idx, col, launched)
    ops = scan.ops
    ops_start = np.asarray(scan.ops_start, dtype=np.int64)
    ops_end = ops_start + np.asarray(scan.ops_end, dtype=np.int64)
    linked_ops = kineto_ops.attach_op_costs(frame, col["group_size"], gpu_idx, is_launch, tid, ops, ops_start, ops_end,
                                            col["pg"], kineto_ops.process_group_sizes(_dist_info(scan.top)))
    col.clear()
    info = {"hardware": _hardware(scan.top, frame), "software": _software(scan.top),
            "profiler": kineto_ops.profiler_options(scan.top, scan.flags, ops, linked_ops),
            "host": _host_identity(scan.top, scan.pids, frame), "gpu_rows": len(gpu_idx), "no_args": no_args,
            "without_group": linked_ops.get("collectives_without_group", 0)}
    return frame, keep, host_ranges, gpu_ranges, info


def _clean_names(names: np.ndarray) -> pd.Series:
    """Names as an object Series; lone UTF-16 surrogates (legal in JSON escapes, not storable in
    parquet) become U+FFFD. Checked once per distinct name."""
    codes, uniques = pd.factorize(pd.Series(names, dtype=object))
    clean = np.array([u.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for u in uniques], dtype=object)
    return pd.Series(clean[codes] if len(codes) else np.array([], dtype=object), dtype=object)


def _name_matches(names: pd.Series, regex: re.Pattern) -> np.ndarray:
    """``regex.search`` on every name, evaluated once per distinct name (a trace repeats few)."""
    codes, uniques = pd.factorize(names)
    hits = np.array([bool(regex.search(u)) for u in uniques], dtype=bool)
    return hits[codes] if len(codes) else np.zeros(0, dtype=bool)


def _fill_gpu_details(frame: pd.DataFrame, gpu_idx: np.ndarray, col: dict[str, np.ndarray]) -> None:
    """Role, grid, block and bytes of the GPU rows (positions ``gpu_idx``)."""
    kind = frame["kind"].to_numpy()[gpu_idx]
    names = frame["name"].iloc[gpu_idx]
    has_collective = col["coll_name"][gpu_idx] != ""
    comm_name = _name_matches(names, _COMM_KERNEL)
    peer = _name_matches(names, _PEER_COPY)
    role = np.full(len(gpu_idx), "compute", dtype=object)
    role[(kind == "kernel") & (comm_name | has_collective)] = "comm"
    role[kind != "kernel"] = "copy"
    role[(kind == "memcpy") & peer] = "comm"
    cols = frame.columns
    frame.iloc[gpu_idx, cols.get_loc("role")] = role
    frame.iloc[gpu_idx, cols.get_loc("grid")] = col["grid"][gpu_idx]
    frame.iloc[gpu_idx, cols.get_loc("block")] = col["block"][gpu_idx]
    frame.iloc[gpu_idx, cols.get_loc("bytes")] = col["bytes"][gpu_idx]
    frame.iloc[gpu_idx, cols.get_loc("graph_id")] = col["graph id"][gpu_idx]


def _dims(value: Any, cache: dict) -> str:
    """Grid/block dims ``[x, y, z]`` as ``"x,y,z"``; cached since a trace repeats few shapes."""
    if type(value) is not list:
        return ""
    try:
        key = tuple(value)
        text = cache.get(key)
    except TypeError:  # unhashable members: not dims
        return ""
    if text is None:
        text = ",".join(str(v) for v in value) if value and all(type(v) is int for v in value) else ""
        cache[key] = text
    return text


def _fill_graph_ids(frame: pd.DataFrame, gpu_idx: np.ndarray, is_launch: np.ndarray, col: dict[str, np.ndarray]) -> None:
    """``graph id`` comes from the kernel's args; a graph kernel without one (only ``graph node
    id``, or launched by ``cudaGraphLaunch``) gets its graph launch's correlation id instead, which
    still groups the kernels of one graph launch together."""
    corr = frame["correlation"].to_numpy()
    graph_launch = is_launch & _name_matches(frame["name"], _GRAPH_LAUNCH)
    has_node = col["graph_node"][gpu_idx]
    gpu_corr = corr[gpu_idx]
    from_graph = has_node | np.isin(gpu_corr, corr[graph_launch])
    graph_id = frame["graph_id"].to_numpy()[gpu_idx]
    fill = from_graph & (graph_id < 0) & (gpu_corr >= 0)
    frame.iloc[gpu_idx[fill], frame.columns.get_loc("graph_id")] = gpu_corr[fill]


def _fill_collectives(frame: pd.DataFrame, gpu_idx: np.ndarray, col: dict[str, np.ndarray], launched: np.ndarray) -> None:
    """collective_op, collective_id and message bytes of communication kernels.

    Sequence numbers: PyTorch's ``Seq`` where every kernel of the process group carries one;
    otherwise the order of the group's collective kernels on this rank, counted from the first
    one whose launch call is in the trace. Kernels enqueued before profiling started (no launch
    recorded) show up on some ranks and not others; they get negative numbers (-1 for the last
    one before the first launched collective), so that they never shift the numbering of the
    collectives every rank recorded."""
    sel = (frame["kind"].to_numpy()[gpu_idx] == "kernel") & (frame["role"].to_numpy()[gpu_idx] == "comm")
    idx = gpu_idx[sel]
    if len(idx) == 0:
        return
    coll_name = col["coll_name"][idx]
    # PyTorch's metadata where recorded, else the kernel's name read as every importer reads it
    # (NCCL, RCCL, MSCCL, ``...KernelDebug_``; UNKNOWN_COLLECTIVE when the name says no collective).
    from_name = kernel_collectives(frame["name"].iloc[idx]).to_numpy()
    ops = [normalize_collective(cname) if cname else op for cname, op in zip(coll_name, from_name)]
    pg = np.array([p if p is not None else "default" for p in col["pg"][idx]], dtype=object)
    seq = col["Seq"][idx]
    nelems = np.maximum(col["In msg nelems"][idx], col["Out msg nelems"][idx])
    width = col["dtype_bytes"][idx]

    coll = pd.DataFrame({"pg": pg, "seq": seq, "start": frame["start_ns"].to_numpy()[idx], "pos": np.arange(len(idx)),
                         "launched": launched[sel]})
    coll = coll.sort_values(["start", "pos"], kind="stable")
    by_pg = coll.groupby("pg", sort=False)
    order = by_pg.cumcount().to_numpy()
    coll["order"] = order
    first_launched = coll["order"].where(coll["launched"]).groupby(coll["pg"], sort=False).transform("min").fillna(0)
    all_seq = by_pg["seq"].transform("min").to_numpy() >= 0
    coll["n"] = np.where(all_seq, coll["seq"].to_numpy(), order - first_launched.to_numpy(dtype=np.int64))
    coll = coll.sort_values("pos")
    cols = frame.columns
    frame.iloc[idx, cols.get_loc("collective_op")] = ops
    frame.iloc[idx, cols.get_loc("collective_id")] = (coll["pg"] + ":" + coll["n"].astype(str)).to_numpy()
    msg_bytes = np.where((nelems > 0) & (width > 0), nelems * width, frame["bytes"].to_numpy()[idx])
    frame.iloc[idx, cols.get_loc("bytes")] = msg_bytes


def _hardware(doc: dict, frame: pd.DataFrame) -> dict:
    """The rank's GPU from ``deviceProperties``: the device most of its GPU rows ran on."""
    props = [p for p in doc.get("deviceProperties") or [] if isinstance(p, dict)] if isinstance(doc.get("deviceProperties"), list) else []
    if not props:  # older traces, and files merged by other tools, drop the device table: the kernels may still say
        hint = vendor_common.arch_from_kernel_names(frame.loc[frame["kind"] == "kernel", "name"])
        return {"vendor": "nvidia", "arch_hint": hint} if hint else {}
    devices = frame.loc[frame["device"] >= 0, "device"]
    used = int(devices.mode().iloc[0]) if len(devices) else None
    prop = next((p for p in props if ints.whole_in_text(p.get("id")) == used), props[0])
    name = str(prop.get("name", ""))
    hw = {"name": name, "vendor": _vendor(name, doc), "devices_per_host": len(props)}
    for key, src in (("num_sms", "numSms"), ("memory_bytes", "totalGlobalMem"), ("warp_size", "warpSize")):
        v = ints.whole_in_text(prop.get(src))
        if v is not None:
            hw[key] = v
    major, minor = ints.whole_in_text(prop.get("computeMajor")), ints.whole_in_text(prop.get("computeMinor"))
    if major is not None:
        hw["compute_capability"] = f"{major}.{minor or 0}"
    if isinstance(prop.get("gcnArchName"), str):
        hw["arch"] = prop["gcnArchName"]
    return hw


def _vendor(name: str, doc: dict) -> str:
    low = name.lower()
    if "nvidia" in low or "cuda_runtime_version" in doc:
        return "nvidia"
    if any(t in low for t in ("amd", "instinct", "radeon", "mi300", "mi250")) or "hip_runtime_version" in doc:
        return "amd"
    return ""


def _software(doc: dict) -> dict:
    sw: dict[str, Any] = {}
    for key in ("cuda_runtime_version", "cuda_driver_version"):
        v = ints.whole_in_text(doc.get(key))
        if v is not None and v > 0:
            sw[key.replace("_version", "")] = f"{v // 1000}.{(v % 1000) // 10}"
    v = ints.whole_in_text(doc.get("cupti_version"))
    if v is not None:
        sw["cupti"] = str(v)
    nccl = _dist_info(doc).get("nccl_version")
    if isinstance(nccl, str) and nccl:
        sw["nccl"] = nccl
    backend = _dist_info(doc).get("backend")
    if isinstance(backend, str) and backend:
        sw["distributed_backend"] = backend
    return sw


def _merge_hardware(per_rank: list[dict]) -> dict:
    """One hardware description; ranks on different GPU models are listed, not hidden."""
    if not per_rank:
        return {}
    names = Counter(h.get("name", "") for h in per_rank)
    merged = dict(per_rank[0])
    if len(names) > 1:
        merged["name"] = " + ".join(sorted(n for n in names if n))
        merged["mixed"] = True
    return merged


def _host_identity(top: dict, pids: set, frame: pd.DataFrame) -> dict:
    """What says which host and clock a rank's trace came from (``kineto_ops.clock_domain``):
    ``pids`` are those of the cpu_op events among the trace's first 2,000 events."""
    devices = sorted(int(d) for d in frame.loc[frame["device"] >= 0, "device"].unique())
    props = top.get("deviceProperties")
    return {"host_name": top.get("host_name") if isinstance(top.get("host_name"), str) else None,
            "base_time_ns": ints.whole_in_text(top.get("baseTimeNanoseconds")), "pids": sorted(pids), "devices": devices,
            "devices_per_host": len(props) if isinstance(props, list) else None}
