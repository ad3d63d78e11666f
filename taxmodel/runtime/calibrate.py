"""Measure the hardware numbers the ledger and the analytic model need, on the GPUs at hand.

Run on every rank of a GPU machine (``taxmodel calibrate`` starts it through torch.distributed.run;
``torchrun --nproc-per-node N -m taxmodel.runtime.calibrate -o hw.json`` works too). Rank 0
writes a hardware file in the format of ``taxmodel.model.hardware`` (``source: "calibrated"``)
with the raw measurements beside the fitted numbers, so a reader can check every value.

Each number is the median of several timed repetitions after a warm-up (CUDA events around a
loop of launches); the bandwidths use bytes that really move (a copy reads and writes).

Besides vendor GEMMs, HBM and NCCL, it measures what the analytic model of the fine-grained
variants needs (docs/model.md): a Triton kernel's peer-load and peer-store bandwidth and the
latency of one peer load through the symmetric heap (``TorchSymmetricHeap``), the cross-GPU flag
round trip (a ping-pong kernel on ranks 0 and 1 with ``kernels/_sync.py``'s release-set and
acquire-wait), launch costs as the profiler sees them (GPU gap between queued kernels, idle
launch latency, host time per Triton and per torch launch) and the spread of the ranks' release
from a host barrier. ``fit`` turns the raw numbers into ``HardwareSpec`` fields; the extra ones
(``ModelParams`` names) land in the spec's ``extra`` and the model picks them up.

Budget: about a minute on 4 H200s (must stay under 3 minutes).
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
import triton
import triton.language as tl

import iris
from taxmodel.kernels import _sync

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
        ms = _median_ms(lambda d=dst: d.copy_(src, non_blocking=True), inner=3, reps=5)
        rows.append({"src": device.index, "dst": peer, "bytes": nbytes, "ms": ms, "bytes_per_s": nbytes / (ms * 1e-3)})
        del dst
    return rows


# --- Triton kernels of the fine-grained measurements ----------------------------------------------


@triton.jit
def _peer_read_kernel(src_ptr, out_ptr, heap_bases, n_elems, rank, world, BLOCK: tl.constexpr, NUM_PROGS: tl.constexpr):
    """Every program streams blocks of ``src`` from the peers' heaps (peer = block mod (W-1)),
    as the pull GEMM does; the sum goes to ``out`` so the loads are not optimized away."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    n_blocks = tl.cdiv(n_elems, BLOCK)
    for i in range(pid, n_blocks, NUM_PROGS):
        peer = (rank + 1 + i % (world - 1)) % world
        idx = i * BLOCK + offs
        acc += iris.load(src_ptr + idx, rank, peer, heap_bases, mask=idx < n_elems, other=0.0)
    tl.store(out_ptr + pid * BLOCK + offs, acc)


@triton.jit
def _peer_write_kernel(dst_ptr, heap_bases, n_elems, rank, world, BLOCK: tl.constexpr, NUM_PROGS: tl.constexpr):
    """Every program stores blocks into the peers' heaps, as the push kernel does."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    val = tl.full([BLOCK], 1.0, tl.float32)
    n_blocks = tl.cdiv(n_elems, BLOCK)
    for i in range(pid, n_blocks, NUM_PROGS):
        peer = (rank + 1 + i % (world - 1)) % world
        idx = i * BLOCK + offs
        iris.store(dst_ptr + idx, val, rank, peer, heap_bases, mask=idx < n_elems)


@triton.jit
def _peer_chase_kernel(chain_ptr, out_ptr, heap_bases, steps, rank, peer):
    """One program follows a chain of indices stored in the peer's heap: every load depends on
    the previous one, so the time per step is the latency of one peer load."""
    idx = tl.full((), 0, tl.int32)
    for _ in range(steps):
        idx = iris.load(chain_ptr + idx, rank, peer, heap_bases, volatile=True)
    tl.store(out_ptr, idx)


@triton.jit
def _pingpong_kernel(flags_ptr, err_ptr, heap_bases, base, rounds, budget, rank, MODE: tl.constexpr):
    """Ranks 0 and 1 bounce a flag: 0 sets flag 0 on rank 1 and waits for flag 1 on itself; 1 waits
    for flag 0 and answers with flag 1 on rank 0. Time per round = one flag round trip."""
    for i in range(1, rounds + 1):
        target = base + i
        if rank == 0:
            _sync.signal(flags_ptr, target, 0, 1, heap_bases)
            _sync.wait_geq(flags_ptr + 1, target, budget, err_ptr, 0, 1, 1, 9, MODE)
        else:
            _sync.wait_geq(flags_ptr, target, budget, err_ptr, 1, 0, 0, 9, MODE)
            _sync.signal(flags_ptr + 1, target, 1, 0, heap_bases)


@triton.jit
def _empty_kernel(x_ptr):
    pass


def _heap(device: torch.device, nbytes: int):
    from taxmodel.runtime.heap import TorchSymmetricHeap

    return TorchSymmetricHeap(dist.get_rank(), dist.get_world_size(), nbytes, device)


def peer_access(device: torch.device, world: int, num_sms: int, nbytes: int = 256 << 20) -> dict:
    """Peer-load and peer-store bandwidth of a Triton kernel through the symmetric heap (every rank
    at once, reading/writing all peers), store bandwidth with 16 programs (the push kernel's), and
    the latency of one dependent peer load."""
    heap = _heap(device, 2 * nbytes + (1 << 20))
    rank = dist.get_rank()
    n = nbytes // 4
    src = heap.zeros(n, torch.float32)
    src.fill_(1.0)
    chain = heap.empty(1 << 16, torch.int32)
    stride = 4099  # a large odd stride: the chain never hits the same cache line twice in a row
    chain.copy_(((torch.arange(1 << 16, device=device) + stride) % (1 << 16)).to(torch.int32))
    out = torch.zeros(num_sms * 1024, dtype=torch.float32, device=device)
    heap.barrier()
    res: dict = {"bytes": nbytes}

    def read(progs: int) -> float:
        return _median_ms(lambda: _peer_read_kernel[(progs,)](src, out, heap.heap_bases, n, rank, world, BLOCK=1024,
                                                              NUM_PROGS=progs, num_warps=4), inner=3, reps=5)

    def write(progs: int) -> float:
        return _median_ms(lambda: _peer_write_kernel[(progs,)](src, heap.heap_bases, n, rank, world, BLOCK=1024,
                                                               NUM_PROGS=progs, num_warps=4), inner=3, reps=5)

    heap.barrier()
    ms = read(num_sms)
    res["load_ms"], res["load_bytes_per_s"] = ms, nbytes / (ms * 1e-3)
    heap.barrier()
    ms = write(num_sms)
    res["store_ms"], res["store_bytes_per_s"] = ms, nbytes / (ms * 1e-3)
    heap.barrier()
    ms = write(16)
    res["store16_ms"], res["store_bytes_per_s_per_sm"] = ms, nbytes / (ms * 1e-3) / 16
    heap.barrier()
    steps = 2000
    peer = (rank + 1) % world
    ms = _median_ms(lambda: _peer_chase_kernel[(1,)](chain, out, heap.heap_bases, steps, rank, peer), inner=1, reps=5)
    res["chase_steps"], res["load_latency_s"] = steps, ms * 1e-3 / steps
    heap.barrier()
    heap.close()
    return res


def flag_roundtrip(device: torch.device, timeout_s: float = 30.0) -> dict:
    """Round trip of a release-set flag and its acquire-wait between ranks 0 and 1 (the others idle).
    Two run lengths; the difference cancels the launch offset between the two ranks."""
    heap = _heap(device, 1 << 20)
    rank = dist.get_rank()
    flags = heap.zeros(64, torch.int32)
    err = _sync.new_error_buffer(device)
    mode = _sync.sync_mode(device)
    budget = _sync.spin_budget(timeout_s, mode)
    base = 0
    times = {}
    heap.barrier()
    for rounds in (10, 100, 2100):
        samples = []
        for _ in range(5 if rounds > 10 else 1):
            heap.barrier()
            if rank in (0, 1):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                _pingpong_kernel[(1,)](flags, err, heap.heap_bases, base, rounds, budget, rank, MODE=mode)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            base += rounds
        times[rounds] = statistics.median(samples) if samples else None
    _sync.check_errors(err, "calibration ping-pong", None, mode)
    heap.barrier()
    heap.close()
    rt = (times[2100] - times[100]) * 1e-3 / 2000 if rank == 0 else None
    return {"rounds_ms": {str(k): v for k, v in times.items()}, "roundtrip_s": rt}


def launch_costs(device: torch.device, n: int = 200) -> dict:
    """Host time per launch (torch op and Triton kernel) while the GPU is busy, GPU time per kernel
    in a CUDA graph, and, from a torch.profiler trace read by taxmodel's own Kineto importer, the GPU
    gap between queued kernels and the idle launch latency as the ledger measures them."""
    x = torch.zeros(1, device=device)
    big = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    for _ in range(20):
        x.zero_()
        _empty_kernel[(1,)](x)
    torch.cuda.synchronize()

    def host_per_launch(fn) -> float:
        for _ in range(3):
            big @ big  # keep the GPU busy so that launches never wait for it
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = (time.perf_counter() - t0) / n
        torch.cuda.synchronize()
        return dt

    host_torch = statistics.median(host_per_launch(x.zero_) for _ in range(3))
    host_triton = statistics.median(host_per_launch(lambda: _empty_kernel[(1,)](x)) for _ in range(3))

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x.zero_()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(n):
                x.zero_()
    graph_ms = _median_ms(graph.replay, inner=1) / n
    out = {"host_launch_torch_s": host_torch, "host_launch_triton_s": host_triton, "graph_per_kernel_s": graph_ms * 1e-3,
           "kernels": n}
    try:
        out.update(_profiled_gaps(device, x, big))
    except Exception as exc:  # the profiler is optional: keep the other numbers
        out["profiler_error"] = f"{type(exc).__name__}: {exc}"
    return out


def _profiled_gaps(device: torch.device, x: torch.Tensor, big: torch.Tensor, n: int = 50) -> dict:
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    from taxmodel.trace import kineto

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        # Enough GEMM work (about 2 ms on an H200) that the host enqueues all n empty kernels
        # before the GPU reaches them, even at the profiler's ~10-20 us per launch: their gaps are
        # then GPU-side only. (Two GEMMs were too few: the GPU caught up with the host and the
        # "queued" gaps measured the host's launch rate instead, 18 us instead of about 1 us.)
        for _ in range(12):
            big @ big
        for _ in range(n):  # queued behind the GEMMs: GPU-side gaps only
            _empty_kernel[(1,)](x)
        torch.cuda.synchronize()
        for _ in range(20):  # one at a time on an idle GPU: launch latency
            _empty_kernel[(1,)](x)
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "calibrate_trace.json")
        prof.export_chrome_trace(path)
        events, _ = kineto.read([Path(path)])
    k = events[(events["kind"] == "kernel") & events["name"].astype(str).str.contains("_empty_kernel")].sort_values("start_ns")
    launches = events[events["kind"] == "launch"].set_index("correlation")["end_ns"]
    starts, ends = k["start_ns"].to_numpy(), k["end_ns"].to_numpy()
    launch_end = k["correlation"].map(launches).to_numpy(dtype=float)
    # Only pairs the ledger would call kernel_gap: the second kernel's launch call had returned
    # before the first one ended (it was queued), so the gap is the GPU's own.
    queued = launch_end[1:n] <= ends[:n - 1]
    queued_gaps = ((starts[1:n] - ends[:n - 1]) * 1e-9)[queued]
    idle = k.iloc[n:]
    lat = (idle["start_ns"] - idle["correlation"].map(launches)).dropna() * 1e-9
    return {"kernel_gap_s": float(statistics.median(queued_gaps)) if len(queued_gaps) else None,
            "launch_latency_s": float(statistics.median(lat)) if len(lat) else None,
            "profiled_empty_kernel_s": float(statistics.median((ends - starts) * 1e-9)) if len(k) else None,
            "queued_pairs": int(queued.sum()), "pairs": int(len(queued))}


def barrier_skew(device: torch.device, rounds: int = 30) -> dict:
    """How far apart the ranks leave a host barrier (the one every profiled iteration starts with):
    release times on the host's monotonic clock (one host), gathered; per round the mean distance
    from the earliest rank. With exponential delays of mean s that is s * (1 - 1/W)."""
    world = dist.get_world_size()
    vals = []
    t = torch.zeros(1, dtype=torch.int64, device=device)
    allt = torch.zeros(world, dtype=torch.int64, device=device)
    for _ in range(rounds):
        torch.cuda.synchronize()
        dist.barrier(device_ids=[device.index])
        t[0] = time.monotonic_ns()
        dist.all_gather_into_tensor(allt, t)
        v = allt.cpu().numpy().astype(float)
        vals.append(float((v - v.min()).mean()))
    mean_gap = statistics.median(vals) * 1e-9
    return {"rounds": rounds, "mean_from_first_s": mean_gap, "barrier_skew_s": mean_gap / (1 - 1 / world) if world > 1 else 0.0}


# --- fit ---------------------------------------------------------------------------------------


def _first(*values):
    for v in values:
        if v is not None:
            return v
    return None


def fit(meas: dict, device_name: str, num_sms: int, world: int, vendor: str | None = None) -> dict:
    """Turn raw measurements into a hardware file (the fields of ``HardwareSpec``; model parameters
    in extra fields named as in ``ModelParams``). Pure: tests call it with made-up measurements."""
    from taxmodel.model.hardware import find_preset

    ag = [r for r in meas.get("collectives", []) if r["op"] == "allgather"]
    link_bw = link_lat = None
    if world > 1 and ag:
        small = min(ag, key=lambda r: r["bytes_per_rank"])
        large = max(ag, key=lambda r: r["bytes_per_rank"])
        # all-gather receives (world-1) * bytes_per_rank per rank: the large message gives
        # bandwidth, the small one latency (per ring step).
        link_bw = (world - 1) * large["bytes_per_rank"] / (large["ms"] * 1e-3)
        link_lat = small["ms"] * 1e-3 / (world - 1)
    p2p = [r["bytes_per_s"] for r in meas.get("peer_copy", [])]
    peer = meas.get("peer") or {}
    launch = meas.get("launch") or {}
    preset = find_preset(device_name)
    if preset is not None and preset.source != "datasheet":  # name after the datasheet part, not an older calibration
        preset = find_preset(preset.name.replace(" (calibrated)", ""))
    name = f"{preset.name} (calibrated)" if preset is not None else device_name
    # The datasheet preset keeps its own name, so `--hardware "H200 SXM"` still selects the datasheet.
    aliases = sorted({*(preset.aliases if preset is not None else ()), device_name})
    link = _first(link_bw, statistics.median(p2p) if p2p else None, peer.get("load_bytes_per_s"))
    if link is None:
        raise ValueError("no link measurement (collectives, peer copies or peer loads): calibrate with --world-size 2 or more")
    curves: dict = {"world_size": world}
    for r in meas.get("collectives", []):
        curves.setdefault(r["op"], []).append([r["bytes_per_rank"], r["ms"] * 1e-3])
    spec = {
        "name": name,
        "vendor": vendor or (preset.vendor if preset is not None else "nvidia"),
        "source": "calibrated",
        "aliases": aliases,
        "num_sms": int(num_sms),
        "peak_flops": {k: v["flops_per_s"] for k, v in meas["gemm"].items()},
        "hbm_bytes_per_s": meas["hbm"]["bytes_per_s"],
        "link_bytes_per_s": link,
        "link_latency_s": link_lat or 0.0,
        "launch_latency_s": _first(launch.get("launch_latency_s"), launch.get("graph_per_kernel_s"), 0.0),
        "kernel_gap_s": _first(launch.get("kernel_gap_s"), launch.get("graph_per_kernel_s"), 0.0),
        "host_launch_s": _first(launch.get("host_launch_triton_s"), launch.get("host_launch_s"), 0.0),
        "flag_roundtrip_s": _first((meas.get("flag") or {}).get("roundtrip_s"), 0.0),
        "notes": (f"measured by `taxmodel calibrate` on {world} x {device_name}: GEMM peaks are cuBLAS rates on 8192^3 "
                  "(4096^3 for fp32), HBM a device copy, link the all-gather bandwidth at the largest size."),
        # model parameters (taxmodel.model.analytic.common.ModelParams names)
        "host_launch_torch_s": _first(launch.get("host_launch_torch_s"), launch.get("host_launch_s")),
        "p2p_copy_bytes_per_s": statistics.median(p2p) if p2p else None,
        "peer_load_bytes_per_s": peer.get("load_bytes_per_s"),
        "peer_load_latency_s": peer.get("load_latency_s"),
        "peer_store_bytes_per_s": peer.get("store_bytes_per_s"),
        "peer_store_bytes_per_s_per_sm": peer.get("store_bytes_per_s_per_sm"),
        "barrier_skew_s": (meas.get("barrier") or {}).get("barrier_skew_s"),
        "collectives": curves if len(curves) > 1 else None,
    }
    return {k: v for k, v in spec.items() if v is not None}


# --- entry points --------------------------------------------------------------------------------


def _step(name: str, fn: Callable[[], object], meas: dict, key: str, rank: int) -> None:
    """Run one measurement; a failure is recorded (and printed) instead of ending the calibration."""
    t0 = time.perf_counter()
    try:
        meas[key] = fn()
    except Exception as exc:  # noqa: BLE001 - each number is optional except the basics
        meas.setdefault("errors", {})[key] = f"{type(exc).__name__}: {exc}"
        if rank == 0:
            print(f"calibrate: {name} failed: {exc}", flush=True)
    if rank == 0:
        print(f"calibrate: {name} {time.perf_counter() - t0:.1f} s", flush=True)


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
    t_start = time.perf_counter()
    meas: dict = {}
    _step("HBM copy", lambda: hbm_bandwidth(device), meas, "hbm", rank)
    _step("GEMM rates", lambda: {**{name: gemm_rate(device, dt) for name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16))},
                                 "fp32": gemm_rate(device, torch.float32, n=4096)}, meas, "gemm", rank)
    _step("launch costs", lambda: launch_costs(device), meas, "launch", rank)
    meas["collectives"] = []
    if distributed and world > 1:
        _step("collectives", lambda: collective_curve(device, world), meas, "collectives", rank)
        dist.barrier()
        _step("barrier skew", lambda: barrier_skew(device), meas, "barrier", rank)
        _step("peer loads/stores", lambda: peer_access(device, world, props.multi_processor_count), meas, "peer", rank)
        _step("flag round trip", lambda: flag_roundtrip(device), meas, "flag", rank)
        dist.barrier()
    meas["peer_copy"] = []
    if rank == 0:
        _step("P2P copies", lambda: peer_copy_bandwidth(device, world), meas, "peer_copy", rank)
    if distributed:
        dist.barrier()
    if rank == 0:
        for key in ("hbm", "gemm"):
            if key not in meas:
                raise SystemExit(f"taxmodel calibrate: the {key} measurement failed ({meas.get('errors', {}).get(key)}); nothing written")
        spec = fit(meas, props.name, props.multi_processor_count, world,
                   vendor="amd" if getattr(torch.version, "hip", None) else "nvidia")
        spec["measured"] = {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "world_size": world,
            "seconds": round(time.perf_counter() - t_start, 1),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "hip": torch.version.hip,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else None,
            "repetitions": REPS,
            "raw": meas,
        }
        out = Path(args.output)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(spec, indent=2, default=float) + "\n")
        os.replace(tmp, out)
        from taxmodel.model.hardware import load_hardware

        load_hardware(out)  # the file must load as a HardwareSpec
        print(json.dumps({k: v for k, v in spec.items() if k not in ("measured", "collectives")}, indent=2, default=float))
    if distributed:
        dist.destroy_process_group()


def run_calibration(output: str | os.PathLike, *, world_size: int | None = None, timeout_s: float = 600.0):
    """`taxmodel calibrate`: start ``main`` on ``world_size`` local GPUs through torch.distributed.run
    and return the HardwareSpec it wrote. On a machine without a GPU raise UnavailableError."""
    import subprocess
    import sys

    from taxmodel.errors import RunError, UnavailableError
    from taxmodel.model.hardware import load_hardware

    if not torch.cuda.is_available():
        raise UnavailableError(
            "no GPU here: calibration measures the GPUs it runs on. Predictions and ledgers use the datasheet presets "
            "(h100, h200, mi300x, b200) meanwhile; on a GPU machine run `taxmodel calibrate -o hw.json` (or "
            "`torchrun --nproc-per-node N -m taxmodel.runtime.calibrate -o hw.json`) and pass --hardware hw.json")
    n = world_size or torch.cuda.device_count()
    if n < 1 or n > torch.cuda.device_count():
        raise UnavailableError(f"--world-size {n}: this machine has {torch.cuda.device_count()} GPU(s)")
    out = Path(output).resolve()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           "-m", "taxmodel.runtime.calibrate", "-o", str(out)]
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise RunError(f"calibration did not finish in {timeout_s:.0f} s; re-run with a longer --timeout") from exc
    if proc.returncode != 0 or not out.exists():
        raise RunError(f"calibration failed (exit {proc.returncode}); its output above says where")
    return load_hardware(out)


if __name__ == "__main__":
    main()
