"""Import AMD rocprofv3 traces written with ``--output-format json`` (``*_results.json``).

The layout follows rocprofiler-sdk's "JSON output schema" (rocprofv3 docs, ROCm 6.2+): a top
key ``rocprofiler-sdk-tool`` holding one object per traced process, each with ``metadata.pid``,
``agents``, ``kernel_symbols`` (kernel_id -> names), ``strings.buffer_records`` (names of
every buffer-tracing kind and operation, indexed by their enum values), ``strings.marker_api``
(ROCTx messages keyed by correlation id) and ``buffer_records`` with ``kernel_dispatch``,
``hip_api``, ``marker_api``, ``rccl_api``, ``memory_copy`` records.

Conversions shared by every AMD importer (also used by rocprof_csv.py and rocpd.py):
- grids are reported in work-items (HSA semantics) and become blocks: ceil(grid / workgroup);
- the internal correlation id links HIP calls to the dispatches and copies they enqueued;
- RCCL kernels get role ``comm`` and the op from their name (see vendor_common);
- copies are named ``Memcpy HtoD`` etc.; a copy between two GPUs is ``PtoP`` with role comm.
Ranks: one JSON file per process in the order the files are given, processes within a file
by GPU index (see :func:`taxmodel.trace.vendor_common.assign_ranks`).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from taxmodel.errors import InputError
from taxmodel.trace import inflate
from taxmodel.trace import vendor_common as vc

FORMAT = "rocprof-json"
TOP_KEY = "rocprofiler-sdk-tool"
_COPY_DIRECTIONS = {"HOST_TO_DEVICE": "HtoD", "DEVICE_TO_HOST": "DtoH", "DEVICE_TO_DEVICE": "DtoD",
                    "HOST_TO_HOST": "HtoH"}


def sniff(path: Path, head: bytes, tables: set[str]) -> bool:
    """rocprofv3 JSON: a JSON object whose (first) key is ``rocprofiler-sdk-tool``."""
    text = head.lstrip()
    return text.startswith(b"{") and f'"{TOP_KEY}"'.encode() in text[:4096]


def read(paths: list[Path], *, iteration_pattern: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Events and partial meta from rocprofv3 JSON files."""
    vc.compile_iteration_pattern(iteration_pattern)
    per_file, hardware = [], {}
    for index, path in enumerate(paths):
        f = _read_file(Path(path), index) | {"file": str(path)}
        hardware = hardware or f.pop("hardware")
        per_file.append(f)
    events, ranks, how = vc.assemble(per_file, iteration_pattern)
    return events, amd_meta("rocprof", ranks, how, hardware, tracer="rocprofv3 --output-format json", per_file=per_file)


def amd_meta(source: str, ranks: list[int], how: str, hardware: dict, *, tracer: str, per_file: list[dict],
             software: dict | None = None) -> dict:
    """Partial meta every AMD importer returns."""
    return {"source": source, "world_size": len(ranks), "ranks": ranks, "inputs": vc.inputs_meta(per_file),
            "hardware": {"vendor": "amd", **hardware},
            "software": software or {}, "capture": {"tracer": tracer, "rank_assignment": how},
            "notes": [f"{source}: {how}"]}


def copy_name(direction: pd.Series, src_device: pd.Series, dst_device: pd.Series) -> pd.Series:
    """``MEMORY_COPY_HOST_TO_DEVICE`` -> ``Memcpy HtoD``; a device-to-device copy between two
    different GPUs is ``Memcpy PtoP``."""
    key = direction.astype(str).str.replace("MEMORY_COPY_", "", regex=False)
    short = key.map(_COPY_DIRECTIONS).fillna("Unknown")
    peer = (short == "DtoD") & (src_device >= 0) & (dst_device >= 0) & (src_device != dst_device)
    return "Memcpy " + short.where(~peer, "PtoP")


def finish_gpu(kernels: pd.DataFrame, copies: pd.DataFrame) -> pd.DataFrame:
    """Schema columns for AMD kernel rows (grid in work-items) and copy rows (direction names).

    kernels: pid, device, stream, name, start_ns, end_ns, correlation, grid_x..z (work-items),
    wg_x..z, graph_id. copies: pid, stream, direction, src_device, dst_device, start_ns, end_ns,
    correlation, bytes.
    """
    frames = []
    if len(kernels):  # a copies-only trace (rocprofv3 --memory-copy-trace) has no kernel columns
        k = kernels.copy()
        k["kind"] = "kernel"
        k["role"], k["collective_op"] = vc.classify_kernels(k["name"])
        k["grid"] = vc.dims(*(vc.blocks_from_work_items(k[f"grid_{a}"], k[f"wg_{a}"]) for a in "xyz"))
        k["block"] = vc.dims(k["wg_x"], k["wg_y"], k["wg_z"])
        k = k.drop(columns=[f"{p}_{a}" for p in ("grid", "wg") for a in "xyz"])
        if "graph_id" in k:
            k["graph_id"] = k["graph_id"].fillna(0).astype("int64")
            k["graph_id"] = k["graph_id"].where(k["graph_id"] > 0, -1)
        frames.append(k)
    if len(copies):
        c = copies.copy()
        src, dst = c["src_device"].astype("int64"), c["dst_device"].astype("int64")
        c["kind"] = "memcpy"
        c["name"] = copy_name(c["direction"], src, dst)
        # The direction says which end is a GPU: agent ids of host memory are not GPU indices
        # (without agent_info.csv a CPU agent reads as a number like any other), so only a
        # device-to-device copy between two GPUs moves data between ranks.
        c["role"] = np.where(c["name"] == "Memcpy PtoP", "comm", "copy")
        c["device"] = np.where(c["name"] == "Memcpy DtoH", src, np.where(dst >= 0, dst, src))
        frames.append(c.drop(columns=["direction", "src_device", "dst_device"]))
    out = vc.concat(frames) if frames else kernels
    return out.astype({col: "int64" for col in ("pid", "device", "stream", "start_ns", "end_ns", "correlation")})


def _read_file(path: Path, file_index: int) -> dict:
    try:
        with inflate.open_input_text(path, "the trace") as fh:
            data = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError) as exc:
        raise InputError(f"{path}: not readable as rocprofv3 JSON ({exc})") from exc
    procs = data.get(TOP_KEY) if isinstance(data, dict) else None
    if not isinstance(procs, list) or not procs:
        raise InputError(f"{path}: rocprofv3 JSON has no '{TOP_KEY}' list of processes; was it written by `rocprofv3 --output-format json`?")
    parts = [_read_process(path, i, proc) for i, proc in enumerate(procs)]
    gpu = vc.concat([p["gpu"] for p in parts])
    if gpu.empty:
        raise InputError(f"{path}: rocprofv3 JSON has no kernel_dispatch or memory_copy records; trace with `rocprofv3 --kernel-trace --memory-copy-trace`")
    return {"file_index": file_index, "gpu": gpu, "calls": vc.concat([p["calls"] for p in parts]),
            "ranges": vc.concat([p["ranges"] for p in parts]), "processes": vc.process_table(gpu, file_index),
            "hardware": parts[0]["hardware"]}


def _need(obj: dict, key: str, path: Path, where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise InputError(f"{path}: rocprofv3 JSON {where} lacks '{key}'")
    return obj[key]


def _read_process(path: Path, index: int, proc: dict) -> dict:
    where = f"process #{index}"
    meta = proc.get("metadata", {})
    pid = int(meta.get("pid", index))
    records = _need(proc, "buffer_records", path, where)
    strings = proc.get("strings", {})
    names = _buffer_names(strings.get("buffer_records", []))
    gpu_index = _gpu_indices(proc.get("agents", []))
    symbols = {int(s["kernel_id"]): _kernel_name(s) for s in _as_list(proc.get("kernel_symbols", [])) if "kernel_id" in s}

    kernels = pd.DataFrame([_dispatch_row(r, pid, gpu_index, symbols, path) for r in records.get("kernel_dispatch", [])],
                           columns=["pid", "device", "stream", "name", "start_ns", "end_ns", "correlation",
                                    "grid_x", "grid_y", "grid_z", "wg_x", "wg_y", "wg_z"])
    copies = pd.DataFrame([{
        "pid": pid, "stream": _handle(r.get("stream_id"), -1),
        "direction": _op_name(names, r), "src_device": gpu_index.get(_handle(r.get("src_agent_id")), -1),
        "dst_device": gpu_index.get(_handle(r.get("dst_agent_id")), -1),
        "start_ns": r["start_timestamp"], "end_ns": r["end_timestamp"],
        "correlation": r["correlation_id"]["internal"], "bytes": r.get("bytes", -1),
    } for r in records.get("memory_copy", [])], columns=["pid", "stream", "direction", "src_device", "dst_device",
                                                          "start_ns", "end_ns", "correlation", "bytes"])
    calls = pd.DataFrame([_host_row(r, pid, _op_name(names, r))
                          for key in ("hip_api", "rccl_api", "hsa_api") for r in records.get(key, [])],
                         columns=["pid", "stream", "name", "start_ns", "end_ns", "correlation"])
    messages = {int(m["key"]): str(m["value"]) for m in strings.get("marker_api", []) if "key" in m and "value" in m}
    ranges = pd.DataFrame([_host_row(r, pid, messages.get(int(r["correlation_id"]["internal"]), _op_name(names, r)))
                           for r in records.get("marker_api", [])],
                          columns=["pid", "stream", "name", "start_ns", "end_ns", "correlation"])
    gpu = finish_gpu(kernels, copies) if len(kernels) or len(copies) else kernels.iloc[0:0]
    return {"gpu": gpu, "calls": calls.assign(device=-1, role="other"), "ranges": ranges.drop(columns=["correlation"]),
            "hardware": _hardware(proc.get("agents", []))}


def _as_list(value) -> list:
    return list(value.values()) if isinstance(value, dict) else list(value)


def _handle(value, default: int = 0) -> int:
    if isinstance(value, dict):
        return int(value.get("handle", default))
    return default if value is None else int(value)


def _kernel_name(symbol: dict) -> str:
    for key in ("demangled_kernel_name", "formatted_kernel_name", "kernel_name", "truncated_kernel_name"):
        if symbol.get(key):
            return str(symbol[key])
    return ""


def _buffer_names(entries: list) -> list[tuple[str, list[str]]]:
    """strings.buffer_records: entry i names buffer-tracing kind i and its operations."""
    return [(str(e.get("kind", "")), [str(o) for o in e.get("operations", [])]) for e in entries]


def _op_name(names: list[tuple[str, list[str]]], record: dict) -> str:
    kind, op = int(record.get("kind", -1)), int(record.get("operation", -1))
    if 0 <= kind < len(names) and 0 <= op < len(names[kind][1]):
        return names[kind][1][op]
    return f"operation_{kind}_{op}"


def _gpu_indices(agents: list) -> dict[int, int]:
    """agent handle -> GPU index (logical_node_type_id, else order of GPU agents by node id)."""
    gpus = [a for a in agents if int(a.get("type", 0)) == 2]
    if all("logical_node_type_id" in a for a in gpus):
        return {_handle(a.get("id")): int(a["logical_node_type_id"]) for a in gpus}
    ordered = sorted(gpus, key=lambda a: int(a.get("node_id", 0)))
    return {_handle(a.get("id")): i for i, a in enumerate(ordered)}


def _dispatch_row(r: dict, pid: int, gpu_index: dict[int, int], symbols: dict[int, str], path: Path) -> dict:
    info = _need(r, "dispatch_info", path, "kernel_dispatch record")
    grid, wg = info.get("grid_size", {}), info.get("workgroup_size", {})
    stream = _handle(r.get("stream_id"), -1)
    return {
        "pid": pid, "device": gpu_index.get(_handle(info.get("agent_id")), -1),
        "stream": stream if stream >= 0 else _handle(info.get("queue_id"), -1),
        "name": symbols.get(int(info.get("kernel_id", -1)), f"kernel_{info.get('kernel_id')}"),
        "start_ns": r["start_timestamp"], "end_ns": r["end_timestamp"], "correlation": r["correlation_id"]["internal"],
        **{f"grid_{a}": grid.get(a, 1) for a in "xyz"}, **{f"wg_{a}": wg.get(a, 1) for a in "xyz"},
    }


def _host_row(r: dict, pid: int, name: str) -> dict:
    return {"pid": pid, "stream": int(r.get("thread_id", -1)), "name": name, "start_ns": r["start_timestamp"],
            "end_ns": r["end_timestamp"], "correlation": r["correlation_id"]["internal"]}


def _hardware(agents: list) -> dict:
    gpus = [a for a in agents if int(a.get("type", 0)) == 2]
    if not gpus:
        return {}
    a = gpus[0]
    hw = {"name": a.get("product_name") or a.get("name")}
    if "cu_count" in a:
        hw["num_sms"] = int(a["cu_count"])
    if a.get("name"):
        hw["arch"] = a["name"]
    return {k: v for k, v in hw.items() if v}
