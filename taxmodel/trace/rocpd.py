"""Import AMD rocpd databases (rocprofv3's default output since ROCm 7: ``*_results.db``).

The schema is rocprofiler-sdk's ``rocpd_tables.sql`` (schema 3.x): every table carries a
per-run suffix (``rocpd_kernel_dispatch_<uuid>``) and the database defines views without it
(``rocpd_kernel_dispatch`` ...) plus data views such as ``kernels`` and ``regions``. Merged
databases hold several runs, told apart by the ``guid`` column that every join must match.
This importer reads the base views when they exist, else unions the suffixed tables itself, so
it works on databases whose views were dropped or never created:

- ``rocpd_kernel_dispatch`` (+ ``rocpd_info_kernel_symbol.display_name``): kernels, grid in
  work-items (converted to blocks);
- ``rocpd_memory_copy`` (+ ``rocpd_string`` for the direction): copies;
- ``rocpd_region`` (+ ``rocpd_event`` category): HIP/HSA/RCCL API calls and ROCTx ranges
  (category ``MARKER_*``; the message is ``extdata.message`` when present);
- ``rocpd_event.stack_id``: the internal correlation id linking calls to GPU work
  (``rocpd_event.correlation_id`` is the *external* id);
- ``rocpd_info_agent.type_index``: GPU index; ``rocpd_info_process.environment``: the rank
  (RANK, OMPI_COMM_WORLD_RANK, ...) when every process has one.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from taxmodel.errors import InputError
from taxmodel.trace import rocprof
from taxmodel.trace import sqlite_input as sq
from taxmodel.trace import vendor_common as vc

FORMAT = "rocpd"

_BASES = ("rocpd_string", "rocpd_info_process", "rocpd_info_agent", "rocpd_info_kernel_symbol", "rocpd_event",
          "rocpd_kernel_dispatch", "rocpd_memory_copy", "rocpd_region", "rocpd_metadata", "rocpd_arg")
_NEEDED = {
    "rocpd_kernel_dispatch": ("guid", "pid", "tid", "agent_id", "kernel_id", "stream_id", "start", "end",
                              "workgroup_size_x", "workgroup_size_y", "workgroup_size_z",
                              "grid_size_x", "grid_size_y", "grid_size_z", "event_id"),
    "rocpd_info_kernel_symbol": ("id", "guid", "kernel_name", "display_name"),
    "rocpd_event": ("id", "guid", "category_id", "stack_id"),
    "rocpd_info_agent": ("id", "guid", "type", "type_index"),
    "rocpd_info_process": ("id", "guid", "pid"),
    "rocpd_string": ("id", "guid", "string"),
}


def sniff(path: Path, head: bytes, tables: set[str]) -> bool:
    return any(n.startswith("rocpd_") for n in tables)


def read(paths: list[Path], *, iteration_pattern: str | None = None) -> tuple[pd.DataFrame, dict]:
    vc.compile_iteration_pattern(iteration_pattern)
    per_file, hardware, software = [], {}, {}
    for index, path in enumerate(paths):
        with sq.sqlite_connection(Path(path)) as conn, sq.sqlite_errors(Path(path), "rocpd"):
            f = _read_file(sq.SqliteSchema(conn, Path(path), "rocpd"), index) | {"file": str(path)}
        hardware, software = hardware or f.pop("hardware"), software or f.pop("software")
        per_file.append(f)
    events, ranks, how = vc.assemble(per_file, iteration_pattern)
    return events, rocprof.amd_meta("rocpd", ranks, how, hardware, tracer="rocprofv3 --output-format rocpd",
                                    per_file=per_file, software=software)


class _Tables:
    """SQL source text for each logical rocpd table: the view when present, else a UNION ALL
    of the uuid-suffixed tables of every run in the file."""

    def __init__(self, s: sq.SqliteSchema):
        self.s = s
        suffixes = sorted({n[len("rocpd_string"):] for n in s.names if n.startswith("rocpd_string_")})
        self.src: dict[str, str] = {}
        self.columns: dict[str, set[str]] = {}
        for base in _BASES:
            if s.has(base):
                self.src[base], self.columns[base] = f'"{base}"', s.columns(base)
                continue
            parts = [base + sfx for sfx in suffixes if s.has(base + sfx)]
            if parts:
                cols = set.intersection(*(s.columns(p) for p in parts))
                self.columns[base] = cols
                collist = ", ".join(f'"{c}"' for c in sorted(cols))
                self.src[base] = "(" + " UNION ALL ".join(f'SELECT {collist} FROM "{p}"' for p in parts) + ")"

    def require(self, base: str) -> str:
        if base not in self.src:
            raise InputError(f"{self.s.path}: rocpd table '{base}' is missing (neither the view nor any "
                             f"'{base}_<uuid>' table); was the database written by `rocprofv3 --output-format rocpd`?")
        missing = [c for c in _NEEDED.get(base, ()) if c not in self.columns[base]]
        if missing:
            raise InputError(f"{self.s.path}: rocpd table '{base}' lacks column(s) {', '.join(repr(c) for c in missing)}")
        return self.src[base]

    def has(self, base: str) -> bool:
        return base in self.src


def _read_file(s: sq.SqliteSchema, file_index: int) -> dict:
    t = _Tables(s)
    K, S, E, A, P, STR = (t.require(b) for b in ("rocpd_kernel_dispatch", "rocpd_info_kernel_symbol", "rocpd_event",
                                                    "rocpd_info_agent", "rocpd_info_process", "rocpd_string"))
    graph = "K.graph_exec_id" if "graph_exec_id" in t.columns["rocpd_kernel_dispatch"] else "0"
    kernels = s.query(f"""
        SELECT K.guid AS guid, P.pid AS pid, COALESCE(A.type_index, -1) AS device, K.stream_id AS stream,
               COALESCE(NULLIF(KS.display_name, ''), KS.kernel_name, '') AS name,
               K.start AS start_ns, K."end" AS end_ns, E.stack_id AS correlation, {graph} AS graph_id,
               K.grid_size_x AS grid_x, K.grid_size_y AS grid_y, K.grid_size_z AS grid_z,
               K.workgroup_size_x AS wg_x, K.workgroup_size_y AS wg_y, K.workgroup_size_z AS wg_z
        FROM {K} K
        JOIN {P} P ON P.id = K.pid AND P.guid = K.guid
        LEFT JOIN {A} A ON A.id = K.agent_id AND A.guid = K.guid
        LEFT JOIN {S} KS ON KS.id = K.kernel_id AND KS.guid = K.guid
        LEFT JOIN {E} E ON E.id = K.event_id AND E.guid = K.guid""")
    copies = pd.DataFrame(columns=["guid", "pid", "stream", "direction", "src_device", "dst_device", "start_ns",
                                   "end_ns", "correlation", "bytes"])
    if t.has("rocpd_memory_copy"):
        M = t.require("rocpd_memory_copy")
        copies = s.query(f"""
            SELECT M.guid AS guid, P.pid AS pid, COALESCE(M.stream_id, -1) AS stream, N.string AS direction,
                   COALESCE(SA.type_index, -1) AS src_device, COALESCE(DA.type_index, -1) AS dst_device,
                   M.start AS start_ns, M."end" AS end_ns, E.stack_id AS correlation, M.size AS bytes
            FROM {M} M
            JOIN {P} P ON P.id = M.pid AND P.guid = M.guid
            LEFT JOIN {STR} N ON N.id = M.name_id AND N.guid = M.guid
            LEFT JOIN {A} SA ON SA.id = M.src_agent_id AND SA.guid = M.guid AND SA.type = 'GPU'
            LEFT JOIN {A} DA ON DA.id = M.dst_agent_id AND DA.guid = M.guid AND DA.type = 'GPU'
            LEFT JOIN {E} E ON E.id = M.event_id AND E.guid = M.guid""")
    regions = pd.DataFrame(columns=["guid", "pid", "stream", "name", "start_ns", "end_ns", "correlation", "category", "extdata"])
    if t.has("rocpd_region"):
        R = t.require("rocpd_region")
        tid = "T.tid" if s.has("rocpd_info_thread") else "R.tid"
        thread_join = 'LEFT JOIN "rocpd_info_thread" T ON T.id = R.tid AND T.guid = R.guid' if s.has("rocpd_info_thread") else ""
        regions = s.query(f"""
            SELECT R.guid AS guid, P.pid AS pid, COALESCE({tid}, -1) AS stream, N.string AS name,
                   R.start AS start_ns, R."end" AS end_ns, COALESCE(E.stack_id, -1) AS correlation,
                   C.string AS category, E.extdata AS extdata
            FROM {R} R
            JOIN {P} P ON P.id = R.pid AND P.guid = R.guid
            LEFT JOIN {STR} N ON N.id = R.name_id AND N.guid = R.guid
            LEFT JOIN {E} E ON E.id = R.event_id AND E.guid = R.guid
            LEFT JOIN {STR} C ON C.id = E.category_id AND C.guid = E.guid
            {thread_join}""")

    sized = _collective_calls(s, t)
    # A merged database may hold the same pid from two runs: key processes by (guid, pid).
    keys = pd.concat([kernels[["guid", "pid"]], copies[["guid", "pid"]], regions[["guid", "pid"]]]).drop_duplicates()
    key_of = {(g, int(p)): int(p) if not keys["pid"].duplicated().any() else int(p) + 10_000_000 * i
              for i, (g, p) in enumerate(zip(keys["guid"], keys["pid"]))}
    sized = sized[np.array([(g, int(p)) in key_of for g, p in zip(sized["guid"], sized["pid"])], dtype=bool)].copy()
    for df in (kernels, copies, regions, sized):
        df["pid"] = [key_of[(g, int(p))] for g, p in zip(df["guid"], df["pid"])]
        df.drop(columns=["guid"], inplace=True)

    gpu = rocprof.finish_gpu(kernels, copies) if len(kernels) or len(copies) else kernels
    if gpu.empty:
        raise InputError(f"{s.path}: rocpd database has no kernel dispatches or memory copies; trace with "
                         "`rocprofv3 --kernel-trace --memory-copy-trace`")
    is_marker = regions["category"].fillna("").astype(str).str.upper().str.startswith("MARKER").to_numpy()
    ranges = regions[is_marker].copy()
    ranges["name"] = [_marker_text(n, x) for n, x in zip(ranges["name"], ranges["extdata"])]
    calls = regions[~is_marker].drop(columns=["category", "extdata"]).astype(
        {"stream": "int64", "start_ns": "int64", "end_ns": "int64", "correlation": "int64"})
    declared = _declared_ranks(s, t, key_of)
    return {"file_index": file_index, "gpu": gpu, "calls": calls.assign(device=-1, role="other"),
            "ranges": ranges.drop(columns=["category", "extdata", "correlation"]).astype(
                {"stream": "int64", "start_ns": "int64", "end_ns": "int64"}),
            "processes": vc.process_table(gpu, file_index, declared),
            "collective_calls": sized.astype({c: "int64" for c in vc.COLLECTIVE_CALL_COLUMNS if c != "op"}),
            "hardware": _hardware(s, t), "software": _software(s, t)}


def _collective_calls(s: sq.SqliteSchema, t: _Tables) -> pd.DataFrame:
    """RCCL API calls (``ncclAllReduce`` regions) with the sizes their recorded arguments give
    (``rocpd_arg``: ``count``/``sendcount``/``recvcount`` and ``datatype``, in rocprofv3's
    callback tracing), as ``vendor_common.COLLECTIVE_CALL_COLUMNS`` plus ``guid``."""
    empty = vc.empty_collective_calls().assign(guid=pd.Series([], dtype=object))
    if not (t.has("rocpd_region") and t.has("rocpd_arg")) or not {"event_id", "name", "value"} <= t.columns["rocpd_arg"]:
        return empty
    R, P, E, STR, ARG = (t.require(b) for b in ("rocpd_region", "rocpd_info_process", "rocpd_event", "rocpd_string", "rocpd_arg"))
    tid = "T.tid" if s.has("rocpd_info_thread") else "R.tid"
    thread_join = 'LEFT JOIN "rocpd_info_thread" T ON T.id = R.tid AND T.guid = R.guid' if s.has("rocpd_info_thread") else ""
    rows = s.query(f"""
        SELECT R.guid AS guid, R.id AS region, P.pid AS pid, COALESCE({tid}, -1) AS stream, N.string AS name,
               R.start AS start_ns, R."end" AS end_ns, A.name AS arg, A.value AS value
        FROM {R} R
        JOIN {P} P ON P.id = R.pid AND P.guid = R.guid
        JOIN {STR} N ON N.id = R.name_id AND N.guid = R.guid
        JOIN {ARG} A ON A.event_id = R.event_id AND A.guid = R.guid
        {thread_join}
        WHERE N.string LIKE 'nccl%' OR N.string LIKE 'rccl%'""")
    if rows.empty:
        return empty
    out = []
    for (guid, _), g in rows.groupby(["guid", "region"], sort=False):
        first = g.iloc[0]
        op, payload = vc.call_from_args(str(first["name"]), dict(zip(g["arg"].astype(str), g["value"])))
        if op:
            out.append({"guid": guid, "pid": int(first["pid"]), "stream": int(first["stream"]), "start_ns": int(first["start_ns"]),
                        "end_ns": int(first["end_ns"]), "op": op, "payload_bytes": payload, "group_size": -1})
    return pd.DataFrame(out) if out else empty


def _marker_text(name, extdata) -> str:
    """The ROCTx message: ``extdata.message`` when recorded, else the region's name."""
    if isinstance(extdata, str) and "message" in extdata:
        try:
            value = json.loads(extdata)
            if isinstance(value, dict) and value.get("message"):
                return str(value["message"])
        except json.JSONDecodeError:
            pass
    return "" if name is None else str(name)


def _declared_ranks(s: sq.SqliteSchema, t: _Tables, key_of: dict) -> dict[int, int]:
    if "environment" not in t.columns.get("rocpd_info_process", set()):
        return {}
    rows = s.fetchall(f'SELECT guid, pid, environment FROM {t.src["rocpd_info_process"]}')
    out = {}
    for guid, pid, env in rows:
        try:
            env = json.loads(env) if isinstance(env, str) else {}
        except json.JSONDecodeError:
            env = {}
        rank = vc.rank_from_environment(env if isinstance(env, dict) else {})
        if (guid, int(pid)) in key_of and rank >= 0:
            out[key_of[(guid, int(pid))]] = rank
    return out


def _hardware(s: sq.SqliteSchema, t: _Tables) -> dict:
    row = s.conn.execute(f"SELECT product_name, name FROM {t.src['rocpd_info_agent']} WHERE type = 'GPU' LIMIT 1").fetchone() \
        if {"product_name", "name"} <= t.columns["rocpd_info_agent"] else None
    if not row:
        return {}
    return {k: v for k, v in (("name", row[0] or row[1]), ("arch", row[1])) if v}


def _software(s: sq.SqliteSchema, t: _Tables) -> dict:
    if not t.has("rocpd_metadata") or not {"tag", "value"} <= t.columns["rocpd_metadata"]:
        return {}
    rows = s.fetchall(f"SELECT tag, value FROM {t.src['rocpd_metadata']}")
    return {f"rocpd_{re.sub(r'[^a-z0-9]+', '_', str(k).lower())}": v for k, v in rows if str(k).lower() == "schema_version"}
