"""Import AMD rocprofv3 CSV traces (``--output-format csv``, the default before ROCm 7).

rocprofv3 writes one set of files per process, ``<prefix>kernel_trace.csv``,
``<prefix>hip_api_trace.csv``, ``<prefix>memory_copy_trace.csv``,
``<prefix>marker_api_trace.csv`` (and ``agent_info.csv``), with ``<prefix>`` usually
``<pid>_``. Each file is recognised by its header, not its name:
- kernel trace: ``Kernel_Name``, ``Correlation_Id``, ``Start_Timestamp``, ``End_Timestamp``,
  ``Agent_Id``, ``Workgroup_Size_[XYZ]``, ``Grid_Size_[XYZ]`` (work-items), ``Queue_Id``
  (``Stream_Id`` in newer versions);
- API traces (HIP, HSA, RCCL, markers): ``Domain``, ``Function``, ``Process_Id``,
  ``Thread_Id``, ``Correlation_Id``; rows whose Domain starts with ``MARKER`` are ROCTx
  ranges (their Function is the message);
- memory copies: ``Direction``, ``Source_Agent_Id``, ``Destination_Agent_Id``;
- agent info: ``Agent_Type`` and ``Logical_Node_Id``/``Node_Id``, used to turn agent ids into
  GPU indices (``Agent 2`` / ``2`` are logical node ids; ``GPU 1`` is already a GPU index).
Files of one process are grouped by directory and prefix; each group is one process, ranked in
the order the groups' first files are given (see vendor_common.assign_ranks).
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd

from taxmodel.errors import InputError
from taxmodel.trace import importers, inflate, rocprof
from taxmodel.trace import vendor_common as vc

FORMAT = "rocprof-csv"

_KINDS = {
    "kernel": ("Kernel_Name", "Correlation_Id", "Start_Timestamp", "End_Timestamp"),
    "copy": ("Direction", "Correlation_Id", "Start_Timestamp", "End_Timestamp"),
    "api": ("Domain", "Function", "Correlation_Id", "Start_Timestamp", "End_Timestamp"),
    "agent": ("Agent_Type",),
}
_SUFFIX = re.compile(r"(kernel|hip_api|hsa_api|rccl_api|marker_api|memory_copy|agent_info|hip_runtime)(_trace)?\.csv(\.gz)?$")


def _header(head: bytes) -> list[str]:
    first = head.split(b"\n", 1)[0].decode("utf-8", errors="replace").strip("\r\ufeff")
    try:
        return next(csv.reader(io.StringIO(first)))
    except (StopIteration, csv.Error):
        return []


def file_kind(head: bytes) -> str | None:
    """Which rocprofv3 CSV a header belongs to (kernel, copy, api, agent), or None."""
    cols = set(_header(head))
    for kind, needed in _KINDS.items():
        if set(needed) <= cols:
            return kind
    return None


def sniff(path: Path, head: bytes, tables: set[str]) -> bool:
    return file_kind(head) is not None


def read(paths: list[Path], *, iteration_pattern: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Events and partial meta from rocprofv3 CSV files (any mix of the per-process files)."""
    vc.compile_iteration_pattern(iteration_pattern)
    groups: dict[tuple[str, str], dict[str, list[pd.DataFrame]]] = {}
    for path in map(Path, paths):
        kind = file_kind(importers.read_head(path))
        if kind is None:
            raise InputError(f"{path}: not a rocprofv3 CSV trace (header has none of the kernel/API/memory-copy/agent columns)")
        key = (str(path.parent), _SUFFIX.sub("", path.name) if _SUFFIX.search(path.name) else path.stem)
        groups.setdefault(key, {}).setdefault(kind, []).append(_read_csv(path))
    per_file = [_read_group(i, key, g) | {"file": str(Path(key[0]) / (key[1] + "*.csv"))}
                for i, (key, g) in enumerate(groups.items())]
    if not any(len(f["gpu"]) for f in per_file):
        raise InputError(f"{paths[0]}: no kernel or memory-copy rows in the rocprofv3 CSV files given; "
                         "include the *kernel_trace.csv files (rocprofv3 --kernel-trace)")
    events, ranks, how = vc.assemble(per_file, iteration_pattern)
    return events, rocprof.amd_meta("rocprof", ranks, how, {}, tracer="rocprofv3 --output-format csv", per_file=per_file)


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        with inflate.open_input_text(path, "the trace") as fh:
            return pd.read_csv(fh, dtype={"Agent_Id": str, "Source_Agent_Id": str, "Destination_Agent_Id": str})
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
        raise InputError(f"{path}: cannot be read as CSV ({exc})") from exc


def _agent_number(values: pd.Series) -> tuple[pd.Series, pd.Series]:
    """('GPU 1' | 'Agent 2' | '2') -> (number, is already a GPU index)."""
    text = values.astype(str).str.strip()
    number = pd.to_numeric(text.str.extract(r"(-?\d+)\s*$", expand=False), errors="coerce").fillna(-1).astype("int64")
    return number, text.str.upper().str.startswith("GPU")


def _gpu_index_map(agents: list[pd.DataFrame]) -> dict[int, int] | None:
    """Logical node id -> GPU index from agent_info.csv."""
    if not agents:
        return None
    a = vc.concat(agents)
    node = next((c for c in ("Logical_Node_Id", "Node_Id") if c in a), None)
    if node is None:
        return None
    gpus = a[a["Agent_Type"].astype(str).str.upper().str.contains("GPU")].sort_values(node)
    type_id = "Logical_Node_Type_Id" if "Logical_Node_Type_Id" in gpus else None
    return {int(n): int(gpus[type_id].iloc[i]) if type_id else i for i, n in enumerate(gpus[node])}


def _devices(values: pd.Series, gpu_map: dict[int, int] | None) -> pd.Series:
    """GPU index of each agent id; -1 for CPU agents. Without agent_info.csv a bare number
    is kept as is (rocprof's logical node id, which counts CPU agents first)."""
    number, is_gpu = _agent_number(values)
    is_cpu = values.astype(str).str.strip().str.upper().str.startswith("CPU").to_numpy()
    mapped = number if gpu_map is None else number.map(gpu_map).fillna(-1).astype("int64")
    return pd.Series(np.where(is_gpu, number, np.where(is_cpu, -1, mapped)), index=values.index)


def _read_group(file_index: int, key: tuple[str, str], g: dict[str, list[pd.DataFrame]]) -> dict:
    gpu_map = _gpu_index_map(g.get("agent", []))
    api = vc.concat(g.get("api", [])) if g.get("api") else pd.DataFrame(columns=list(_KINDS["api"]))
    pid = _group_pid(key, api, file_index)
    kern = vc.concat(g.get("kernel", [])) if g.get("kernel") else pd.DataFrame()
    kernels = pd.DataFrame(columns=["pid", "device", "stream", "name", "start_ns", "end_ns", "correlation"])
    if len(kern):
        need = [c for c in ("Agent_Id", *(f"{p}_Size_{a}" for p in ("Workgroup", "Grid") for a in "XYZ")) if c not in kern]
        if need:
            raise InputError(f"{key[0]}/{key[1]}kernel_trace.csv lacks column(s) {', '.join(need)}")
        stream_col = "Stream_Id" if "Stream_Id" in kern else "Queue_Id" if "Queue_Id" in kern else None
        kernels = pd.DataFrame({
            "pid": pid, "device": _devices(kern["Agent_Id"], gpu_map),
            "stream": pd.to_numeric(kern[stream_col], errors="coerce").fillna(-1) if stream_col else -1,
            "name": kern["Kernel_Name"].astype(str), "start_ns": kern["Start_Timestamp"], "end_ns": kern["End_Timestamp"],
            "correlation": kern["Correlation_Id"],
            **{f"grid_{a.lower()}": kern[f"Grid_Size_{a}"] for a in "XYZ"},
            **{f"wg_{a.lower()}": kern[f"Workgroup_Size_{a}"] for a in "XYZ"},
        })
    cp = vc.concat(g.get("copy", [])) if g.get("copy") else pd.DataFrame()
    copies = pd.DataFrame(columns=["pid", "stream", "direction", "src_device", "dst_device", "start_ns", "end_ns",
                                   "correlation", "bytes"])
    if len(cp):
        copies = pd.DataFrame({
            "pid": pid, "stream": pd.to_numeric(cp["Stream_Id"], errors="coerce").fillna(-1) if "Stream_Id" in cp else -1,
            "direction": cp["Direction"].astype(str),
            "src_device": _devices(cp.get("Source_Agent_Id", pd.Series("-1", index=cp.index)), gpu_map),
            "dst_device": _devices(cp.get("Destination_Agent_Id", pd.Series("-1", index=cp.index)), gpu_map),
            "start_ns": cp["Start_Timestamp"], "end_ns": cp["End_Timestamp"], "correlation": cp["Correlation_Id"],
            "bytes": cp["Bytes"] if "Bytes" in cp else -1,
        })
    gpu = rocprof.finish_gpu(kernels, copies) if len(kernels) or len(copies) else kernels
    host = pd.DataFrame({
        "pid": pid, "stream": pd.to_numeric(api["Thread_Id"], errors="coerce").fillna(-1).astype("int64") if "Thread_Id" in api else -1,
        "name": api["Function"].astype(str), "start_ns": api["Start_Timestamp"], "end_ns": api["End_Timestamp"],
        "correlation": api["Correlation_Id"],
    }).astype({"start_ns": "int64", "end_ns": "int64", "correlation": "int64"})
    is_marker = api["Domain"].astype(str).str.upper().str.startswith("MARKER").to_numpy()
    return {"file_index": file_index, "gpu": gpu, "calls": host[~is_marker].assign(device=-1, role="other"),
            "ranges": host[is_marker].drop(columns=["correlation"]), "processes": vc.process_table(gpu, file_index)}


def _group_pid(key: tuple[str, str], api: pd.DataFrame, index: int) -> int:
    """The process id of a file group: Process_Id of its API rows, else a number in its prefix."""
    if "Process_Id" in api and len(api):
        return int(pd.to_numeric(api["Process_Id"], errors="coerce").dropna().iloc[0])
    m = re.search(r"(\d+)_?$", key[1])
    return int(m.group(1)) if m else index
