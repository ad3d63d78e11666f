"""Import Nsight Systems traces from their SQLite export (``nsys export --type sqlite``).

What is read (NVIDIA's "SQLite Export Schema Reference"; tables are created lazily and the
columns differ between nsys versions, so every table is checked with PRAGMA table_info):

- ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``_MEMCPY`` / ``_MEMSET``: GPU rows (ns integers relative
  to the session start). Kernel names come from ``StringIds`` via ``demangledName`` (else
  ``shortName``, else ``mangledName``); ``graphId`` where present.
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` and ``_DRIVER``: host calls, linked to GPU rows by
  ``correlationId`` (Triton launches through the driver API, cuBLAS/torch through the runtime).
- ``NVTX_EVENTS``: push/pop and start/end ranges whose text matches the iteration pattern
  become iteration markers.
- ``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` (when present) is added to every time, so that
  files of several ranks share one time base (each file's own times start at its session).
- ``MPI_RANKS`` (when nsys traced MPI) gives each process its rank.

Processes: ``globalPid``/``globalTid`` encode the pid in bits 24-47. Ranks: see
:func:`taxmodel.trace.vendor_common.assign_ranks` -- MPI ranks when every process has one,
else the order of (file given, GPU index, pid); processes that ran no GPU work (a launcher)
are left out. Collectives: NCCL kernels get role ``comm``, the op from the kernel name and
``collective_id`` '<op>:<n>' from the per-(rank, op) order (nsys does not record the process
group).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from taxmodel.errors import InputError
from taxmodel.trace import ints
from taxmodel.trace import sqlite_input as sq
from taxmodel.trace import vendor_common as vc
from taxmodel import vocabulary

FORMAT = "nsys"

KERNEL, MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME, DRIVER = "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"
NVTX = "NVTX_EVENTS"
GPU_TABLES = (KERNEL, MEMCPY, MEMSET)
SYNC_TABLE = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
_STREAM_WAIT_EVENT = 2  # CUpti_ActivitySynchronizationType
_GPU_COLUMNS = ("start", "end", "deviceId", "streamId", "correlationId")
_HOST_COLUMNS = ("start", "end", "globalTid", "correlationId", "nameId")
_NAME_COLUMNS = ("demangledName", "shortName", "mangledName")
_NVTX_RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange

# Copy and memory kinds, named as Kineto names them. The copy kinds are CUPTI's CUpti_ActivityMemcpyKind,
# which Nsight Systems' ENUM_CUDA_MEMCPY_OPER extends by unified-memory migrations (11-13). Memory kinds:
# Nsight Systems numbers them its own way (ENUM_CUDA_MEM_KIND: Pageable first, Unknown last); exports
# without that table are read by which numbering makes their host<->device copies end in device memory.
_MEMCPY_KINDS = ("Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP",
                 "UVM HtoD", "UVM DtoH", "UVM DtoD")
_NSYS_MEMORY_KINDS = ("Pageable", "Pinned", "Device", "Array", "Managed", "Device Static", "Managed Static", "Unknown")
_CUPTI_MEMORY_KINDS = ("Unknown", "Pageable", "Pinned", "Device", "Array", "Managed", "Device Static", "Managed Static")
_PTOP = 10
_HTOD, _DTOH = 1, 2
_PID_SHIFT, _ID_MASK = 24, 0xFFFFFF


def sniff(path: Path, head: bytes, tables: set[str]) -> bool:
    """An nsys export is a SQLite file with CUPTI activity or NVTX tables."""
    return any(n.startswith("CUPTI_ACTIVITY_KIND_") for n in tables) or {"StringIds", NVTX} <= tables


def read(paths: list[Path], *, iteration_pattern: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Events and partial meta from one or more nsys SQLite exports (one per rank, or one
    holding several processes)."""
    vc.compile_iteration_pattern(iteration_pattern)
    per_file = []
    for index, path in enumerate(paths):
        with sq.sqlite_connection(Path(path)) as conn, sq.sqlite_errors(Path(path), "nsys"):
            per_file.append(_read_file(sq.SqliteSchema(conn, Path(path), "nsys"), index) | {"file": str(path)})

    events, ranks, how = vc.assemble(per_file, iteration_pattern)
    first = per_file[0]
    meta = {
        "source": "nsys",
        "world_size": len(ranks),
        "ranks": ranks,
        "inputs": vc.inputs_meta(per_file),
        "hardware": first["hardware"],
        "software": first["software"],
        "capture": {"tracer": "nsys", "time_base": "session start + utcEpochNs" if first["utc"] else "session start",
                    "rank_assignment": how},
        "notes": [f"nsys: {how}"] + [n for f in per_file for n in f["notes"]],
    }
    return events, meta


def _read_file(s: sq.SqliteSchema, file_index: int) -> dict:
    present = [t for t in GPU_TABLES if s.has(t)]
    if not present:
        raise InputError(
            f"{s.path}: nsys export has none of the GPU activity tables {', '.join(GPU_TABLES)}; "
            "capture with `nsys profile --trace=cuda,nvtx` and export with `nsys export --type sqlite`")
    notes: list[str] = []
    utc = _session_start(s)
    gpu = vc.concat([_read_gpu_table(s, t, utc) for t in present])
    for t in GPU_TABLES:
        if t not in present:
            notes.append(f"{s.path.name}: no {t} table (no such activity was traced)")
    calls = [_read_calls(s, t, utc) for t in (RUNTIME, DRIVER) if s.has(t)]
    calls_df = vc.concat(calls) if calls else vc.empty_host_rows()
    if calls_df.empty:
        notes.append(f"{s.path.name}: no CUDA API calls ({RUNTIME}/{DRIVER} missing or empty); "
                     "launch rows and launch taxes are unavailable (trace with --trace=cuda)")
    ranges = _read_ranges(s, utc)
    waits = _read_stream_waits(s, utc)
    sized = _read_collective_calls(s, utc)
    if not all("globalPid" in s.columns(t) for t in present):
        # Old exports without globalPid: the whole file is one process.
        notes.append(f"{s.path.name}: no globalPid column; the file is read as one process")
        for df in (gpu, calls_df, ranges, waits, sized):
            df["pid"] = 0

    processes = vc.process_table(gpu, file_index, _mpi_ranks(s))
    return {"file_index": file_index, "gpu": gpu, "calls": calls_df, "ranges": ranges, "waits": waits, "processes": processes,
            "collective_calls": sized,
            "hardware": _hardware(s, gpu), "software": _software(s), "notes": notes, "utc": utc}


def _col(s: sq.SqliteSchema, table: str, col: str, default: str, alias: str = "t") -> str:
    """The column, or ``default`` where it is absent or NULL (real exports leave e.g.
    ``srcDeviceId`` NULL for host<->device copies)."""
    return f'COALESCE({alias}."{col}", {default})' if col in s.columns(table) else default


def _session_start(s: sq.SqliteSchema) -> int:
    t = "TARGET_INFO_SESSION_START_TIME"
    if s.has(t) and "utcEpochNs" in s.columns(t):
        row = s.conn.execute(f'SELECT "utcEpochNs" FROM "{t}" LIMIT 1').fetchone()
        if row and row[0] is not None:
            return int(row[0])
    return 0


def _pid_expr(s: sq.SqliteSchema, table: str) -> str:
    if "globalPid" in s.columns(table):
        return f'((t."globalPid" >> {_PID_SHIFT}) & {_ID_MASK})'
    return "0"


def _read_gpu_table(s: sq.SqliteSchema, table: str, utc: int) -> pd.DataFrame:
    s.require_columns(table, _GPU_COLUMNS, hint="; re-export with a newer `nsys export --type sqlite`")
    select = [
        f'{_pid_expr(s, table)} AS pid', 't."deviceId" AS device', 't."streamId" AS stream',
        f't."start" + {utc} AS start_ns', f't."end" + {utc} AS end_ns', 't."correlationId" AS correlation',
    ]
    joins = ""
    if table == KERNEL:
        name_cols = [c for c in _NAME_COLUMNS if c in s.columns(table)]
        if not name_cols:
            raise InputError(f"{s.path}: nsys table '{table}' has no kernel-name column (expected one of {', '.join(_NAME_COLUMNS)})")
        s.require_columns("StringIds", ("id", "value"), hint="; the export is incomplete")
        for i, c in enumerate(name_cols):
            joins += f' LEFT JOIN "StringIds" s{i} ON s{i}."id" = t."{c}"'
        select.append("COALESCE(" + ", ".join(f"s{i}.\"value\"" for i in range(len(name_cols))) + ", '') AS name")
        for axis in "XYZ":
            select.append(f"{_col(s, table, 'grid' + axis, '0')} AS grid_{axis.lower()}")
            select.append(f"{_col(s, table, 'block' + axis, '0')} AS block_{axis.lower()}")
        select.append(f"{_col(s, table, 'graphId', '0')} AS graph_id")
    elif table == MEMCPY:
        select += [f"{_col(s, table, 'bytes', '-1')} AS bytes", f"{_col(s, table, 'copyKind', '0')} AS copy_kind",
                   f"{_col(s, table, 'srcKind', '-1')} AS src_kind", f"{_col(s, table, 'dstKind', '-1')} AS dst_kind",
                   f"{_col(s, table, 'srcDeviceId', '-1')} AS src_device", f"{_col(s, table, 'dstDeviceId', '-1')} AS dst_device",
                   f"{_col(s, table, 'graphId', '0')} AS graph_id"]
    else:
        select += [f"{_col(s, table, 'bytes', '-1')} AS bytes", f"{_col(s, table, 'memKind', '-1')} AS mem_kind",
                   f"{_col(s, table, 'graphId', '0')} AS graph_id"]
    df = s.query(f'SELECT {", ".join(select)} FROM "{table}" t{joins}')
    df = df.astype({"pid": "int64", "device": "int64", "stream": "int64", "start_ns": "int64", "end_ns": "int64",
                    "correlation": "int64", "graph_id": "int64"})
    df["graph_id"] = df["graph_id"].where(df["graph_id"] > 0, -1)
    if table == KERNEL:
        df["kind"] = "kernel"
        df["role"], df["collective_op"] = vc.classify_kernels(df["name"])
        df["grid"] = vc.dims(df["grid_x"], df["grid_y"], df["grid_z"])
        df["block"] = vc.dims(df["block_x"], df["block_y"], df["block_z"])
        df = df.drop(columns=[f"{a}_{x}" for a in ("grid", "block") for x in "xyz"])
    elif table == MEMCPY:
        df["kind"] = "memcpy"
        kinds = _memory_kinds(s, df)
        df["name"] = ("Memcpy " + _label(df["copy_kind"], _MEMCPY_KINDS) + " (" + _label(df["src_kind"], kinds)
                      + " -> " + _label(df["dst_kind"], kinds) + ")")
        df["role"] = vc.gpu_memcpy_role(df["src_device"].astype("int64"), df["dst_device"].astype("int64"),
                                        df["copy_kind"].astype("int64") == _PTOP)
        df = df.drop(columns=["copy_kind", "src_kind", "dst_kind", "src_device", "dst_device"])
    else:
        df["kind"] = "memset"
        df["name"] = "Memset (" + _label(df["mem_kind"], _memory_kinds(s, None)) + ")"
        df["role"] = "copy"
        df = df.drop(columns=["mem_kind"])
    return df


def _memory_kinds(s: sq.SqliteSchema, copies: pd.DataFrame | None) -> tuple[str, ...]:
    """Labels of the export's memory-kind codes: its ENUM_CUDA_MEM_KIND table; else Nsight Systems'
    numbering (Device = 2), unless a host<->device copy then would not touch device memory while
    CUPTI's numbering (Device = 3) makes it do so (exports older than the enum tables)."""
    t = "ENUM_CUDA_MEM_KIND"
    if s.has(t) and {"id", "label"} <= s.columns(t):
        rows = dict(s.fetchall(f'SELECT "id", "label" FROM "{t}"'))
        if rows and all(isinstance(k, int) for k in rows):
            return tuple(str(rows.get(i, "Unknown")) for i in range(max(rows) + 1))
    if copies is not None and len(copies):
        kind = copies["copy_kind"].astype("int64")
        device_end = np.where(kind == _HTOD, copies["dst_kind"], np.where(kind == _DTOH, copies["src_kind"], -1)).astype("int64")
        device_end = device_end[device_end >= 0]
        if len(device_end) and (device_end == 3).all() and not (device_end == 2).any():
            return _CUPTI_MEMORY_KINDS
    return _NSYS_MEMORY_KINDS


def _label(codes: pd.Series, labels: tuple[str, ...]) -> pd.Series:
    codes = codes.astype("int64")
    return codes.map(dict(enumerate(labels))).fillna("Unknown")


def _read_calls(s: sq.SqliteSchema, table: str, utc: int) -> pd.DataFrame:
    s.require_columns(table, _HOST_COLUMNS)
    df = s.query(
        f'SELECT ((t."globalTid" >> {_PID_SHIFT}) & {_ID_MASK}) AS pid, (t."globalTid" & {_ID_MASK}) AS stream, '
        f'COALESCE(n."value", \'\') AS name, t."start" + {utc} AS start_ns, t."end" + {utc} AS end_ns, '
        f't."correlationId" AS correlation FROM "{table}" t LEFT JOIN "StringIds" n ON n."id" = t."nameId"')
    df["name"] = vc.strip_api_version(df["name"])
    df["device"] = -1
    df["role"] = "other"
    return df


def _read_stream_waits(s: sq.SqliteSchema, utc: int) -> pd.DataFrame:
    """Rows of kind ``wait``: the cudaStreamWaitEvent records of the SYNCHRONIZATION table
    (syncType 2, CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT), on the waiting stream."""
    cols = ["pid", "device", "stream", "name", "start_ns", "end_ns", "correlation"]
    if not s.has(SYNC_TABLE) or not {"syncType", "streamId", "start", "end"} <= s.columns(SYNC_TABLE):
        return pd.DataFrame(columns=cols).astype({c: "int64" for c in cols if c != "name"})
    df = s.query(f'SELECT {_pid_expr(s, SYNC_TABLE)} AS pid, {_col(s, SYNC_TABLE, "deviceId", "-1")} AS device, '
                 f't."streamId" AS stream, \'Stream Wait Event\' AS name, t."start" + {utc} AS start_ns, '
                 f't."end" + {utc} AS end_ns, {_col(s, SYNC_TABLE, "correlationId", "-1")} AS correlation '
                 f'FROM "{SYNC_TABLE}" t WHERE t."syncType" = {_STREAM_WAIT_EVENT}')
    return df.astype({c: "int64" for c in cols if c != "name"}).assign(kind="wait", role="other")


def _read_ranges(s: sq.SqliteSchema, utc: int) -> pd.DataFrame:
    """NVTX ranges (not instantaneous marks) with their text."""
    empty = vc.empty_host_rows().drop(columns=["correlation"])
    if not s.has(NVTX):
        return empty
    s.require_columns(NVTX, ("start", "end", "globalTid"))
    text, join = _nvtx_text(s, "text", "textId", "n")
    if not text:
        return empty
    where = 't."end" IS NOT NULL AND t."end" >= t."start"'
    if "eventType" in s.columns(NVTX):
        where += f' AND t."eventType" IN ({", ".join(map(str, _NVTX_RANGE_TYPES))})'
    df = s.query(
        f'SELECT ((t."globalTid" >> {_PID_SHIFT}) & {_ID_MASK}) AS pid, (t."globalTid" & {_ID_MASK}) AS stream, '
        f'COALESCE({", ".join(text)}, \'\') AS name, t."start" + {utc} AS start_ns, t."end" + {utc} AS end_ns '
        f'FROM "{NVTX}" t{join} WHERE {where}')
    return df.astype({"pid": "int64", "stream": "int64", "start_ns": "int64", "end_ns": "int64"})


def _read_collective_calls(s: sq.SqliteSchema, utc: int) -> pd.DataFrame:
    """NCCL's own NVTX ranges (``ncclAllReduce``, ...; NCCL 2.19+ in the "NCCL" domain) with the
    sizes their payloads carry: "Message size [bytes]", and the communicator whose "No. of ranks"
    its ``ncclCommInitRank`` range gave. Nsight Systems exports a range's payload as JSON
    (``jsonText``, or ``jsonTextId`` into StringIds); older NCCL records none (sizes stay -1)."""
    if not s.has(NVTX):
        return vc.empty_collective_calls()
    text, text_join = _nvtx_text(s, "text", "textId", "n")
    payload, payload_join = _nvtx_text(s, "jsonText", "jsonTextId", "j")
    joins = text_join + payload_join
    if not text or not {"start", "end", "globalTid"} <= s.columns(NVTX):
        return vc.empty_collective_calls()
    label = f"COALESCE({', '.join(text)}, '')"
    df = s.query(
        f'SELECT ((t."globalTid" >> {_PID_SHIFT}) & {_ID_MASK}) AS pid, (t."globalTid" & {_ID_MASK}) AS stream, '
        f'{label} AS name, t."start" + {utc} AS start_ns, t."end" + {utc} AS end_ns, '
        f'{("COALESCE(" + ", ".join(payload) + ", NULL)") if payload else "NULL"} AS payload '
        f'FROM "{NVTX}" t{joins} WHERE t."end" IS NOT NULL AND {label} LIKE \'nccl%\'')
    if df.empty:
        return vc.empty_collective_calls()
    fields = [_payload_fields(p) for p in df["payload"]]
    ranks_of_comm = {f["comm"]: f["nranks"] for n, f in zip(df["name"], fields)
                     if str(n).lower().startswith(("ncclcomminit", "ncclcommsplit")) and f["comm"] is not None and f["nranks"] > 0}
    op = [vocabulary.normalize_collective(str(n)[4:]) for n in df["name"]]
    keep = np.array([o in vocabulary.COLLECTIVES for o in op], bool)
    out = pd.DataFrame({"pid": df["pid"], "stream": df["stream"], "start_ns": df["start_ns"], "end_ns": df["end_ns"],
                        "op": op, "payload_bytes": [f["bytes"] for f in fields],
                        "group_size": [f["nranks"] if f["nranks"] > 0 else ranks_of_comm.get(f["comm"], -1) for f in fields]})
    return out[keep].astype({c: "int64" for c in vc.COLLECTIVE_CALL_COLUMNS if c != "op"})


def _nvtx_text(s: sq.SqliteSchema, inline: str, by_id: str, alias: str) -> tuple[list[str], str]:
    """The SQL expressions of an NVTX_EVENTS text field (the event's ``t``): its own column
    ``inline`` and its StringIds entry by column ``by_id`` (joined as ``alias``), those the export
    has; and the join that needs."""
    cols = s.columns(NVTX)
    exprs = [f't."{inline}"'] if inline in cols else []
    join = ""
    if by_id in cols and s.has("StringIds"):
        exprs.append(f'{alias}."value"')
        join = f' LEFT JOIN "StringIds" {alias} ON {alias}."id" = t."{by_id}"'
    return exprs, join


def _payload_fields(payload) -> dict:
    """Message size, communicator and number of ranks in an NVTX payload exported as JSON (NCCL's
    schema entry names: "Message size [bytes]", "NCCL communicator ID", "No. of ranks")."""
    out = {"bytes": -1, "comm": None, "nranks": -1}
    if not isinstance(payload, str) or not payload.strip():
        return out
    try:
        doc = json.loads(payload)
    except (json.JSONDecodeError, RecursionError):
        return out
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                key = str(k).lower()
                if isinstance(v, (dict, list)):
                    stack.append(v)
                elif "message size" in key or key in ("bytes", "size"):
                    out["bytes"] = ints.nonneg(v, out["bytes"])
                elif "communicator" in key or key in ("comm", "commhash"):
                    out["comm"] = v
                elif "no. of ranks" in key or key in ("nranks", "ranks"):
                    out["nranks"] = ints.nonneg(v, out["nranks"])
        elif isinstance(node, list):
            stack.extend(node)
    return out


def _mpi_ranks(s: sq.SqliteSchema) -> dict[int, int]:
    if not (s.has("MPI_RANKS") and {"globalTid", "rank"} <= s.columns("MPI_RANKS")):
        return {}
    rows = s.fetchall(f'SELECT (("globalTid" >> {_PID_SHIFT}) & {_ID_MASK}), "rank" FROM "MPI_RANKS"')
    return {int(p): int(r) for p, r in rows}


#: TARGET_INFO_GPU columns -> meta["hardware"] keys (clockRate in Hz, memoryBandwidth in bytes/s)
_GPU_INFO = {"name": "name", "smCount": "num_sms", "totalMemory": "memory_bytes", "memoryBandwidth": "memory_bandwidth_bytes_per_s",
             "clockRate": "clock_hz", "l2CacheSize": "l2_bytes"}


def _hardware(s: sq.SqliteSchema, gpu: pd.DataFrame) -> dict:
    """The GPU most of the file's GPU rows ran on, from TARGET_INFO_GPU (its ``id`` is the
    ``deviceId`` of the activity tables): name, SMs, memory size and bandwidth, clock, L2, compute
    capability, and whether it is integrated (host memory is device memory). Without the table, the
    kernels' names may still say the architecture (``vendor_common.arch_from_kernel_names``)."""
    hw: dict = {"vendor": "nvidia"}
    t = "TARGET_INFO_GPU"
    cols = s.columns(t) if s.has(t) else set()
    present = {c: k for c, k in _GPU_INFO.items() if c in cols}
    extra = [c for c in ("computeMajor", "computeMinor", "isDiscrete") if c in cols]
    if present or extra:
        by_id = "id" in cols
        sel = ", ".join(f'"{c}"' for c in [*present, *extra, *(["id"] if by_id else [])])
        rows = s.fetchall(f'SELECT {sel} FROM "{t}"')
        used = gpu["device"].mode() if len(gpu) else pd.Series([], dtype="int64")
        want = int(used.iloc[0]) if len(used) else None
        row = next((r for r in rows if by_id and r[-1] == want), rows[0] if rows else None)
        if row is not None:
            values = dict(zip([*present, *extra], row))
            hw.update({k: values[c] for c, k in present.items() if values.get(c) not in (None, "", 0)})
            if values.get("computeMajor") is not None:
                hw["compute_capability"] = f"{int(values['computeMajor'])}.{int(values.get('computeMinor') or 0)}"
            if values.get("isDiscrete") == 0:
                hw["integrated"] = True
    if "compute_capability" not in hw and len(gpu):
        hint = vc.arch_from_kernel_names(gpu.loc[gpu["kind"] == "kernel", "name"])
        if hint:
            hw["arch_hint"] = hint
    return hw


def _software(s: sq.SqliteSchema) -> dict:
    sw = {}
    for t in ("META_DATA_EXPORT", "META_DATA_CAPTURE"):
        if s.has(t) and {"name", "value"} <= s.columns(t):
            for name, value in s.fetchall(f'SELECT "name", "value" FROM "{t}"'):
                if name in ("EXPORT_SCHEMA_VERSION", "EXPORT_PROGRAM_VERSION", "CAPTURE_PROGRAM_VERSION", "NSYS_VERSION"):
                    sw[f"nsys_{str(name).lower()}"] = value
    return sw
