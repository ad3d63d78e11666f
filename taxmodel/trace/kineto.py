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

import gc
import json
import re
from collections import Counter
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from taxmodel.errors import InputError
from taxmodel.trace import importers, inflate, kineto_merged, kineto_ops, vendor_common
from taxmodel.trace.op_costs import COMM_DTYPE_BYTES
from taxmodel.trace.vocabulary import COMM_KERNEL as _COMM_KERNEL, kernel_collectives, normalize_collective

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


def load_json(path: Path) -> Any:
    """Parse a plain or gzipped JSON file; InputError names the file and the problem.

    Numbers with a fraction are kept as their decimal text (``parse_float=str``) so that times
    can be converted exactly (``_to_ns``); the cyclic garbage collector is paused while the
    parser builds millions of small objects (it would otherwise rescan them over and over,
    doubling the parse time of large traces).
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if data[:2] == inflate.GZIP_MAGIC:
        data = inflate.gunzip_bytes(data, path)  # in chunks, capped: a small hostile gzip cannot take the memory
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text JSON file (byte {exc.start} is not UTF-8); is it a trace?") from exc
    del data
    enabled = gc.isenabled()
    gc.disable()
    try:
        return json.loads(text, parse_float=str, parse_constant=lambda _: None)
    except json.JSONDecodeError as exc:
        hint = "the file looks truncated" if exc.pos >= len(text.rstrip()) else "the file is not valid JSON"
        raise InputError(f"{path}: {hint} ({exc.msg} at line {exc.lineno} column {exc.colno}); export the trace again") from exc
    except (RecursionError, ValueError) as exc:
        raise InputError(f"{path}: cannot be parsed as JSON ({type(exc).__name__}: {exc})") from exc
    finally:
        if enabled:
            gc.enable()


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


def _int_or_none(value: Any) -> int | None:
    """An integer argument (correlation, stream, bytes...), tolerating strings of digits."""
    t = type(value)
    if t is int:
        return value if -(2**62) < value < 2**62 else None
    if t is str:
        s = value.strip()
        if s.lstrip("-").isdigit() and len(s) < 19:
            return int(s)
        m = re.search(r"\d+", s)  # e.g. a tid written as "stream 7"
        return int(m.group()) if m and len(m.group()) < 19 else None
    return None


# --- sniffing ----------------------------------------------------------------------------------


def sniff(path: Path, head: bytes) -> bool:
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
    except a file several ranks were merged into (``kineto_merged``): one part per rank."""
    pattern = importers.compile_iteration_pattern(iteration_pattern or DEFAULT_ITERATION_PATTERN)
    path = Path(path)
    doc = _trace_document(path)
    dist = _dist_info(doc)
    rank, world = _int_or_none(dist.get("rank")), _int_or_none(dist.get("world_size"))
    if rank is not None and not 0 <= rank < MAX_RANKS:
        raise InputError(f"{path}: distributedInfo.rank is {rank}, not a valid rank; the trace is damaged")
    if world is not None and not 0 < world <= MAX_RANKS:
        raise InputError(f"{path}: distributedInfo.world_size is {world}, not a valid world size; the trace is damaged")
    merged = kineto_merged.split_ranks(path, doc)
    if merged is None:
        return [_parse_rank(path, doc, rank, index if rank is None else rank, world, pattern)]
    del doc
    world = world if world is not None and world > max(r for r, _, _ in merged) else None
    return [_parse_rank(path, sub, r, r, world, pattern, merged=how) for r, sub, how in merged]


def _parse_rank(path: Path, doc: dict, rank: int | None, row_rank: int, world: int | None, pattern: re.Pattern,
                merged: str = "") -> tuple[Path, pd.DataFrame, dict]:
    """(path, rows, info) of one rank's trace document; ``merged``: how it was told apart from the
    other ranks of a merged file ("" for a file of its own)."""
    frame, ranges_host, ranges_gpu, info = _read_one(path, doc, row_rank, pattern)
    frame["iteration"] = importers.assign_iterations(frame, ranges_host, ranges_gpu)
    own = frame["_own_iteration"].to_numpy()
    frame.loc[own >= 0, "iteration"] = own[own >= 0]
    info.update(rank=rank, world=world, iterations=int(ranges_host["iteration"].nunique()),
                markers=len(ranges_host) + len(ranges_gpu), merged=merged)
    return path, frame.drop(columns="_own_iteration"), info


def combine(parts: list, *, iteration_pattern: str | None = None) -> tuple[pd.DataFrame, dict]:
    """``read``'s events and meta from every file's ``parse``, in the order given."""
    pattern = importers.compile_iteration_pattern(iteration_pattern or DEFAULT_ITERATION_PATTERN)
    per_file = [p for part in parts for p in (part if isinstance(part, list) else [part])]
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
    for index, (path, frame, info) in enumerate(per_file):
        rank = index if info["rank"] is None else info["rank"]
        source = "merged file" if info.get("merged") else rank_source
        inputs.append({"file": path.name, "ranks": [rank], "world_size": info["world"], "rank_source": source,
                       "iterations": info["iterations"], "gpu": (info["hardware"] or {}).get("name"),
                       "nccl": info["software"].get("nccl"),
                       "start_ns": int(frame["start_ns"].min()) if len(frame) else None})
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

    events = pd.concat([f for _, f, _ in per_file], ignore_index=True) if per_file else pd.DataFrame()
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


def _trace_document(path: Path) -> dict:
    doc = load_json(path)
    if isinstance(doc, list):  # Chrome's "JSON array format": just the events
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InputError(f"{path}: no 'traceEvents' list; is this a torch.profiler (Chrome trace) JSON file?")
    return doc


def _dist_info(doc: dict) -> dict:
    info = doc.get("distributedInfo")
    return info if isinstance(info, dict) else {}


# Categories as PyTorch 1.8-1.9 (2021) Kineto named them, mapped to today's names.
_LEGACY_CATS = {"operator": "cpu_op", "runtime": "cuda_runtime", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


def _category(e: dict) -> str:
    cat = e.get("cat")
    if type(cat) is not str:
        return ""
    cat = cat.lower()
    return _LEGACY_CATS.get(cat, cat)


_WANTED_CATS = frozenset(_GPU_KIND) | _RUNTIME_CATS | _HOST_RANGE_CATS | _GPU_RANGE_CATS | _WAIT_CATS


def _select_events(path: Path, doc: dict, pattern: re.Pattern) -> tuple[list[dict], pd.Series, pd.Series, np.ndarray, np.ndarray]:
    """The complete ("X") events that can become rows or iteration ranges, with their category,
    name and exact start/end in ns. A selected event without a usable ts/dur is an error."""
    rel = []
    for e in doc["traceEvents"]:
        if type(e) is dict and e.get("ph") == "X":
            cat = _category(e)
            if cat in _WANTED_CATS or (cat == "cpu_op" and type(e.get("name")) is str and pattern.search(e["name"])):
                rel.append(e)
    cats = pd.Series([_category(e) for e in rel], dtype=object)
    names = _clean_names([e.get("name") if type(e.get("name")) is str else "" for e in rel])
    start = [_to_ns(e.get("ts")) for e in rel]
    dur = [_to_ns(e.get("dur")) for e in rel]
    bad = next((i for i, (s, d) in enumerate(zip(start, dur)) if s is None or d is None), None)
    if bad is not None:
        field = "ts" if start[bad] is None else "dur"
        raise InputError(f"{path}: {cats[bad] or 'event'} {names[bad]!r} has no usable '{field}' "
                         f"({rel[bad].get(field)!r}); the trace is damaged, export it again")
    start_ns = np.asarray(start, dtype=np.int64)
    return rel, cats, names, start_ns, start_ns + np.asarray(dur, dtype=np.int64)


def _read_one(path: Path, doc: dict, rank: int, pattern: re.Pattern) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """Rows of one rank's trace, its host and GPU iteration ranges, and its hardware/software."""
    rel, cats, names, start_ns, end_ns = _select_events(path, doc, pattern)
    args = [e.get("args") if type(e.get("args")) is dict else {} for e in rel]
    no_args = sum(type(rel[i].get("args")) is not dict for i in np.flatnonzero(cats.isin(_GPU_KIND).to_numpy()))

    gpu_kind = cats.map(_GPU_KIND)
    is_gpu = gpu_kind.notna().to_numpy()
    gpu_idx = np.flatnonzero(is_gpu)
    gpu_args = [args[i] for i in gpu_idx]
    correlation = _arg_ints(args, "correlation")
    is_runtime = cats.isin(_RUNTIME_CATS).to_numpy()
    is_host_range = cats.isin(_HOST_RANGE_CATS | {"cpu_op"}).to_numpy()
    is_gpu_range = cats.isin(_GPU_RANGE_CATS).to_numpy()

    kind = np.full(len(rel), "", dtype=object)
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

    tid = np.array([-1 if (v := _int_or_none(e.get("tid"))) is None else v for e in rel], dtype=np.int64)
    device = np.full(len(rel), -1, dtype=np.int64)
    stream = tid.copy()
    if len(gpu_idx):
        pid = np.array([-1 if (v := _int_or_none(rel[i].get("pid"))) is None else v for i in gpu_idx], dtype=np.int64)
        dev_arg, stream_arg = _arg_ints(gpu_args, "device"), _arg_ints(gpu_args, "stream")
        dev = np.where(dev_arg >= 0, dev_arg, pid)
        device[gpu_idx] = np.where((dev >= 0) & (dev < 2**31), dev, -1)
        stream[gpu_idx] = np.where(stream_arg >= 0, stream_arg, tid[gpu_idx])
    if is_wait.any():  # the stream whose later work waits (args.stream; wait_on_stream is the other)
        wait_idx = np.flatnonzero(is_wait)
        stream[wait_idx] = _arg_ints([args[i] for i in wait_idx], "stream")

    frame = pd.DataFrame({
        "rank": np.full(len(rel), rank, dtype=np.int64), "device": device, "stream": stream,
        "kind": kind, "role": "other", "name": names.to_numpy(), "start_ns": start_ns, "end_ns": end_ns,
        "correlation": correlation, "collective_id": "", "collective_op": "",
        "graph_id": -1, "grid": "", "block": "", "bytes": -1,
    })
    if len(gpu_idx):
        _fill_gpu_details(frame, gpu_idx, gpu_args)
        _fill_graph_ids(frame, gpu_idx, is_launch, gpu_args)

    # Iteration ranges: host markers and GPU-side annotations whose name matches the pattern.
    number = importers.iteration_numbers(names, pattern)
    host = is_host_range & (number >= 0)
    gpu_range = is_gpu_range & (number >= 0)
    host_ranges = frame.loc[host, ["rank", "start_ns", "end_ns"]].assign(iteration=number[host])
    gpu_ranges = frame.loc[gpu_range, ["rank", "start_ns", "end_ns"]].assign(iteration=number[gpu_range])
    frame["_own_iteration"] = np.where(is_host_range, number, -1)

    launched = np.isin(correlation[gpu_idx], correlation[is_launch]) & (correlation[gpu_idx] >= 0)
    _fill_collectives(frame, gpu_idx, gpu_args, launched)
    ops, ops_start, ops_end = _cpu_ops(doc, pattern)
    linked = kineto_ops.attach_op_costs(frame, args, gpu_idx, is_launch, tid, ops, ops_start, ops_end,
                                        kineto_ops.process_group_sizes(_dist_info(doc)))
    frame = frame[keep].reset_index(drop=True)
    info = {"hardware": _hardware(doc, frame), "software": _software(doc),
            "profiler": kineto_ops.profiler_options(doc, ops, linked), "host": _host_identity(doc, frame),
            "gpu_rows": len(gpu_idx), "no_args": no_args, "without_group": linked.get("collectives_without_group", 0)}
    return frame, host_ranges, gpu_ranges, info


def _clean_names(names: list[str]) -> pd.Series:
    """Names as an object Series; lone UTF-16 surrogates (legal in JSON escapes, not storable in
    parquet) become U+FFFD. Checked once per distinct name."""
    codes, uniques = pd.factorize(pd.Series(names, dtype=object))
    clean = np.array([u.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for u in uniques], dtype=object)
    return pd.Series(clean[codes] if len(codes) else np.array([], dtype=object), dtype=object)


def _arg_ints(args: list[dict], key: str) -> np.ndarray:
    return np.array([-1 if (v := _int_or_none(a.get(key))) is None else v for a in args], dtype=np.int64)


def _name_matches(names: pd.Series, regex: re.Pattern) -> np.ndarray:
    """``regex.search`` on every name, evaluated once per distinct name (a trace repeats few)."""
    codes, uniques = pd.factorize(names)
    hits = np.array([bool(regex.search(u)) for u in uniques], dtype=bool)
    return hits[codes] if len(codes) else np.zeros(0, dtype=bool)


def _fill_gpu_details(frame: pd.DataFrame, gpu_idx: np.ndarray, gpu_args: list[dict]) -> None:
    """Role, grid, block and bytes of the GPU rows (positions ``gpu_idx``)."""
    kind = frame["kind"].to_numpy()[gpu_idx]
    names = frame["name"].iloc[gpu_idx]
    has_collective = np.array([type(a.get("Collective name")) is str for a in gpu_args], dtype=bool)
    comm_name = _name_matches(names, _COMM_KERNEL)
    peer = _name_matches(names, _PEER_COPY)
    role = np.full(len(gpu_idx), "compute", dtype=object)
    role[(kind == "kernel") & (comm_name | has_collective)] = "comm"
    role[kind != "kernel"] = "copy"
    role[(kind == "memcpy") & peer] = "comm"
    cols = frame.columns
    frame.iloc[gpu_idx, cols.get_loc("role")] = role
    cache: dict = {}
    frame.iloc[gpu_idx, cols.get_loc("grid")] = [_dims(a.get("grid"), cache) for a in gpu_args]
    frame.iloc[gpu_idx, cols.get_loc("block")] = [_dims(a.get("block"), cache) for a in gpu_args]
    frame.iloc[gpu_idx, cols.get_loc("bytes")] = _arg_ints(gpu_args, "bytes")
    frame.iloc[gpu_idx, cols.get_loc("graph_id")] = _arg_ints(gpu_args, "graph id")


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


def _fill_graph_ids(frame: pd.DataFrame, gpu_idx: np.ndarray, is_launch: np.ndarray, gpu_args: list[dict]) -> None:
    """``graph id`` comes from the kernel's args; a graph kernel without one (only ``graph node
    id``, or launched by ``cudaGraphLaunch``) gets its graph launch's correlation id instead, which
    still groups the kernels of one graph launch together."""
    corr = frame["correlation"].to_numpy()
    graph_launch = is_launch & _name_matches(frame["name"], _GRAPH_LAUNCH)
    has_node = np.array([a.get("graph node id") is not None for a in gpu_args], dtype=bool)
    gpu_corr = corr[gpu_idx]
    from_graph = has_node | np.isin(gpu_corr, corr[graph_launch])
    graph_id = frame["graph_id"].to_numpy()[gpu_idx]
    fill = from_graph & (graph_id < 0) & (gpu_corr >= 0)
    frame.iloc[gpu_idx[fill], frame.columns.get_loc("graph_id")] = gpu_corr[fill]


def _fill_collectives(frame: pd.DataFrame, gpu_idx: np.ndarray, gpu_args: list[dict], launched: np.ndarray) -> None:
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
    sub = [a for a, s in zip(gpu_args, sel) if s]
    coll_name = [a.get("Collective name") if type(a.get("Collective name")) is str else "" for a in sub]
    # PyTorch's metadata where recorded, else the kernel's name read as every importer reads it
    # (NCCL, RCCL, MSCCL, ``...KernelDebug_``; UNKNOWN_COLLECTIVE when the name says no collective).
    from_name = kernel_collectives(frame["name"].iloc[idx]).to_numpy()
    ops = [normalize_collective(cname) if cname else op for cname, op in zip(coll_name, from_name)]
    pg = [str(a.get("Process Group Name")) if a.get("Process Group Name") is not None else "default" for a in sub]
    seq = _arg_ints(sub, "Seq")
    nelems = np.maximum(_arg_ints(sub, "In msg nelems"), _arg_ints(sub, "Out msg nelems"))
    width = np.array([COMM_DTYPE_BYTES.get(str(a.get("dtype", "")).lower(), 0) for a in sub], dtype=np.int64)

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
    prop = next((p for p in props if _int_or_none(p.get("id")) == used), props[0])
    name = str(prop.get("name", ""))
    hw = {"name": name, "vendor": _vendor(name, doc), "devices_per_host": len(props)}
    for key, src in (("num_sms", "numSms"), ("memory_bytes", "totalGlobalMem"), ("warp_size", "warpSize")):
        v = _int_or_none(prop.get(src))
        if v is not None:
            hw[key] = v
    major, minor = _int_or_none(prop.get("computeMajor")), _int_or_none(prop.get("computeMinor"))
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
        v = _int_or_none(doc.get(key))
        if v is not None and v > 0:
            sw[key.replace("_version", "")] = f"{v // 1000}.{(v % 1000) // 10}"
    v = _int_or_none(doc.get("cupti_version"))
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


def _cpu_ops(doc: dict, pattern: re.Pattern) -> tuple[list[dict], np.ndarray, np.ndarray]:
    """The trace's ``cpu_op`` ranges (not iteration markers) with exact start and end in ns: the
    ops that launched kernels (``kineto_ops``)."""
    ops = [e for e in doc["traceEvents"] if type(e) is dict and e.get("ph") == "X" and _category(e) == "cpu_op"
           and not (type(e.get("name")) is str and pattern.search(e["name"]))]
    start = np.array([_to_ns(e.get("ts")) or 0 for e in ops], dtype=np.int64)
    dur = np.array([max(_to_ns(e.get("dur")) or 0, 0) for e in ops], dtype=np.int64)
    return ops, start, start + dur


def _host_identity(doc: dict, frame: pd.DataFrame) -> dict:
    """What says which host and clock a rank's trace came from (``kineto_ops.clock_domain``)."""
    pids = {v for e in doc["traceEvents"][:2000] if type(e) is dict and _category(e) == "cpu_op"
            and (v := _int_or_none(e.get("pid"))) is not None}
    devices = sorted(int(d) for d in frame.loc[frame["device"] >= 0, "device"].unique())
    props = doc.get("deviceProperties")
    return {"host_name": doc.get("host_name") if isinstance(doc.get("host_name"), str) else None,
            "base_time_ns": _int_or_none(doc.get("baseTimeNanoseconds")), "pids": sorted(pids), "devices": devices,
            "devices_per_host": len(props) if isinstance(props, list) else None}
