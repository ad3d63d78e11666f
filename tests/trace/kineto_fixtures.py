"""Small Kineto (torch.profiler Chrome-trace) documents with known contents, for importer tests.

Times are built as integer nanoseconds and written the way Kineto writes them (microseconds
with three decimals), so a test knows the exact values the importer must produce.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
REAL_RANKS = [DATA / f"h200x4_ag_gemm_bsp_clean_rank{r}.json.gz" for r in range(4)]
REAL_PEER_READ = DATA / "h200x4_ag_gemm_peer_read_rank0.json.gz"


def us(ns: int) -> float:
    """ns -> the float Kineto writes (three decimals); its repr is exactly that decimal text."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return float(f"{sign}{ns // 1000}.{ns % 1000:03d}")


@dataclass
class Expected:
    """What the importer must find in a built trace (per rank)."""

    kernels: list[dict] = field(default_factory=list)  # name, start_ns, end_ns, iteration, role, correlation
    launches: int = 0
    syncs: int = 0


def build_trace(rank: int = 0, world_size: int = 2, steps: int = 3, *, first_step: int = 1,
                base_ns: int = 1_700_000_000_123_457, distributed: bool = True, seq: bool = False,
                graph: bool = False, pg: str = "0") -> tuple[dict, Expected]:
    """A Kineto trace of ``steps`` ProfilerSteps, each: a GEMM (cudaLaunchKernel), an NCCL
    all-gather (cuLaunchKernelEx, collective metadata), a memcpy (cudaMemcpyAsync); then a
    cudaStreamSynchronize. Plus the noise real traces carry: cpu_op rows, ac2g flows, metadata
    events, an overhead row, a warm-up kernel without a recorded launch (before step 1 on the GPU)."""
    pid, tid = 1000 + rank, 1000 + rank
    ev: list[dict] = []
    exp = Expected()
    host = base_ns + 17 * rank  # ranks' clocks differ a little
    gpu = host + 500_000
    corr = 10

    def x(cat, name, start, dur, p, t, args=None):
        e = {"ph": "X", "cat": cat, "name": name, "pid": p, "tid": t, "ts": us(start), "dur": us(dur)}
        if args is not None:
            e["args"] = args
        ev.append(e)
        return e

    # A kernel enqueued before profiling started: on the GPU before the first step, no launch.
    x("kernel", "warmup_kernel", gpu - 50_000, 1_234, 0, 7, {"device": 0, "stream": 7, "correlation": 3,
                                                              "grid": [1, 1, 1], "block": [32, 1, 1]})
    exp.kernels.append({"name": "warmup_kernel", "start_ns": gpu - 50_000, "end_ns": gpu - 50_000 + 1_234,
                        "iteration": -1, "role": "compute", "correlation": 3})
    for s in range(steps):
        step = first_step + s
        step_start, gpu_step_start = host, gpu
        x("cpu_op", "aten::mm", host + 100, 3_001, pid, tid, {"External id": 1})
        # GEMM
        x("cuda_runtime", "cudaLaunchKernel", host + 1_000, 4_567, pid, tid, {"correlation": corr, "cbid": 211})
        ev.append({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": us(host + 1_000), "cat": "ac2g", "name": "ac2g"})
        kargs = {"device": 0, "stream": 7, "correlation": corr, "grid": [2, 66, 1], "block": [384, 1, 1], "blocks per SM": 0.5}
        if graph:
            kargs["graph id"] = 42
        x("kernel", "gemm_kernel", gpu, 100_001 + s, 0, 7, kargs)
        exp.kernels.append({"name": "gemm_kernel", "start_ns": gpu, "end_ns": gpu + 100_001 + s, "iteration": step,
                            "role": "compute", "correlation": corr})
        corr += 1
        gpu += 100_001 + s + 2_000
        # NCCL all-gather
        x("cuda_driver", "cuLaunchKernelEx", host + 10_000, 9_999, pid, tid, {"correlation": corr})
        nargs = {"device": 0, "stream": 9, "correlation": corr, "Collective name": "_allgather_base",
                 "In msg nelems": 1024, "Out msg nelems": 1024 * world_size, "Group size": world_size,
                 "dtype": "BFloat16", "Process Group Name": pg, "Process Group Description": "default_pg"}
        if seq:
            nargs["Seq"] = 100 + s
        x("kernel", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", gpu, 50_000 + 7 * rank, 0, 9, nargs)
        exp.kernels.append({"name": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "start_ns": gpu,
                            "end_ns": gpu + 50_000 + 7 * rank, "iteration": step, "role": "comm", "correlation": corr,
                            "collective_id": f"{pg}:{100 + s if seq else s}", "bytes": 1024 * world_size * 2})
        corr += 1
        gpu += 52_000
        # memcpy
        x("cuda_runtime", "cudaMemcpyAsync", host + 30_000, 2_500, pid, tid, {"correlation": corr})
        x("gpu_memcpy", "Memcpy DtoD (Device -> Device)", gpu, 3_003, 0, 7,
          {"device": 0, "stream": 7, "correlation": corr, "bytes": 4096})
        corr += 1
        gpu += 4_000
        # cudaEventRecord: a runtime call that is neither a launch nor a sync: dropped
        x("cuda_runtime", "cudaEventRecord", host + 35_000, 1_000, pid, tid, {"correlation": corr})
        corr += 1
        step_end = host + 40_000
        x("user_annotation", f"ProfilerStep#{step}", step_start, step_end - step_start, pid, tid, {"External id": 7})
        x("gpu_user_annotation", f"ProfilerStep#{step}", gpu_step_start, gpu - gpu_step_start, 0, 7, {"External id": 7})
        exp.launches += 3
        host = step_end + 1_000
    x("cuda_runtime", "cudaStreamSynchronize", host, gpu - host + 10, pid, tid, {"correlation": corr})
    exp.syncs += 1
    x("overhead", "Activity Buffer Request", host, 100, -1, 0)
    ev.append({"name": "process_name", "ph": "M", "ts": us(base_ns), "pid": pid, "tid": 0, "args": {"name": "python"}})
    ev.append({"name": "thread_name", "ph": "M", "ts": us(base_ns), "pid": 0, "tid": 7, "args": {"name": "stream 7 "}})
    ev.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": us(gpu + 10)})
    ev.append({"ph": "X", "cat": "Trace", "ts": us(base_ns), "dur": 1.0, "pid": "Spans", "tid": "PyTorch Profiler",
               "name": "PyTorch Profiler (0)", "args": {"Op count": 0}})
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "computeMajor": 9,
                              "computeMinor": 0, "numSms": 132, "warpSize": 32}],
        "cuda_runtime_version": 12080, "cuda_driver_version": 13000, "cupti_version": 130001,
        "displayTimeUnit": "ms", "baseTimeNanoseconds": 1790857026000000000,
        "traceEvents": ev,
    }
    if distributed:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size, "nccl_version": "2.21.5"}
    return doc, exp


def write_trace(path: Path, doc: dict, *, gz: bool = False) -> Path:
    text = json.dumps(doc)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def write_ranks(directory: Path, world_size: int = 2, *, gz: bool = False, **kwargs) -> tuple[list[Path], list[Expected]]:
    """One trace file per rank under ``directory``; returns the paths and what each should hold."""
    paths, expected = [], []
    for r in range(world_size):
        doc, exp = build_trace(r, world_size, **kwargs)
        paths.append(write_trace(directory / f"rank{r}.json{'.gz' if gz else ''}", doc, gz=gz))
        expected.append(exp)
    return paths, expected
