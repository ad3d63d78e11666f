"""What the vendor-profiler importers (nsys, rocprofv3 JSON/CSV, rocpd) share.

Every vendor tool records the same things under different names: GPU activities with a
correlation id, the host API calls that enqueued them, and user ranges (NVTX / ROCTx). This
module turns those into the one event schema the same way for every tool, so that a ledger
never depends on which profiler produced its events:

- host calls: a call whose correlation id matches GPU work is a ``launch``; a call that waits
  on the GPU (``*Synchronize``) is a ``sync``; every other call is dropped;
- iterations: user ranges whose text matches the iteration pattern become ``marker`` rows; a
  launch belongs to the marker range containing its start, a GPU row to the iteration of its
  launch (via correlation), else to the marker range containing its own start;
- collectives: NCCL/RCCL kernels get role ``comm``, ``collective_op`` from the kernel name and
  ``collective_id`` '<op>:<n>' from their order per (rank, op) (the tools do not record the
  process group; documented in docs of each importer);
- ranks: which process is which rank (see :func:`assign_ranks`).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from taxmodel import vocabulary
from taxmodel.trace import ints
from taxmodel.trace.op_costs import collective_bus_bytes, collective_bus_bytes_at_least, payload_message_bytes

DEFAULT_ITERATION_PATTERN = r"(?:ProfilerStep#|\b[Ii]ter(?:ation)?[\s_#:=-]*)(\d+)"
"""Matches torch.profiler's ``ProfilerStep#N`` and user ranges such as ``iter 3``,
``iteration_3``, ``Iteration#3``; the one group is the iteration number."""

_SYNC_CALL = re.compile(r"Synchronize", re.IGNORECASE)
_API_VERSION_SUFFIX = re.compile(r"_v\d+$")


# --- names and roles -----------------------------------------------------------------------

def strip_api_version(names: pd.Series) -> pd.Series:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel`` (nsys keeps the API version suffix;
    Kineto and rocprof do not)."""
    return names.astype(str).str.replace(_API_VERSION_SUFFIX, "", regex=True)


def classify_kernels(names: pd.Series) -> tuple[pd.Series, pd.Series]:
    """(role, collective_op) for kernel names: NCCL/RCCL kernels are ``comm`` with the op read
    from the name (``ncclDevKernel_AllGather_RING_LL`` -> ``allgather``; a generic kernel gets
    ``vocabulary.UNKNOWN_COLLECTIVE``); everything else is ``compute`` with no op."""
    op = vocabulary.kernel_collectives(names)
    role = pd.Series(np.where(vocabulary.comm_kernels(names), "comm", "compute"), index=names.index)
    return role, op


def number_collectives(events: pd.DataFrame) -> pd.Series:
    """'<op>:<n>' for every row with a collective_op: n counts that op's kernels per rank in
    start order, so the n-th all-gather of every rank gets the same id."""
    out = pd.Series("", index=events.index, dtype=object)
    has_op = events["collective_op"].astype(str) != ""
    if not has_op.any():
        return out
    sub = events.loc[has_op, ["rank", "collective_op", "start_ns", "end_ns"]].sort_values(
        ["rank", "collective_op", "start_ns", "end_ns"], kind="stable")
    seq = sub.groupby(["rank", "collective_op"], sort=False).cumcount()
    out.loc[sub.index] = sub["collective_op"].astype(str) + ":" + seq.astype(str)
    return out


def gpu_memcpy_role(src_device: pd.Series, dst_device: pd.Series, is_peer: pd.Series) -> pd.Series:
    """A copy between two different GPUs moves data between ranks (``comm``); any other copy
    is local (``copy``)."""
    peer = is_peer | ((src_device >= 0) & (dst_device >= 0) & (src_device != dst_device))
    return pd.Series(np.where(peer, "comm", "copy"), index=src_device.index)


def host_calls(calls: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """Keep the host API calls that matter: ``launch`` when their (rank, correlation) enqueued
    GPU work in ``gpu``, ``sync`` when their name says they wait on the GPU; drop the rest.
    ``calls`` needs rank, name, correlation; the result has a ``kind`` column."""
    if calls.empty:
        return calls.assign(kind=pd.Series([], dtype=object))
    gpu_keys = pd.MultiIndex.from_frame(gpu[["rank", "correlation"]].astype("int64")).unique()
    keys = pd.MultiIndex.from_frame(calls[["rank", "correlation"]].astype("int64"))
    launches = keys.isin(gpu_keys) & (calls["correlation"].to_numpy() >= 0)
    syncs = calls["name"].astype(str).str.contains(_SYNC_CALL, regex=True).to_numpy()
    kind = np.where(launches, "launch", np.where(syncs, "sync", ""))
    out = calls.assign(kind=kind)
    out = out[out["kind"] != ""]
    # A call recorded twice (runtime and driver layer with one correlation) launches once.
    dup = out["kind"].eq("launch") & out.duplicated(["rank", "correlation", "kind"], keep="first")
    return out[~dup]


# --- iterations ----------------------------------------------------------------------------

def compile_iteration_pattern(pattern: str | None) -> re.Pattern:
    """The iteration regex (its first group is the iteration number); the vendor default
    when ``pattern`` is None."""
    from taxmodel.trace import importers

    return importers.compile_iteration_pattern(DEFAULT_ITERATION_PATTERN if pattern is None else pattern)


def iteration_markers(ranges: pd.DataFrame, pattern: str | None) -> pd.DataFrame:
    """Marker rows for the user ranges whose text matches the iteration pattern.

    ``ranges`` has rank, stream (thread), name, start_ns, end_ns; the result adds kind,
    role, device and iteration. A range whose matched group is not a number is not a marker.
    """
    from taxmodel.trace import importers

    number = importers.iteration_numbers(ranges["name"], compile_iteration_pattern(pattern))
    out = ranges[number >= 0].copy()
    out["iteration"] = number[number >= 0]
    out["kind"] = "marker"
    out["role"] = "other"
    out["device"] = -1
    return out


def assign_iterations(events: pd.DataFrame) -> pd.Series:
    """Iteration of every row from its ``marker`` rows (markers keep theirs), by the shared
    rule of :func:`taxmodel.trace.importers.assign_iterations`: host rows by the marker range
    containing their start, GPU rows by their launch (rank, correlation), else -- vendor tools
    record no GPU-side ranges -- by the marker range containing their own start."""
    from taxmodel.trace import importers

    is_marker = (events["kind"] == "marker").to_numpy()
    markers = events.loc[is_marker, ["rank", "start_ns", "end_ns", "iteration"]]
    it = importers.assign_iterations(events, markers, gpu_ranges=markers)
    it[is_marker] = events.loc[is_marker, "iteration"].to_numpy(dtype="int64")
    return pd.Series(it, index=events.index, dtype="int64")


# --- ranks ---------------------------------------------------------------------------------

RANK_ENV_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
"""Environment variables that carry the global rank, in order of preference."""


def assign_ranks(processes: pd.DataFrame) -> tuple[dict[tuple[int, int], int], str]:
    """Global rank of each traced process.

    ``processes`` has one row per process that ran GPU work: file_index (position of its file
    in the list given to the importer), pid, first_device (lowest GPU index it used) and
    declared_rank (from the trace's own content -- MPI_RANKS, a RANK environment variable --
    or -1). When every process declares a distinct rank those are used; otherwise ranks are
    numbered in order of (file, GPU index, pid): one file per rank gives the files' order,
    one file holding several processes gives the GPU order (rank r on GPU r in a local run).
    Returns ({(file_index, pid): rank}, a sentence saying which rule was used).
    """
    if processes.empty:
        return {}, "no process ran GPU work"
    declared = processes["declared_rank"].astype("int64")
    if (declared >= 0).all() and declared.is_unique:
        mapping = {(int(f), int(p)): int(r) for f, p, r in zip(processes["file_index"], processes["pid"], declared)}
        return mapping, "ranks read from the trace (MPI rank / RANK environment variable)"
    ordered = processes.sort_values(["file_index", "first_device", "pid"], kind="stable")
    mapping = {(int(f), int(p)): i for i, (f, p) in enumerate(zip(ordered["file_index"], ordered["pid"]))}
    how = "ranks numbered by order of (file given, GPU index, process id): " + ", ".join(
        f"rank {i} = pid {p} on GPU {d} (file {f})"
        for i, (f, p, d) in enumerate(zip(ordered["file_index"], ordered["pid"], ordered["first_device"])))
    return mapping, how


def rank_from_environment(env: dict | None) -> int:
    """The global rank named by a process environment, or -1."""
    if not env:
        return -1
    ranks = (ints.whole(env.get(var)) for var in RANK_ENV_VARS)
    return next((r for r in ranks if r is not None), -1)


def concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate, ignoring empty frames (so that their all-NA columns do not set dtypes)."""
    full = [f for f in frames if len(f)]
    if not full:
        return frames[0].iloc[0:0].copy() if frames else pd.DataFrame()
    return pd.concat(full, ignore_index=True) if len(full) > 1 else full[0].reset_index(drop=True)


_EVENT_DEFAULTS = {"iteration": -1, "collective_op": "", "correlation": -1}


def finish_events(frames: list[pd.DataFrame], *, collective_from_kernels: bool = True) -> pd.DataFrame:
    """Concatenate per-kind frames, assign iterations and number collectives."""
    events = concat(frames)
    if events.empty and not len(events.columns):
        events = pd.DataFrame({c: pd.Series([], dtype="int64") for c in ("rank", "device", "stream", "start_ns", "end_ns")})
        events["kind"] = pd.Series([], dtype=object)
    for col, default in _EVENT_DEFAULTS.items():
        if col not in events:
            events[col] = default
        elif events[col].isna().any():
            events[col] = events[col].astype(object).where(events[col].notna(), default)
        if isinstance(default, int):
            events[col] = events[col].astype("int64")
    events["iteration"] = assign_iterations(events)
    if collective_from_kernels:
        events["collective_id"] = number_collectives(events)
    return events.sort_values(["rank", "start_ns", "end_ns"], kind="stable").reset_index(drop=True)


# --- collective sizes ------------------------------------------------------------------------

#: ncclDataType_t, by name (NCCL's and RCCL's headers) and by value, -> element bytes
NCCL_DTYPE_BYTES = {"ncclint8": 1, "ncclchar": 1, "nccluint8": 1, "ncclint32": 4, "ncclint": 4, "nccluint32": 4,
                    "ncclint64": 8, "nccluint64": 8, "ncclfloat16": 2, "ncclhalf": 2, "ncclfloat32": 4, "ncclfloat": 4,
                    "ncclfloat64": 8, "nccldouble": 8, "ncclbfloat16": 2, "ncclfloat8e4m3": 1, "ncclfloat8e5m2": 1,
                    "0": 1, "1": 1, "2": 4, "3": 4, "4": 8, "5": 8, "6": 2, "7": 4, "8": 8, "9": 2, "10": 1, "11": 1}
COLLECTIVE_CALL_COLUMNS = ("pid", "stream", "start_ns", "end_ns", "op", "payload_bytes", "group_size")
"""A collective library call with its size (``assemble``'s ``collective_calls``): the host thread
it ran on, its time range, the collective (``vocabulary.normalize_collective``), its payload in
bytes (NCCL's "Message size [bytes]": an all-gather's send buffer, a reduce-scatter's receive
buffer, an all-reduce's buffer; -1 unknown) and its group size (-1 unknown)."""
NO_COLLECTIVE_SIZE = ("collective size not recorded: no NCCL/RCCL call with a message size encloses its launch "
                      "(Nsight Systems: NCCL's NVTX ranges with payloads, NCCL 2.19+ and --trace=nvtx; rocprofv3: "
                      "RCCL API arguments)")


def empty_collective_calls() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=object if c == "op" else "int64") for c in COLLECTIVE_CALL_COLUMNS})


def call_from_args(name: str, args: dict) -> tuple[str, int]:
    """(collective, payload bytes) of an NCCL/RCCL API call from its recorded arguments (``count``,
    ``sendcount`` or ``recvcount`` and ``datatype``); ("", -1) for a call that is no collective."""
    low = str(name).lower()
    if not low.startswith(("nccl", "rccl")):
        return "", -1
    op = vocabulary.normalize_collective(low[4:])
    if op not in vocabulary.COLLECTIVES:
        return "", -1
    norm = {re.sub(r"[^a-z]", "", str(k).lower()): v for k, v in args.items()}
    count = next((ints.literal(norm[k]) for k in ("count", "sendcount", "recvcount") if k in norm), None)
    width = NCCL_DTYPE_BYTES.get(re.sub(r"[^a-z0-9]", "", str(norm.get("datatype", "")).lower()), 0)
    return op, count * width if count is not None and count >= 0 and width else -1


def attach_collective_sizes(events: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """``bytes`` (the message: the larger of input and output), ``floor_bytes`` (the bytes the
    rank's link carries) and ``uncosted`` of every communication kernel, from the collective call
    (``calls``: ``COLLECTIVE_CALL_COLUMNS`` with ``rank`` for ``pid``) whose time range on the
    launching thread holds the kernel's launch call. A group size the trace does not give is taken
    as 2, the fewest bytes any group carries (a lower bound, said in ``uncosted``'s absence by the
    importer's note); a kernel without such a call is uncosted, its reason said. ``events`` is
    changed in place (``assemble``'s own frame) and returned."""
    for col, default in (("floor_bytes", -1), ("uncosted", "")):
        if col not in events:
            events[col] = default
    comm = ((events["kind"] == "kernel") & (events["role"] == "comm")).to_numpy()
    if not comm.any():
        return events
    events.loc[comm, "uncosted"] = NO_COLLECTIVE_SIZE
    sized = calls[calls["payload_bytes"] >= 0] if len(calls) else calls
    if not len(sized):
        return events
    launches = events.loc[events["kind"] == "launch", ["rank", "correlation", "stream", "start_ns"]]
    launches = launches[launches["correlation"] >= 0].drop_duplicates(["rank", "correlation"])
    k = events.loc[comm, ["rank", "correlation", "collective_op"]].reset_index()
    k = k.merge(launches, on=["rank", "correlation"], how="inner").sort_values("start_ns")
    c = sized.sort_values("start_ns").rename(columns={"start_ns": "call_start", "end_ns": "call_end", "op": "call_op"})
    m = pd.merge_asof(k, c, left_on="start_ns", right_on="call_start", by=["rank", "stream"], direction="backward")
    m = m[m["call_end"].notna() & (m["call_end"] >= m["start_ns"])]
    if not len(m):
        return events
    op = np.where(m["collective_op"].isin(vocabulary.COLLECTIVES), m["collective_op"], m["call_op"])
    group = m["group_size"].astype("int64").to_numpy()
    msg = np.array([payload_message_bytes(o, int(p), int(g)) for o, p, g in zip(op, m["payload_bytes"], group)], np.int64)
    bus = np.array([collective_bus_bytes(o, int(b), int(g)) if g > 0 else collective_bus_bytes_at_least(o, int(b))
                    for o, b, g in zip(op, msg, group)], np.int64)
    idx = m["index"].to_numpy()
    events.loc[idx, "bytes"] = msg
    events.loc[idx, "floor_bytes"] = bus
    events.loc[idx, "uncosted"] = np.where(bus >= 0, "", NO_COLLECTIVE_SIZE)
    return events


def assemble(per_file: list[dict], iteration_pattern: str | None) -> tuple[pd.DataFrame, list[int], str]:
    """Events of several files of one tool, each given as a dict with ``file_index``, ``file``
    (its path, for messages), ``gpu`` (GPU rows), ``calls`` (host API calls), ``ranges`` (user
    ranges), optionally ``waits`` (rows of kind ``wait``: cross-stream dependencies) and
    ``collective_calls`` (``COLLECTIVE_CALL_COLUMNS``: NCCL/RCCL calls with their sizes) -- all
    keyed by ``pid`` -- and ``processes`` (see :func:`assign_ranks`). Returns (events, ranks, how ranks
    were assigned); each dict gets ``ranks`` (its files' ranks)."""
    processes = concat([f["processes"] for f in per_file])
    rank_of, how = assign_ranks(processes)
    for f in per_file:
        f["ranks"] = sorted(r for (i, _), r in rank_of.items() if i == f["file_index"])
    gpu, calls, ranges = (concat([_with_rank(f[key], f["file_index"], rank_of) for f in per_file])
                          for key in ("gpu", "calls", "ranges"))
    launches = host_calls(calls, gpu)
    markers = iteration_markers(ranges, iteration_pattern)
    waits = [_with_rank(f["waits"], f["file_index"], rank_of) for f in per_file if len(f.get("waits", ()))]
    events = finish_events([gpu, launches, markers, *waits])
    sized = [_with_rank(f["collective_calls"], f["file_index"], rank_of) for f in per_file if len(f.get("collective_calls", ()))]
    events = attach_collective_sizes(events, concat(sized) if sized else empty_collective_calls().rename(columns={"pid": "rank"}))
    return events, sorted(set(rank_of.values())), how


def _with_rank(df: pd.DataFrame, file_index: int, rank_of: dict[tuple[int, int], int]) -> pd.DataFrame:
    """Replace the process id by the global rank; rows of processes without a rank are dropped."""
    pid_rank = {pid: rank for (f, pid), rank in rank_of.items() if f == file_index}
    rank = df["pid"].astype("int64").map(pid_rank)
    return df.assign(rank=rank)[rank.notna()].astype({"rank": "int64"}).drop(columns=["pid"])


def inputs_meta(per_file: list[dict]) -> list[dict]:
    """meta['inputs']: which file held which ranks (the dispatcher's cross-file checks use it)."""
    return [{"file": str(f.get("file", f["file_index"])), "ranks": f.get("ranks", [])} for f in per_file]


def empty_host_rows() -> pd.DataFrame:
    """A zero-row frame of host calls / ranges (pid, stream, name, start_ns, end_ns, correlation)."""
    return pd.DataFrame({"pid": pd.Series([], dtype="int64"), "stream": pd.Series([], dtype="int64"),
                         "name": pd.Series([], dtype=object), "start_ns": pd.Series([], dtype="int64"),
                         "end_ns": pd.Series([], dtype="int64"), "correlation": pd.Series([], dtype="int64")})


def process_table(gpu: pd.DataFrame, file_index: int, declared: dict[int, int] | None = None) -> pd.DataFrame:
    """One row per process that ran GPU work in ``gpu`` (pid, device columns)."""
    first_device = gpu.groupby("pid")["device"].min()
    declared = declared or {}
    return pd.DataFrame({
        "file_index": file_index,
        "pid": first_device.index.to_numpy(dtype="int64"),
        "first_device": first_device.to_numpy(dtype="int64"),
        "declared_rank": [declared.get(int(p), -1) for p in first_device.index],
    })


_SM_IN_NAME = re.compile(r"(?:^|[^a-z0-9])sm_?([1-9][0-9]{1,2})[a-z]?_|arch::Sm([1-9][0-9]{1,2})\b")


def arch_from_kernel_names(names: pd.Series) -> dict | None:
    """The GPU architecture the kernels were built for, where their names say it (cuBLAS and
    CUTLASS name kernels ``sm90_xmma_gemm_...``, ``cutlass::arch::Sm80``): the highest one seen, as
    ``{"arch": "9.0", "basis": ...}``, for a trace that records no device. A kernel built for an
    older architecture runs on a newer GPU, so the device is at least this; None when no name says."""
    best, example = 0, ""
    for u in pd.unique(names.astype(str)):  # once per distinct name
        for m in _SM_IN_NAME.finditer(u):
            v = int(m.group(1) or m.group(2))
            if v > best:
                best, example = v, u
    if not best:
        return None
    arch = f"{best // 10}.{best % 10}"
    return {"arch": arch, "basis": f"the kernels' names (e.g. {example[:60]!r}: built for compute capability {arch})"}


def dims(x: pd.Series, y: pd.Series, z: pd.Series) -> pd.Series:
    """'x,y,z' strings from three integer columns."""
    return x.astype("int64").astype(str) + "," + y.astype("int64").astype(str) + "," + z.astype("int64").astype(str)


def blocks_from_work_items(grid: pd.Series, workgroup: pd.Series) -> pd.Series:
    """AMD tools report the grid in work-items (HSA semantics); the schema wants blocks.
    A partial last workgroup still counts as a block (ceil division)."""
    g = grid.astype("int64")
    w = workgroup.astype("int64").clip(lower=1)
    return (g + w - 1) // w
