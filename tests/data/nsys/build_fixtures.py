"""Build the nsys SQLite fixtures from tests/trace/vendor_scenario.py.

Run from anywhere: ``python tests/data/nsys/build_fixtures.py``. The tables follow the layout
of ``nsys export --type sqlite`` from Nsight Systems 2024.x (NVIDIA's "SQLite Export Schema
Reference"; column lists as in that export, unused columns filled with 0). Tests also call
:func:`write_nsys` with options to build variants (old schemas, missing tables) in a tmp dir.
"""
from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "trace"))
import vendor_scenario as sc  # noqa: E402

UTC_EPOCH_NS = 1_700_000_000_000_000_000
"""Session start (TARGET_INFO_SESSION_START_TIME.utcEpochNs); nsys stores times relative to it."""

KERNEL_COLUMNS = (
    "start", "end", "deviceId", "contextId", "greenContextId", "streamId", "correlationId", "globalPid",
    "demangledName", "shortName", "mangledName", "launchType", "cacheConfig", "registersPerThread",
    "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "staticSharedMemory", "dynamicSharedMemory",
    "localMemoryPerThread", "localMemoryTotal", "gridId", "sharedMemoryExecuted", "graphNodeId",
    "sharedMemoryLimitConfig", "qmdBulkReleaseDone", "qmdPreexitDone", "qmdLastCtaDone", "graphId",
)
MEMCPY_COLUMNS = (
    "start", "end", "deviceId", "contextId", "greenContextId", "streamId", "correlationId", "globalPid",
    "bytes", "copyKind", "deprecatedSrcId", "srcKind", "dstKind", "srcDeviceId", "srcContextId",
    "dstDeviceId", "dstContextId", "migrationCause", "graphNodeId", "virtualAddress",
)
MEMSET_COLUMNS = (
    "start", "end", "deviceId", "contextId", "greenContextId", "streamId", "correlationId", "globalPid",
    "value", "bytes", "graphNodeId", "memKind",
)
API_COLUMNS = ("start", "end", "eventClass", "globalTid", "correlationId", "nameId", "returnValue", "callchainId")
NVTX_COLUMNS = ("start", "end", "eventType", "rangeId", "category", "color", "text", "globalTid", "endGlobalTid",
                "textId", "domainId", "uint64Value", "int64Value", "doubleValue", "uint32Value", "int32Value",
                "floatValue", "jsonTextId", "jsonText")

HTOD = 1  # ENUM_CUDA_MEMCPY_OPER (CUPTI's numbering)
MEM_KINDS = ("PAGEABLE", "PINNED", "DEVICE", "ARRAY", "MANAGED", "DEVICE_STATIC", "MANAGED_STATIC", "UNKNOWN")
PINNED, DEVICE = MEM_KINDS.index("PINNED"), MEM_KINDS.index("DEVICE")  # ENUM_CUDA_MEM_KIND: Nsight Systems' own numbering
PUSH_POP, MARK = 59, 34
LAUNCHER_PID = 3999


def global_tid(pid: int, tid: int) -> int:
    return (pid << 24) | tid


class _Db:
    def __init__(self, path: Path, drop_columns: dict[str, tuple[str, ...]] | None = None):
        path.unlink(missing_ok=True)
        self.conn = sqlite3.connect(path)
        self.conn.execute("PRAGMA page_size = 512")
        self.drop = drop_columns or {}
        self.strings: dict[str, int] = {}
        self.tables: dict[str, tuple[str, ...]] = {}

    def string(self, value: str) -> int:
        return self.strings.setdefault(value, len(self.strings) + 1)

    def table(self, name: str, columns: tuple[str, ...]) -> None:
        cols = tuple(c for c in columns if c not in self.drop.get(name, ()))
        self.tables[name] = cols
        self.conn.execute(f'CREATE TABLE "{name}" ({", ".join(f"{c} INTEGER" if c != "text" and c != "jsonText" else f"{c} TEXT" for c in cols)})')

    def insert(self, name: str, **values) -> None:
        cols = self.tables[name]
        self.conn.execute(f'INSERT INTO "{name}" VALUES ({", ".join("?" * len(cols))})', [values.get(c, 0) for c in cols])

    def close(self) -> None:
        self.conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        self.conn.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, v) for v, i in self.strings.items()])
        self.conn.commit()
        self.conn.execute("VACUUM")
        self.conn.close()


def write_nsys(path: Path, ranks: tuple[int, ...], *, extras: bool = False, omit_tables: tuple[str, ...] = (),
               drop_columns: dict[str, tuple[str, ...]] | None = None, mpi_ranks: dict[int, int] | None = None,
               session_start: bool = True) -> Path:
    """Write the scenario's ``ranks`` as processes of one nsys export at ``path``.

    extras: also a launcher process without GPU work, a memset, a Triton kernel launched through
    the driver API, a CUDA graph launch of two kernels, a non-iteration NVTX range and an NVTX
    mark (correlation ids 10n+5..7 on rank 0 only).
    """
    db = _Db(path, drop_columns)
    tables = {
        "CUPTI_ACTIVITY_KIND_KERNEL": KERNEL_COLUMNS, "CUPTI_ACTIVITY_KIND_MEMCPY": MEMCPY_COLUMNS,
        "CUPTI_ACTIVITY_KIND_MEMSET": MEMSET_COLUMNS, "CUPTI_ACTIVITY_KIND_RUNTIME": API_COLUMNS,
        "CUPTI_ACTIVITY_KIND_DRIVER": API_COLUMNS, "NVTX_EVENTS": NVTX_COLUMNS,
    }
    for name, cols in tables.items():
        if name not in omit_tables:
            db.table(name, cols)
    utc = UTC_EPOCH_NS if session_start else 0
    if session_start:
        db.conn.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT)")
        db.conn.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (UTC_EPOCH_NS,))
    db.conn.execute("CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER PRIMARY KEY, name TEXT, label TEXT)")
    db.conn.executemany("INSERT INTO ENUM_CUDA_MEM_KIND VALUES (?, ?, ?)",
                        [(i, f"CUDA_MEMOPR_MEMORY_KIND_{k}", k.replace("_", " ").title()) for i, k in enumerate(MEM_KINDS)])
    db.conn.execute("CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT)")
    db.conn.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.11.1')")
    db.conn.execute("CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT, busLocation TEXT, totalMemory INTEGER, smCount INTEGER)")
    db.conn.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H200', '0000:18:00.0', 150754820096, 132)")
    if mpi_ranks is not None:
        db.conn.execute("CREATE TABLE MPI_RANKS (globalTid INTEGER, rank INTEGER)")
        for r, mpi_rank in mpi_ranks.items():
            db.conn.execute("INSERT INTO MPI_RANKS VALUES (?, ?)", (global_tid(sc.pid(r), sc.pid(r)), mpi_rank))
    api = sc.API["nsys"]
    has = db.tables.__contains__
    for r in ranks:
        p = sc.pid(r)
        gpid, gtid = global_tid(p, 0), global_tid(p, p)
        rec = sc.records(r, vendor="nvidia")
        if has("NVTX_EVENTS"):
            for m in rec["markers"]:
                db.insert("NVTX_EVENTS", start=m["start"] - utc, end=m["end"] - utc, eventType=PUSH_POP,
                          text=m["name"], globalTid=gtid, rangeId=0)
        if has("CUPTI_ACTIVITY_KIND_RUNTIME"):
            for c in rec["calls"]:
                db.insert("CUPTI_ACTIVITY_KIND_RUNTIME", start=c["start"] - utc, end=c["end"] - utc, globalTid=gtid,
                          correlationId=c["corr"], nameId=db.string(api[c["api"]]), eventClass=1)
        if has("CUPTI_ACTIVITY_KIND_KERNEL"):
            for k in rec["kernels"]:
                _kernel(db, r, gpid, k, utc)
        if has("CUPTI_ACTIVITY_KIND_MEMCPY"):
            for c in rec["copies"]:
                db.insert("CUPTI_ACTIVITY_KIND_MEMCPY", start=c["start"] - utc, end=c["end"] - utc, deviceId=r,
                          contextId=1, streamId=c["stream"], correlationId=c["corr"], globalPid=gpid,
                          bytes=c["bytes"], copyKind=HTOD, srcKind=PINNED, dstKind=DEVICE, srcDeviceId=r, dstDeviceId=r)
        if extras and r == 0:
            _extras(db, r, gpid, gtid, utc)
    if extras:
        launcher = global_tid(LAUNCHER_PID, LAUNCHER_PID)
        db.insert("CUPTI_ACTIVITY_KIND_RUNTIME", start=sc.BASE_NS - 50_000 - utc, end=sc.BASE_NS - 49_000 - utc,
                  globalTid=launcher, correlationId=1, nameId=db.string("cudaMalloc_v3020"))
    db.close()
    return path


def _kernel(db: _Db, r: int, gpid: int, k: dict, utc: int, graph_id: int = 0) -> None:
    name = db.string(k["name"])
    short = db.string(k["name"].split("(")[0])
    db.insert("CUPTI_ACTIVITY_KIND_KERNEL", start=k["start"] - utc, end=k["end"] - utc, deviceId=r, contextId=1,
              streamId=k["stream"], correlationId=k["corr"], globalPid=gpid, demangledName=name, shortName=short,
              mangledName=short, gridX=k["grid"][0], gridY=k["grid"][1], gridZ=k["grid"][2], blockX=k["block"][0],
              blockY=k["block"][1], blockZ=k["block"][2], graphId=graph_id, graphNodeId=graph_id and 100 + k["corr"],
              registersPerThread=96)


def _extras(db: _Db, r: int, gpid: int, gtid: int, utc: int) -> None:
    b = sc.base(r)
    for k, n in enumerate(sc.ITERATIONS):
        o = b + k * sc.ITERATION_NS
        db.insert("CUPTI_ACTIVITY_KIND_RUNTIME", start=o + 9_600 - utc, end=o + 9_700 - utc, globalTid=gtid,
                  correlationId=10 * n + 5, nameId=db.string("cudaMemsetAsync_v3020"))
        db.insert("CUPTI_ACTIVITY_KIND_MEMSET", start=o + 46_000 - utc, end=o + 47_000 - utc, deviceId=r, contextId=1,
                  streamId=sc.GEMM_STREAM, correlationId=10 * n + 5, globalPid=gpid, value=0, bytes=1024, memKind=DEVICE)
        db.insert("CUPTI_ACTIVITY_KIND_DRIVER", start=o + 20_000 - utc, end=o + 21_000 - utc, globalTid=gtid,
                  correlationId=10 * n + 6, nameId=db.string("cuLaunchKernel"))
        _kernel(db, r, gpid, dict(name="_triton_fused_kernel", stream=sc.GEMM_STREAM, start=o + 50_000,
                                  end=o + 52_000, corr=10 * n + 6, grid=(4, 1, 1), block=(128, 1, 1)), utc)
        db.insert("CUPTI_ACTIVITY_KIND_RUNTIME", start=o + 22_000 - utc, end=o + 23_000 - utc, globalTid=gtid,
                  correlationId=10 * n + 7, nameId=db.string("cudaGraphLaunch_v10000"))
        for j in range(2):
            _kernel(db, r, gpid, dict(name=f"graph_node_kernel_{j}", stream=sc.GEMM_STREAM, start=o + 60_000 + 3_000 * j,
                                      end=o + 62_000 + 3_000 * j, corr=10 * n + 7, grid=(1, 1, 1), block=(32, 1, 1)),
                    utc, graph_id=3)
        db.insert("NVTX_EVENTS", start=o + 2_000 - utc, end=o + 3_000 - utc, eventType=PUSH_POP,
                  textId=db.string("forward"), globalTid=gtid)
        db.insert("NVTX_EVENTS", start=o + 2_500 - utc, end=None, eventType=MARK, text="ProfilerStep#99", globalTid=gtid)


def main() -> None:
    for r in sc.RANKS:
        write_nsys(HERE / f"rank{r}.sqlite", (r,))
    write_nsys(HERE / "two_process.sqlite", sc.RANKS, extras=True)
    for p in sorted(HERE.glob("*.sqlite")):
        print(f"{p.name}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
