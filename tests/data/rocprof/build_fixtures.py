"""Build the rocprofv3 fixtures (JSON, CSV, rocpd SQLite) from tests/trace/vendor_scenario.py.

Run: ``python tests/data/rocprof/build_fixtures.py``. Formats followed (see README.md):
- JSON: rocprofv3 "JSON output schema" (rocprofiler-sdk docs, ROCm 6.2-6.4); the operation
  name lists in ``strings.buffer_records`` are cut to the names used, at their enum positions;
- CSV: rank 0 in the ROCm 6.2 column layout (integer Agent_Id + agent_info.csv), rank 1 in the
  rocpd-converted layout of ROCm 7 (Agent_Id as 'GPU n', Stream_Id);
- rocpd: rocprofiler-sdk ``rocpd_tables.sql`` schema 3.0.3 (the tables read, uuid-suffixed,
  plus the ``rocpd_*`` views over them).
"""
from __future__ import annotations

import csv
import json
import sqlite3
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "trace"))
import vendor_scenario as sc  # noqa: E402

BUFFER_KINDS = ("NONE", "HSA_CORE_API", "HSA_AMD_EXT_API", "HSA_IMAGE_EXT_API", "HSA_FINALIZE_EXT_API",
                "HIP_RUNTIME_API", "HIP_COMPILER_API", "MARKER_CORE_API", "MARKER_CONTROL_API", "MARKER_NAME_API",
                "MEMORY_COPY", "KERNEL_DISPATCH", "PAGE_MIGRATION", "SCRATCH_MEMORY", "CORRELATION_ID_RETIREMENT",
                "RCCL_API")
HIP_OPS = ("hipApiName", "hipDeviceSynchronize", "hipLaunchKernel", "hipMemcpyAsync")
COPY_OPS = ("MEMORY_COPY_NONE", "MEMORY_COPY_HOST_TO_HOST", "MEMORY_COPY_HOST_TO_DEVICE", "MEMORY_COPY_DEVICE_TO_HOST",
            "MEMORY_COPY_DEVICE_TO_DEVICE")
MARKER_OPS = ("roctxMarkA", "roctxRangePushA", "roctxRangePop")
CPU_HANDLE, GPU_HANDLE0 = 100, 200
KERNEL_IDS = {sc.GEMM: 1, sc.NCCL_AMD: 2}


def _api(kind: str) -> str:
    return sc.API["hip"][kind]


def _work_items(grid, block):
    return [g * b for g, b in zip(grid, block)]


# --- JSON ----------------------------------------------------------------------------------

def json_process(r: int) -> dict:
    rec = sc.records(r, vendor="amd")
    kind = {k: i for i, k in enumerate(BUFFER_KINDS)}
    buffer_names = [{"kind": k, "operations": list({"HIP_RUNTIME_API": HIP_OPS, "MEMORY_COPY": COPY_OPS,
                                                     "MARKER_CORE_API": MARKER_OPS}.get(k, ()))} for k in BUFFER_KINDS]
    agents = [{"size": 0, "id": {"handle": CPU_HANDLE}, "type": 1, "node_id": 0, "logical_node_id": 0,
               "logical_node_type_id": 0, "name": "AMD EPYC 9654"}]
    agents += [{"size": 0, "id": {"handle": GPU_HANDLE0 + g}, "type": 2, "node_id": 1 + g, "logical_node_id": 1 + g,
                "logical_node_type_id": g, "name": "gfx942", "product_name": "AMD Instinct MI300X", "cu_count": 304}
               for g in sc.RANKS]
    corr = lambda c: {"internal": c, "external": 0}  # noqa: E731
    dispatches = [{
        "size": 0, "kind": kind["KERNEL_DISPATCH"], "operation": 1, "thread_id": sc.pid(r), "correlation_id": corr(k["corr"]),
        "start_timestamp": k["start"], "end_timestamp": k["end"], "stream_id": {"handle": k["stream"]},
        "dispatch_info": {"size": 0, "agent_id": {"handle": GPU_HANDLE0 + r}, "queue_id": {"handle": 900 + k["stream"]},
                          "kernel_id": KERNEL_IDS[k["name"]], "dispatch_id": i + 1, "private_segment_size": 0,
                          "group_segment_size": 0,
                          "workgroup_size": dict(zip("xyz", k["block"])),
                          "grid_size": dict(zip("xyz", _work_items(k["grid"], k["block"])))},
    } for i, k in enumerate(rec["kernels"])]
    hip = [{"size": 0, "kind": kind["HIP_RUNTIME_API"], "operation": HIP_OPS.index(_api(c["api"])),
            "correlation_id": corr(c["corr"]), "start_timestamp": c["start"], "end_timestamp": c["end"],
            "thread_id": sc.pid(r)} for c in rec["calls"]]
    copies = [{"size": 0, "kind": kind["MEMORY_COPY"], "operation": COPY_OPS.index("MEMORY_COPY_HOST_TO_DEVICE"),
               "correlation_id": corr(c["corr"]), "start_timestamp": c["start"], "end_timestamp": c["end"],
               "thread_id": sc.pid(r), "dst_agent_id": {"handle": GPU_HANDLE0 + r}, "src_agent_id": {"handle": CPU_HANDLE},
               "bytes": c["bytes"]} for c in rec["copies"]]
    markers = [{"size": 0, "kind": kind["MARKER_CORE_API"], "operation": 1, "correlation_id": corr(1000 + i),
                "start_timestamp": m["start"], "end_timestamp": m["end"], "thread_id": sc.pid(r)}
               for i, m in enumerate(rec["markers"])]
    return {
        "metadata": {"pid": sc.pid(r), "init_time": sc.base(r) - 1_000_000, "fini_time": sc.base(r) + 1_000_000},
        "agents": agents, "counters": [],
        "strings": {"callback_records": [], "buffer_records": buffer_names,
                    "marker_api": [{"key": 1000 + i, "value": m["name"]} for i, m in enumerate(rec["markers"])]},
        "code_objects": [],
        "kernel_symbols": [{"size": 0, "kernel_id": i, "code_object_id": 1, "kernel_name": f"_Z{len(n)}mangled{i}",
                            "formatted_kernel_name": n, "demangled_kernel_name": n, "truncated_kernel_name": n.split("(")[0]}
                           for n, i in KERNEL_IDS.items()],
        "callback_records": {"counter_collection": []},
        "buffer_records": {"kernel_dispatch": dispatches, "hip_api": hip, "hsa_api": [], "marker_api": markers,
                           "rccl_api": [], "memory_copy": copies, "scratch_memory": []},
    }


def write_json(path: Path, ranks=sc.RANKS) -> Path:
    path.write_text(json.dumps({"rocprofiler-sdk-tool": [json_process(r) for r in ranks]}, separators=(",", ":")))
    return path


# --- CSV -----------------------------------------------------------------------------------

def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, quoting=csv.QUOTE_NONNUMERIC)
        w.writerow(header)
        w.writerows(rows)


def write_csv(folder: Path, r: int, *, layout: str) -> list[Path]:
    """One process's CSV files; layout 'rocm6' (integer node ids + agent_info) or 'rocm7'."""
    folder.mkdir(parents=True, exist_ok=True)
    rec, p = sc.records(r, vendor="amd"), sc.pid(r)
    agent = (lambda g: 1 + g) if layout == "rocm6" else (lambda g: f"GPU {g}")
    out = []
    if layout == "rocm6":
        header = ["Kind", "Agent_Id", "Queue_Id", "Thread_Id", "Dispatch_Id", "Kernel_Id", "Kernel_Name", "Correlation_Id",
                  "Start_Timestamp", "End_Timestamp", "Private_Segment_Size", "Group_Segment_Size", "Workgroup_Size_X",
                  "Workgroup_Size_Y", "Workgroup_Size_Z", "Grid_Size_X", "Grid_Size_Y", "Grid_Size_Z"]
        rows = [["KERNEL_DISPATCH", agent(r), k["stream"], p, i + 1, KERNEL_IDS[k["name"]], k["name"], k["corr"], k["start"],
                 k["end"], 0, 0, *k["block"], *_work_items(k["grid"], k["block"])] for i, k in enumerate(rec["kernels"])]
        copy_header = ["Kind", "Direction", "Source_Agent_Id", "Destination_Agent_Id", "Correlation_Id", "Start_Timestamp",
                       "End_Timestamp"]
        copy_rows = [["MEMORY_COPY", "MEMORY_COPY_HOST_TO_DEVICE", 0, agent(r), c["corr"], c["start"], c["end"]]
                     for c in rec["copies"]]
        out.append(folder / f"{p}_agent_info.csv")
        _write_csv(out[-1], ["Node_Id", "Logical_Node_Id", "Agent_Type", "Name"],
                   [[0, 0, "CPU", "AMD EPYC 9654"]] + [[1 + g, 1 + g, "GPU", "gfx942"] for g in sc.RANKS])
    else:
        header = ["Kind", "Agent_Id", "Queue_Id", "Stream_Id", "Thread_Id", "Dispatch_Id", "Kernel_Id", "Kernel_Name",
                  "Correlation_Id", "Start_Timestamp", "End_Timestamp", "LDS_Block_Size", "Scratch_Size", "VGPR_Count",
                  "Accum_VGPR_Count", "SGPR_Count", "Workgroup_Size_X", "Workgroup_Size_Y", "Workgroup_Size_Z",
                  "Grid_Size_X", "Grid_Size_Y", "Grid_Size_Z"]
        rows = [["KERNEL_DISPATCH", agent(r), 900 + k["stream"], k["stream"], p, i + 1, KERNEL_IDS[k["name"]], k["name"],
                 k["corr"], k["start"], k["end"], 0, 0, 128, 0, 32, *k["block"], *_work_items(k["grid"], k["block"])]
                for i, k in enumerate(rec["kernels"])]
        copy_header = ["Kind", "Direction", "Stream_Id", "Source_Agent_Id", "Destination_Agent_Id", "Correlation_Id",
                       "Start_Timestamp", "End_Timestamp"]
        copy_rows = [["MEMORY_COPY", "MEMORY_COPY_HOST_TO_DEVICE", c["stream"], "CPU 0", agent(r), c["corr"], c["start"],
                      c["end"]] for c in rec["copies"]]
    out.append(folder / f"{p}_kernel_trace.csv")
    _write_csv(out[-1], header, rows)
    out.append(folder / f"{p}_memory_copy_trace.csv")
    _write_csv(out[-1], copy_header, copy_rows)
    api_header = ["Domain", "Function", "Process_Id", "Thread_Id", "Correlation_Id", "Start_Timestamp", "End_Timestamp"]
    out.append(folder / f"{p}_hip_api_trace.csv")
    _write_csv(out[-1], api_header, [["HIP_RUNTIME_API", _api(c["api"]), p, p, c["corr"], c["start"], c["end"]]
                                     for c in rec["calls"]])
    out.append(folder / f"{p}_marker_api_trace.csv")
    _write_csv(out[-1], api_header, [["MARKER_CORE_API" if layout == "rocm6" else "MARKER_CORE_RANGE_API", m["name"], p, p,
                                      1000 + i, m["start"], m["end"]] for i, m in enumerate(rec["markers"])])
    return out


# --- rocpd ---------------------------------------------------------------------------------

ROCPD_TABLES = {
    "rocpd_metadata": "id INTEGER PRIMARY KEY, tag TEXT NOT NULL, value TEXT NOT NULL",
    "rocpd_string": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, string TEXT NOT NULL",
    "rocpd_info_node": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, hash BIGINT, machine_id TEXT, hostname TEXT",
    "rocpd_info_process": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, nid INTEGER, ppid INTEGER, pid INTEGER NOT NULL, "
                          "init BIGINT, fini BIGINT, start BIGINT, \"end\" BIGINT, command TEXT, environment JSONB, extdata JSONB",
    "rocpd_info_thread": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, nid INTEGER, ppid INTEGER, pid INTEGER, tid INTEGER, name TEXT",
    "rocpd_info_agent": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, nid INTEGER, pid INTEGER, type TEXT, "
                        "absolute_index INTEGER, logical_index INTEGER, type_index INTEGER, uuid INTEGER, name TEXT, "
                        "model_name TEXT, vendor_name TEXT, product_name TEXT, user_name TEXT, extdata JSONB",
    "rocpd_info_stream": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, nid INTEGER, pid INTEGER, name TEXT",
    "rocpd_info_queue": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, nid INTEGER, pid INTEGER, name TEXT",
    "rocpd_info_kernel_symbol": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, nid INTEGER, pid INTEGER, "
                                "code_object_id INTEGER, kernel_name TEXT, display_name TEXT",
    "rocpd_event": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, category_id INTEGER, stack_id INTEGER, "
                   "parent_stack_id INTEGER, correlation_id INTEGER, call_stack JSONB, line_info JSONB, extdata JSONB",
    "rocpd_region": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, nid INTEGER, pid INTEGER, tid INTEGER, start BIGINT, "
                    "\"end\" BIGINT, name_id INTEGER, event_id INTEGER, extdata JSONB",
    "rocpd_kernel_dispatch": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, nid INTEGER, pid INTEGER, tid INTEGER, "
                             "agent_id INTEGER, kernel_id INTEGER, dispatch_id INTEGER, queue_id INTEGER, stream_id INTEGER, "
                             "start BIGINT, \"end\" BIGINT, private_segment_size INTEGER, group_segment_size INTEGER, "
                             "workgroup_size_x INTEGER, workgroup_size_y INTEGER, workgroup_size_z INTEGER, "
                             "grid_size_x INTEGER, grid_size_y INTEGER, grid_size_z INTEGER, graph_exec_id INTEGER DEFAULT 0, "
                             "graph_node_id INTEGER DEFAULT 0, region_name_id INTEGER, event_id INTEGER, extdata JSONB",
    "rocpd_memory_copy": "id INTEGER PRIMARY KEY, guid TEXT NOT NULL, nid INTEGER, pid INTEGER, tid INTEGER, start BIGINT, "
                         "\"end\" BIGINT, name_id INTEGER, dst_agent_id INTEGER, dst_address INTEGER, src_agent_id INTEGER, "
                         "src_address INTEGER, size INTEGER, queue_id INTEGER, stream_id INTEGER, "
                         "graph_exec_id INTEGER DEFAULT 0, graph_node_id INTEGER DEFAULT 0, region_name_id INTEGER, "
                         "event_id INTEGER, extdata JSONB",
}


def write_rocpd(path: Path, r: int, *, env_rank: int | None = None, views: bool = True) -> Path:
    """One process's rocpd database (schema 3.0.3 layout); env_rank sets RANK in its environment."""
    path.unlink(missing_ok=True)
    uuid = f"_0199c0de_7a3b_7000_8000_00000000000{r}"
    guid = f"0199c0de-7a3b-7000-8000-00000000000{r}"
    p = sc.pid(r)
    rec = sc.records(r, vendor="amd")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size = 512")
    for name, cols in ROCPD_TABLES.items():
        conn.execute(f'CREATE TABLE "{name}{uuid}" ({cols})')
        if views:
            conn.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "{name}{uuid}"')

    def ins(table: str, **values) -> int:
        cur = conn.execute(f'INSERT INTO "{table}{uuid}" ({", ".join(chr(34) + k + chr(34) for k in values)}) '
                           f'VALUES ({", ".join("?" * len(values))})', list(values.values()))
        return cur.lastrowid

    strings: dict[str, int] = {}

    def s(text: str) -> int:
        if text not in strings:
            strings[text] = ins("rocpd_string", guid=guid, string=text)
        return strings[text]

    ins("rocpd_metadata", tag="schema_version", value="3.0.3")
    ins("rocpd_metadata", tag="uuid", value=uuid[1:])
    ins("rocpd_metadata", tag="guid", value=guid)
    ins("rocpd_info_node", id=1, guid=guid, hash=1, machine_id="fixture", hostname="mi300x-node")
    env = {"HOME": "/root"} if env_rank is None else {"HOME": "/root", "RANK": str(env_rank), "WORLD_SIZE": "2"}
    ins("rocpd_info_process", id=p, guid=guid, nid=1, ppid=1, pid=p, command="python -m taxmodel", environment=json.dumps(env),
        extdata="{}")
    ins("rocpd_info_thread", id=p, guid=guid, nid=1, ppid=1, pid=p, tid=p)
    ins("rocpd_info_agent", id=0, guid=guid, nid=1, pid=p, type="CPU", absolute_index=0, logical_index=0, type_index=0,
        name="AMD EPYC 9654", extdata="{}")
    for g in sc.RANKS:
        ins("rocpd_info_agent", id=1 + g, guid=guid, nid=1, pid=p, type="GPU", absolute_index=1 + g, logical_index=1 + g,
            type_index=g, name="gfx942", product_name="AMD Instinct MI300X", extdata="{}")
    for stream in (sc.GEMM_STREAM, sc.NCCL_STREAM):
        ins("rocpd_info_stream", id=stream, guid=guid, nid=1, pid=p, name=f"Stream {stream}")
        ins("rocpd_info_queue", id=900 + stream, guid=guid, nid=1, pid=p, name=f"Queue {stream}")
    for name, kid in KERNEL_IDS.items():
        ins("rocpd_info_kernel_symbol", id=kid, guid=guid, nid=1, pid=p, code_object_id=1, kernel_name=f"_Z{kid}mangled",
            display_name=name)
    for i, k in enumerate(rec["kernels"]):
        ev = ins("rocpd_event", guid=guid, category_id=s("KERNEL_DISPATCH"), stack_id=k["corr"], parent_stack_id=k["corr"],
                 correlation_id=0, extdata="{}")
        wi = _work_items(k["grid"], k["block"])
        ins("rocpd_kernel_dispatch", id=i + 1, guid=guid, nid=1, pid=p, tid=p, agent_id=1 + r, kernel_id=KERNEL_IDS[k["name"]],
            dispatch_id=i + 1, queue_id=900 + k["stream"], stream_id=k["stream"], start=k["start"], end=k["end"],
            workgroup_size_x=k["block"][0], workgroup_size_y=k["block"][1], workgroup_size_z=k["block"][2],
            grid_size_x=wi[0], grid_size_y=wi[1], grid_size_z=wi[2], region_name_id=s(k["name"]), event_id=ev)
    for c in rec["copies"]:
        ev = ins("rocpd_event", guid=guid, category_id=s("MEMORY_COPY"), stack_id=c["corr"], parent_stack_id=c["corr"],
                 correlation_id=0, extdata="{}")
        ins("rocpd_memory_copy", guid=guid, nid=1, pid=p, tid=p, start=c["start"], end=c["end"],
            name_id=s("MEMORY_COPY_HOST_TO_DEVICE"), dst_agent_id=1 + r, src_agent_id=0, size=c["bytes"],
            stream_id=c["stream"], event_id=ev)
    for c in rec["calls"]:
        ev = ins("rocpd_event", guid=guid, category_id=s("HIP_RUNTIME_API_EXT"), stack_id=c["corr"],
                 parent_stack_id=0, correlation_id=0, extdata="{}")
        ins("rocpd_region", guid=guid, nid=1, pid=p, tid=p, start=c["start"], end=c["end"], name_id=s(_api(c["api"])),
            event_id=ev, extdata="{}")
    for i, m in enumerate(rec["markers"]):
        ev = ins("rocpd_event", guid=guid, category_id=s("MARKER_CORE_RANGE_API"), stack_id=1000 + i, parent_stack_id=0,
                 correlation_id=0, extdata=json.dumps({"message": m["name"]}))
        ins("rocpd_region", guid=guid, nid=1, pid=p, tid=p, start=m["start"], end=m["end"], name_id=s("roctxThreadRangeA"),
            event_id=ev, extdata="{}")
    conn.commit()
    conn.execute("VACUUM")
    conn.close()
    return path


def main() -> None:
    write_json(HERE / "two_ranks_results.json")
    write_csv(HERE / "csv", 0, layout="rocm6")
    write_csv(HERE / "csv", 1, layout="rocm7")
    for r in sc.RANKS:
        write_rocpd(HERE / f"rank{r}_results.db", r, env_rank=r)
    for p in sorted(HERE.rglob("*")):
        if p.is_file() and p.suffix in (".json", ".csv", ".db"):
            print(f"{p.relative_to(HERE)}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
