"""One small two-rank trace, written by every vendor-format fixture builder and expected back
from every importer, so that each format is tested against the same known events.

Per rank r (pid 4000+r, GPU r), times in absolute ns on the rank's own clock:
- a warm-up kernel before any iteration (iteration -1);
- iterations 1 and 2, each a host range ``ProfilerStep#n`` lasting 30 us, holding:
  a GEMM launch and kernel (stream 7), an all-gather launch and NCCL/RCCL kernel (stream 13),
  an async host-to-device copy whose GPU side starts after the host range ended (so only its
  launch places it in the iteration), and a device synchronize (no GPU work).
Correlation ids are 10*n + k, so a row's iteration can be read from its id.
"""
from __future__ import annotations

import pandas as pd

BASE_NS = 1_000_000_000_000
ITERATION_NS = 100_000
RANKS = (0, 1)
ITERATIONS = (1, 2)
PID0 = 4000
GEMM = "gemm_bf16_tn_kernel"
GEMM_GRID, GEMM_BLOCK = (16, 8, 1), (256, 1, 1)
NCCL_NVIDIA = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_AMD = "ncclKernel_AllGather_RING_LL_Sum_bf16(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_GRID, NCCL_BLOCK = (24, 1, 1), (544, 1, 1)
COPY_BYTES = 4096
GEMM_STREAM, NCCL_STREAM = 7, 13

API = {
    "nsys": {"launch": "cudaLaunchKernel_v7000", "memcpy": "cudaMemcpyAsync_v3020", "sync": "cudaDeviceSynchronize_v3020"},
    "cuda": {"launch": "cudaLaunchKernel", "memcpy": "cudaMemcpyAsync", "sync": "cudaDeviceSynchronize"},
    "hip": {"launch": "hipLaunchKernel", "memcpy": "hipMemcpyAsync", "sync": "hipDeviceSynchronize"},
}


def pid(rank: int) -> int:
    return PID0 + rank


def base(rank: int) -> int:
    return BASE_NS + 2_000 * rank  # ranks start 2 us apart


def records(rank: int, *, vendor: str = "nvidia") -> dict[str, list[dict]]:
    """Markers, host calls, kernels and copies of one rank (vendor picks the NCCL kernel name)."""
    nccl = NCCL_NVIDIA if vendor == "nvidia" else NCCL_AMD
    b = base(rank)
    markers, calls, kernels, copies = [], [], [], []
    calls.append(dict(api="launch", start=b - 20_000, end=b - 18_000, corr=5))
    kernels.append(dict(name=GEMM, stream=GEMM_STREAM, start=b - 15_000, end=b - 12_000, corr=5,
                        grid=GEMM_GRID, block=GEMM_BLOCK))
    for k, n in enumerate(ITERATIONS):
        o = b + k * ITERATION_NS
        markers.append(dict(name=f"ProfilerStep#{n}", start=o, end=o + 30_000, iteration=n))
        calls.append(dict(api="launch", start=o + 1_000, end=o + 4_000, corr=10 * n + 1))
        kernels.append(dict(name=GEMM, stream=GEMM_STREAM, start=o + 10_000, end=o + 40_000, corr=10 * n + 1,
                            grid=GEMM_GRID, block=GEMM_BLOCK))
        calls.append(dict(api="launch", start=o + 5_000, end=o + 7_000, corr=10 * n + 2))
        kernels.append(dict(name=nccl, stream=NCCL_STREAM, start=o + 12_000, end=o + 30_000 + 1_000 * rank,
                            corr=10 * n + 2, grid=NCCL_GRID, block=NCCL_BLOCK))
        calls.append(dict(api="memcpy", start=o + 8_000, end=o + 9_000, corr=10 * n + 3))
        copies.append(dict(stream=GEMM_STREAM, start=o + 42_000, end=o + 44_000, corr=10 * n + 3, bytes=COPY_BYTES))
        calls.append(dict(api="sync", start=o + 9_500, end=o + 45_000, corr=10 * n + 4))
    return {"markers": markers, "calls": calls, "kernels": kernels, "copies": copies}


def expected_events() -> pd.DataFrame:
    """The events every importer must produce from the scenario (columns that every format
    records; names and stream ids differ between tools and are checked per format)."""
    rows = []
    for r in RANKS:
        rec = records(r)
        for m in rec["markers"]:
            rows.append(dict(rank=r, device=-1, kind="marker", role="other", start_ns=m["start"], end_ns=m["end"],
                             correlation=-1, iteration=m["iteration"], collective_op="", collective_id="",
                             grid="", block="", bytes=-1))
        for c in rec["calls"]:
            rows.append(dict(rank=r, device=-1, kind="sync" if c["api"] == "sync" else "launch", role="other",
                             start_ns=c["start"], end_ns=c["end"], correlation=c["corr"], iteration=_it(c["corr"]),
                             collective_op="", collective_id="", grid="", block="", bytes=-1))
        for k in rec["kernels"]:
            comm = k["stream"] == NCCL_STREAM
            rows.append(dict(rank=r, device=r, kind="kernel", role="comm" if comm else "compute",
                             start_ns=k["start"], end_ns=k["end"], correlation=k["corr"], iteration=_it(k["corr"]),
                             collective_op="allgather" if comm else "",
                             collective_id=f"allgather:{_it(k['corr']) - 1}" if comm else "",
                             grid=",".join(map(str, k["grid"])), block=",".join(map(str, k["block"])), bytes=-1))
        for c in rec["copies"]:
            rows.append(dict(rank=r, device=r, kind="memcpy", role="copy", start_ns=c["start"], end_ns=c["end"],
                             correlation=c["corr"], iteration=_it(c["corr"]), collective_op="", collective_id="",
                             grid="", block="", bytes=c["bytes"]))
    return pd.DataFrame(rows)


def _it(corr: int) -> int:
    return corr // 10 if corr >= 10 else -1


COMPARED = ("rank", "device", "kind", "role", "start_ns", "end_ns", "correlation", "iteration",
            "collective_op", "collective_id", "grid", "block", "bytes")


def comparable(events: pd.DataFrame) -> pd.DataFrame:
    """The compared columns, in one canonical row order, with schema dtypes."""
    from taxmodel.trace import schema

    out = schema.normalize_events(events)[list(COMPARED)]
    return out.sort_values(list(COMPARED), kind="stable").reset_index(drop=True)
