"""Measure the hardware numbers the ledger and the analytic model need, on the GPUs at hand.

Run on every rank of a GPU machine (``taxmodel calibrate`` starts it through torch.distributed.run;
``torchrun --nproc-per-node N -m taxmodel.runtime.calibrate -o hw.json`` works too). Rank 0
writes a hardware file in the format of ``taxmodel.model.hardware`` (``source: "calibrated"``)
with the raw measurements beside the fitted numbers, so a reader can check every value.

Each number is the median of several timed repetitions after a warm-up (CUDA events around a
loop of launches); the bandwidths use bytes that really move (a copy reads and writes).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

REPS = 7


def _median_ms(fn: Callable[[], None], inner: int = 10, reps: int = REPS, warmup: int = 3) -> float:
    """Median over ``reps`` of the mean time (ms) of ``inner`` back-to-back calls, CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def hbm_bandwidth(device: torch.device, nbytes: int = 2 << 30) -> dict:
    """Device-to-device copy: every byte is read once and written once."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), inner=5)
    return {"bytes": nbytes, "ms": ms, "bytes_per_s": 2 * nbytes / (ms * 1e-3)}


def gemm_rate(device: torch.device, dtype: torch.dtype, n: int = 8192) -> dict:
    """Dense square GEMM on random data (cuBLAS/hipBLASLt through torch)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = _median_ms(lambda: torch.matmul(a, b), inner=5)
    return {"m": n, "n": n, "k": n, "ms": ms, "flops_per_s": 2 * n**3 / (ms * 1e-3)}


def collective_curve(device: torch.device, world: int) -> list[dict]:
    """all_gather / all_reduce / reduce_scatter times over message sizes (bytes per rank)."""
    rows = []
    for per_rank in (1 << 13, 1 << 16, 1 << 19, 1 << 22, 1 << 25, 1 << 27):
        x = torch.empty(per_rank // 2, dtype=torch.bfloat16, device=device)
        out = torch.empty(world * x.numel(), dtype=x.dtype, device=device)
        big = torch.empty(world * x.numel(), dtype=x.dtype, device=device)
        for op, fn in (
            ("allgather", lambda: dist.all_gather_into_tensor(out, x)),
            ("allreduce", lambda: dist.all_reduce(x)),
            ("reduce_scatter", lambda: dist.reduce_scatter_tensor(x, big)),
        ):
            dist.barrier()
            ms = _median_ms(fn, inner=5, reps=5)
            rows.append({"op": op, "bytes_per_rank": per_rank, "ms": ms})
    return rows


def peer_copy_bandwidth(device: torch.device, world: int, nbytes: int = 1 << 30) -> list[dict]:
    """Copy-engine bandwidth from this GPU to each peer GPU of the same host (P2P over NVLink/xGMI)."""
    rows = []
    if torch.cuda.device_count() < world:
        return rows
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for peer in range(world):
        if peer == device.index:
            continue
        dst = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", peer))
        ms = _median_ms(lambda: dst.copy_(src, non_blocking=True), inner=3, reps=5)
        rows.append({"src": device.index, "dst": peer, "bytes": nbytes, "ms": ms, "bytes_per_s": nbytes / (ms * 1e-3)})
        del dst
    return rows


def launch_costs(device: torch.device, n: int = 200) -> dict:
    """Host cost per launch, GPU time per launch when the queue is host-bound, and in a CUDA graph.

    An empty kernel isolates launch overhead: ``torch.Tensor.zero_`` on one element is a single
    tiny kernel.
    """
    x = torch.zeros(1, device=device)
    for _ in range(20):
        x.zero_()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x.zero_()
    host_s = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    eager_ms = _median_ms(lambda: [x.zero_() for _ in range(n)], inner=1) / n

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x.zero_()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(n):
                x.zero_()
    graph_ms = _median_ms(graph.replay, inner=1) / n
    return {"host_launch_s": host_s, "eager_per_kernel_s": eager_ms * 1e-3, "graph_per_kernel_s": graph_ms * 1e-3, "kernels": n}


def fit(meas: dict, device_name: str, num_sms: int, world: int) -> dict:
    """Turn raw measurements into the HardwareSpec fields (see taxmodel.model.hardware)."""
    ag = [r for r in meas["collectives"] if r["op"] == "allgather"]
    small = min(ag, key=lambda r: r["bytes_per_rank"])
    large = max(ag, key=lambda r: r["bytes_per_rank"])
    # all-gather receives (world-1) * bytes_per_rank per rank: the large message gives bandwidth,
    # the small one latency.
    link_bw = (world - 1) * large["bytes_per_rank"] / (large["ms"] * 1e-3) if world > 1 else None
    p2p = [r["bytes_per_s"] for r in meas.get("peer_copy", [])]
    return {
        "name": device_name,
        "vendor": "nvidia" if torch.version.cuda else "amd",
        "source": "calibrated",
        "num_sms": num_sms,
        "peak_flops": {k: v["flops_per_s"] for k, v in meas["gemm"].items()},
        "hbm_bytes_per_s": meas["hbm"]["bytes_per_s"],
        "link_bytes_per_s": link_bw if link_bw else (statistics.median(p2p) if p2p else None),
        "p2p_copy_bytes_per_s": statistics.median(p2p) if p2p else None,
        "link_latency_s": small["ms"] * 1e-3 if world > 1 else None,
        "launch_latency_s": meas["launch"]["graph_per_kernel_s"],
        "kernel_gap_s": meas["launch"]["graph_per_kernel_s"],
        "host_launch_s": meas["launch"]["host_launch_s"],
        "flag_roundtrip_s": meas.get("flag_roundtrip_s"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True, help="hardware JSON file to write (rank 0)")
    args = parser.parse_args(argv)
    for var, val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ[var] = val
    if not torch.cuda.is_available():
        raise SystemExit("taxmodel calibrate: no GPU here; calibration measures a GPU machine (datasheet presets serve elsewhere)")
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("nccl", device_id=device)
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    props = torch.cuda.get_device_properties(device)
    meas: dict = {}
    meas["hbm"] = hbm_bandwidth(device)
    meas["gemm"] = {name: gemm_rate(device, dt) for name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16))}
    meas["gemm"]["fp32"] = gemm_rate(device, torch.float32, n=4096)
    meas["launch"] = launch_costs(device)
    meas["collectives"] = collective_curve(device, world) if distributed else []
    if distributed:
        dist.barrier()
    meas["peer_copy"] = peer_copy_bandwidth(device, world) if rank == 0 else []
    if distributed:
        dist.barrier()
    if rank == 0:
        spec = fit(meas, props.name, props.multi_processor_count, world)
        spec["measured"] = {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "world_size": world,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "hip": torch.version.hip,
            "repetitions": REPS,
            "raw": meas,
        }
        out = Path(args.output)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(spec, indent=2) + "\n")
        os.replace(tmp, out)
        print(json.dumps({k: v for k, v in spec.items() if k != "measured"}, indent=2))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
