"""Measure the hardware numbers the ledger and the analytic model need, on the GPUs at hand.

Run on every rank of a GPU machine (``taxmodel calibrate`` starts the ranks through the launcher
of ``taxmodel profile``, ``runtime/launcher.py``; ``torchrun --nproc-per-node N -m
taxmodel.runtime.calibrate -o hw.json`` works too). Rank 0
writes a hardware file in the format of ``taxmodel.hardware.specs`` (``source: "calibrated"``)
with the raw measurements beside the fitted numbers, so a reader can check every value.

Each number is the median of several timed repetitions after a warm-up (CUDA events around a
loop of launches); the bandwidths use bytes that really move (a copy reads and writes). The
collective curve is timed twice: eagerly (host calls back to back: host launch cost and rank skew
included, kept as ``collectives_eager``) and as each collective's own device time from calls
replayed in one CUDA graph (``collectives``, what the model uses: it adds launch costs and skew
itself). ``--only STEP,... --update FILE`` re-measures some steps and refits an earlier file;
``--only collectives --update FILE`` on another number of ranks than the file's adds a curve for
that world size (``collectives_by_world``) and leaves the file's own curve alone.

Besides vendor GEMMs, HBM and NCCL, it measures what the analytic model of the fine-grained
variants needs (docs/model.md): a Triton kernel's peer-load and peer-store bandwidth and the
latency of one peer load through the symmetric heap (``TorchSymmetricHeap``), the cross-GPU flag
round trip (a ping-pong kernel on ranks 0 and 1 with ``kernels/device/sync.py``'s release-set and
acquire-wait), launch costs as the profiler sees them (GPU gap between queued kernels and between
the kernels of a replayed CUDA graph, idle launch latency, host time per Triton and per torch
launch), the spread of the ranks' release
from a host barrier, the serial step of the flash decode combine (``calibrate_combine``) and
what one wait on an already-set flag costs a program (``calibrate_sync``); and, with microbenchmarks
of the workloads' own kernels (issue 33), what the model took from fits on other GPUs before: the
tile GEMM against the vendor GEMM by M and the All-Gather copy kernel beside it (``calibrate_gemm``),
the fused flash decode's LL pushes and merges (``calibrate_decode``) and its in-kernel local combine
(the fused kernel at one rank less the split-KV kernel alone, ``calibrate_fused``), GEMM+RS's
reduction program (``calibrate_reduce``); the split-KV kernel's streaming rate and fixed cost come
from the combine step's rows.
``fit`` turns the raw numbers into ``HardwareSpec`` fields; the extra ones (``ModelParams``
names) land in the spec's ``extra`` and the model picks them up.

Budget: about a minute on 4 H200s before the kernel microbenchmarks (which add their Triton compiles,
~10 s each, and about as long again; the whole must stay under 3 minutes).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris
from taxmodel.fsutil import atomic_write, check_not_input
from taxmodel.kernels.device import sync
from taxmodel.model.calibration import ONE_GPU_PEERS, STEP_KEYS, check_update, curve_table, fit, parse_steps, update_spec
from taxmodel.errors import Interrupted, RunError
from taxmodel.runtime.bootstrap import join_process_group, rank_device
from taxmodel.runtime.heap import disable_multicast
from taxmodel.runtime.rank import RankState, rank_failure
from taxmodel.runtime.status import STATUS_DIR_ENV, write_status
from taxmodel.runtime.timing import (CallTimer, SampleTimer, Stopwatch, capture_graph, interleave, median_ms, repeat,
                                     side_stream_warm_up, time_ms, traced_events, traced_kernel_ms)

#: Samples per measurement, and untimed calls before them.
REPS = 7
WARMUP = 3


def _median_ms(fn: Callable[[], None], device: torch.device | str | None, inner: int, reps: int = REPS,
               watch: CallTimer | None = None) -> float:
    """Median over ``reps`` of the mean time (ms) of ``inner`` back-to-back calls after ``WARMUP``
    untimed ones (``timing.median_ms``; ``watch`` the clock, default CUDA events on ``device``)."""
    return median_ms(fn, device=device, reps=reps, calls=inner, warmup=WARMUP, watch=watch)


def hbm_bandwidth(device: torch.device, nbytes: int = 2 << 30) -> dict:
    """Device-to-device copy: every byte is read once and written once."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), device, inner=5)
    return {"bytes": nbytes, "ms": ms, "bytes_per_s": 2 * nbytes / (ms * 1e-3)}


def gemm_rate(device: torch.device, dtype: torch.dtype, n: int = 8192) -> dict:
    """Dense square GEMM on random data (cuBLAS/hipBLASLt through torch)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = _median_ms(lambda: torch.matmul(a, b), device, inner=5)
    return {"m": n, "n": n, "k": n, "ms": ms, "flops_per_s": 2 * n**3 / (ms * 1e-3)}


#: Message sizes of the collective curve, bytes per rank (8 KB .. 128 MB).
COLLECTIVE_SIZES = (1 << 13, 1 << 16, 1 << 19, 1 << 22, 1 << 25, 1 << 27)
#: Back-to-back calls in the short and the long captured graph of one collective: the per-call time
#: is the difference of their replay times over the difference of their lengths.
GRAPH_CALLS = (2, 34)


def collective_ops(device: torch.device | str, world: int, per_rank: int) -> dict[str, Callable[[], object]]:
    """One call of each collective of the curve at ``per_rank`` bytes per rank (bf16 buffers)."""
    x = torch.empty(per_rank // 2, dtype=torch.bfloat16, device=device)
    out = torch.empty(world * x.numel(), dtype=x.dtype, device=device)
    big = torch.empty(world * x.numel(), dtype=x.dtype, device=device)
    # torch >= 2.12 names them *_single (the *_into_tensor/_tensor names warn); older ones lack those
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return {"allgather": lambda: gather(out, x), "allreduce": lambda: dist.all_reduce(x),
            "reduce_scatter": lambda: scatter(x, big)}


def graph_per_call_ms(fn: Callable[[], object], *, backend, watch: CallTimer, barrier: Callable[[], None],
                      agree: Callable[[str | None], str | None] = lambda error: error,
                      calls: tuple[int, int] = GRAPH_CALLS, reps: int = 5,
                      kernel_time: Callable[[Callable[[], object]], list[float]] | None = None) -> dict:
    """Device time of one call of ``fn`` without host launch cost and without the ranks' skew.

    ``fn`` is captured ``calls[0]`` and ``calls[1]`` times back to back into two graphs
    (``backend``: ``taxmodel.runtime.graph.GraphBackend``); each replay is timed after a barrier.
    Inside a replay no host is involved, and every call after the first starts when the previous
    one ended on all ranks, so it has no rank skew. What every replay pays once -- the graph launch,
    the first call's wait for the last rank to enter (the barrier's release skew) -- cancels in
    ``(T(long) - T(short)) / (long - short)``. Still included: the in-graph gap between two calls
    (an empty kernel costs 0.7 us per kernel in a graph on the H200s, ``launch.graph_per_kernel_s``),
    which the model's ``kernel_gap_s`` adds once more: about a microsecond. When noise makes the
    difference non-positive the mean over the long replay (entry skew amortized over its calls) is
    used instead (``method``: "difference" or "mean").

    ``kernel_time`` (``traced_kernel_ms`` on GPUs): the durations of the device kernels of one more
    replay of the long graph, as a trace sees them. ``kernel_ms`` = their median x kernels per call:
    the collective's own kernel time without the gap to the next call (on 2 H200s that gap is
    2-2.6 us between NCCL calls, and the per-call time 3.6 us more than the kernel at 8 KiB:
    benchmarks/results/collective_trace_h200x2.md). The median, because the replay's first call
    waits for the last rank to enter (a profiler starting on one rank delays it by up to ms); every
    later call starts when the previous one ended on all ranks. The model prefers ``kernel_ms``.

    ``agree`` turns this rank's capture error (or None) into every rank's (``_agreed_error``) before
    anything is replayed: when a capture failed on any rank, all raise ``GraphCaptureError`` here
    and none waits in a barrier for the others."""
    from taxmodel.runtime.graph import GraphCaptureError

    short, long_ = calls
    if not 0 < short < long_:
        raise ValueError(f"graph calls {calls}: need 0 < short < long")
    side_stream_warm_up(fn, 2, backend=backend)  # lazy initializations (NCCL, allocator) must not happen in a capture
    backend.synchronize()
    graphs: dict[int, object] = {}
    try:
        error = None
        try:
            for n in calls:
                graphs[n] = backend.capture(repeat(fn, n))
        except Exception as exc:  # noqa: BLE001 - any capture failure becomes one message for every rank
            error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"[:300]
        error = agree(error)
        if error:
            raise GraphCaptureError(error)
        timer = SampleTimer(None, calls=1, samples=reps, between=barrier, watch=watch)
        # both lengths take turns, a barrier before each replay; the first round warms up and is dropped
        samples = interleave({n: (lambda g=graphs[n]: timer.sample(g.replay)) for n in calls}, reps, discard=1)
        traced = None
        if kernel_time is not None:
            barrier()
            traced = kernel_time(graphs[long_].replay)
    finally:
        for g in graphs.values():
            if hasattr(g, "reset"):
                g.reset()
    med = {n: statistics.median(v) for n, v in samples.items()}
    per_call, method = (med[long_] - med[short]) / (long_ - short), "difference"
    if not per_call > 0:
        per_call, method = med[long_] / long_, "mean"
    row = {"ms": per_call, "replay_ms": {str(n): med[n] for n in calls}, "calls": list(calls), "method": method}
    if traced:
        row["kernel_ms"] = statistics.median(traced) * len(traced) / long_
    return row


def _agreed_error(error: str | None, world: int) -> str | None:
    """Every rank's error (or None) gathered: all ranks take the same path after a capture."""
    if world <= 1 or not dist.is_initialized():
        return error
    errors: list = [None] * world
    dist.all_gather_object(errors, error)
    bad = [f"rank {r}: {e}" for r, e in enumerate(errors) if e]
    return "; ".join(bad) or None


def collective_curve(device: torch.device | str, world: int, sizes: tuple[int, ...] = COLLECTIVE_SIZES, *,
                     backend=None, watch: CallTimer | None = None) -> dict:
    """all_gather / all_reduce / reduce_scatter times over message sizes (bytes per rank), two ways.

    ``eager``: back-to-back calls from the host (``_median_ms``): each call pays the host's launch
    cost when the GPU outruns the host and waits for the last rank, so small messages measure the
    host and the skew. ``graph``: the collective's own device time (``graph_per_call_ms``), which is
    what the analytic model needs (it adds launch costs and the ranks' skew itself). Without graphs
    (a CPU/gloo run) ``graph`` is empty and ``graph_note`` says why; a capture failing on any rank
    ends the graph curve there for every rank (the rows measured before stay).
    """
    from taxmodel.runtime.graph import GraphBackend, GraphCaptureError

    watch = watch or CallTimer(device)
    backend = backend or GraphBackend(device)
    cuda = torch.device(device).type == "cuda"

    def barrier() -> None:
        watch.synchronize()
        if cuda:
            dist.barrier(device_ids=[torch.device(device).index or 0])
        else:
            dist.barrier()

    eager, graph = [], []
    graph_note = backend.unavailable_reason()
    for per_rank in sizes:
        ops = collective_ops(device, world, per_rank)
        for op, fn in ops.items():
            barrier()
            eager.append({"op": op, "bytes_per_rank": per_rank, "ms": _median_ms(fn, device, inner=5, reps=5, watch=watch)})
            if graph_note is not None:
                continue
            barrier()
            label = f"{op} at {per_rank} B"
            try:
                row = graph_per_call_ms(fn, backend=backend, watch=watch, barrier=barrier,
                                        agree=lambda e, label=label: _agreed_error(e and f"{label}: {e}", world),
                                        kernel_time=traced_kernel_ms if cuda else None)
            except GraphCaptureError as exc:  # a capture failed on some rank: every rank ends the graph curve here
                graph_note = str(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - a failed replay ends this rank's graph curve, not the calibration
                graph_note = f"{label}: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"[:300]
                continue
            graph.append({"op": op, "bytes_per_rank": per_rank, **row})
        del ops
    return {"eager": eager, "graph": graph, "graph_note": graph_note}  # graph: the sizes before any failure


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
        ms = _median_ms(lambda d=dst: d.copy_(src, non_blocking=True), device, inner=3, reps=5)
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
            sync.signal(flags_ptr, target, 0, 1, heap_bases)
            sync.wait_geq(flags_ptr + 1, target, budget, err_ptr, 0, 1, 1, 9, MODE)
        else:
            sync.wait_geq(flags_ptr, target, budget, err_ptr, 1, 0, 0, 9, MODE)
            sync.signal(flags_ptr + 1, target, 1, 0, heap_bases)


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
                                                              NUM_PROGS=progs, num_warps=4), device, inner=3, reps=5)

    def write(progs: int) -> float:
        return _median_ms(lambda: _peer_write_kernel[(progs,)](src, heap.heap_bases, n, rank, world, BLOCK=1024,
                                                               NUM_PROGS=progs, num_warps=4), device, inner=3, reps=5)

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
    ms = _median_ms(lambda: _peer_chase_kernel[(1,)](chain, out, heap.heap_bases, steps, rank, peer), device, inner=1,
                    reps=5)
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
    err = sync.new_error_buffer(device)
    mode = sync.sync_mode(device)
    budget = sync.spin_budget(timeout_s, mode)
    base = 0
    times = {}
    heap.barrier()
    for rounds in (10, 100, 2100):
        samples = []
        for _ in range(5 if rounds > 10 else 1):
            heap.barrier()
            if rank in (0, 1):
                samples.append(time_ms(lambda: _pingpong_kernel[(1,)](flags, err, heap.heap_bases, base, rounds, budget,
                                                                      rank, MODE=mode), device))
            base += rounds
        times[rounds] = statistics.median(samples) if samples else None
    sync.check_errors(err, "calibration ping-pong", None, mode)
    heap.barrier()
    heap.close()
    rt = (times[2100] - times[100]) * 1e-3 / 2000 if rank == 0 else None
    return {"rounds_ms": {str(k): v for k, v in times.items()}, "roundtrip_s": rt}


def launch_costs(device: torch.device, n: int = 200) -> dict:
    """Host time per launch (torch op and Triton kernel) while the GPU is busy, GPU time per kernel
    in a CUDA graph, and, from torch.profiler traces read by taxmodel's own Kineto importer, the GPU
    gap between queued kernels, the idle launch latency as the ledger measures them, and the GPU gap
    between consecutive kernels of a replayed CUDA graph."""
    x = torch.zeros(1, device=device)
    big = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    for _ in range(20):
        x.zero_()
        _empty_kernel[(1,)](x)
    torch.cuda.synchronize()

    def host_per_launch(fn) -> float:
        for _ in range(3):
            big @ big  # keep the GPU busy so that launches never wait for it
        with Stopwatch() as sw:  # the host clock: enqueueing, not running
            repeat(fn, n)()
        torch.cuda.synchronize()
        return sw.seconds / n

    host_torch = statistics.median(host_per_launch(x.zero_) for _ in range(3))
    host_triton = statistics.median(host_per_launch(lambda: _empty_kernel[(1,)](x)) for _ in range(3))

    graph = capture_graph(repeat(x.zero_, n), device=device)
    graph_ms = _median_ms(graph.replay, device, inner=1) / n
    out = {"host_launch_torch_s": host_torch, "host_launch_triton_s": host_triton, "graph_per_kernel_s": graph_ms * 1e-3,
           "kernels": n}
    out.update(_optional(lambda: _profiled_gaps(device, x, big), "profiler_error"))
    out.update(_optional(lambda: _graph_gaps(graph), "graph_profiler_error"))
    return out


def _optional(probe: Callable[[], dict], error_key: str) -> dict:
    """``probe()``'s numbers, or its failure in one line under ``error_key``: the profiler is
    optional, a failure keeps the other numbers."""
    try:
        return probe()
    except Exception as exc:  # noqa: BLE001 - any failure of the profiler is one line
        return {error_key: f"{type(exc).__name__}: {exc}"}


def consecutive_gaps_s(kernels: pd.DataFrame, by: str | None = None) -> pd.Series:
    """Per kernel of ``kernels`` (events of one stream), its start less the end of the kernel
    before it (seconds; NaN for the first, of its ``by`` group when given), in start order. The
    difference is taken in integer ns: epoch timestamps (~1.7e18 ns) are not exact as floats."""
    k = kernels.sort_values("start_ns", kind="stable")
    rows = k.groupby(by, sort=False) if by else k
    first = rows.cumcount() == 0 if by else pd.Series(range(len(k)), index=k.index) == 0
    gaps = k["start_ns"] - rows["end_ns"].shift(fill_value=0)
    return (gaps * 1e-9).mask(first)


def graph_kernel_gap(events: pd.DataFrame) -> dict:
    """The median GPU-side gap between consecutive kernels of one replay of a CUDA graph, from a
    trace of replays (``traced_events``): a graph's kernels carry a graph id, and the kernels of one
    replay share their graph launch's correlation, so the gap between one replay's last kernel and
    the next replay's first (a new launch) is left out."""
    k = events[(events["kind"] == "kernel") & (events["graph_id"] >= 0)]
    gaps = consecutive_gaps_s(k, by="correlation").dropna()
    return {"graph_kernel_gap_s": float(gaps.median()) if len(gaps) else None, "graph_pairs": int(len(gaps)),
            "graph_replays": int(k["correlation"].nunique())}


def _graph_gaps(graph, replays: int = 5) -> dict:
    """``graph_kernel_gap`` of ``replays`` replays of ``graph`` (one at a time on an idle GPU)."""
    def body() -> None:
        for _ in range(replays):
            graph.replay()
            torch.cuda.synchronize()

    return graph_kernel_gap(traced_events(body, host=True))


def _profiled_gaps(device: torch.device, x: torch.Tensor, big: torch.Tensor, n: int = 50) -> dict:
    def body() -> None:
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

    events = traced_events(body, host=True)
    k = events[(events["kind"] == "kernel") & events["name"].astype(str).str.contains("_empty_kernel")].sort_values("start_ns")
    launches = events[events["kind"] == "launch"].set_index("correlation")["end_ns"]
    starts, ends = k["start_ns"].to_numpy(), k["end_ns"].to_numpy()
    launch_end = k["correlation"].map(launches).to_numpy(dtype=float)
    # Only pairs the ledger would call kernel_gap: the second kernel's launch call had returned
    # before the first one ended (it was queued), so the gap is the GPU's own.
    queued = launch_end[1:n] <= ends[:n - 1]
    queued_gaps = consecutive_gaps_s(k.iloc[:n]).to_numpy()[1:][queued]
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


# --- entry points --------------------------------------------------------------------------------


def _step(name: str, fn: Callable[[], object], meas: dict, key: str, rank: int) -> None:
    """Run one measurement; a failure is recorded (and printed) instead of ending the calibration."""
    if _STATE is not None:
        _STATE.enter(key)
    t0 = time.perf_counter()
    try:
        meas[key] = fn()
    except Exception as exc:  # noqa: BLE001 - each number is optional except the basics
        meas.setdefault("errors", {})[key] = f"{type(exc).__name__}: {exc}"
        if rank == 0:
            print(f"calibrate: {name} failed: {exc}", flush=True)
    if rank == 0:
        print(f"calibrate: {name} {time.perf_counter() - t0:.1f} s", flush=True)


#: Symmetric heap for the multi-rank kernel microbenchmarks: the copy kernel's gathered A at M=8192
#: (128 MiB of bf16) and its flags, the LL pushes' receive buffers.
KERNEL_HEAP_BYTES = 192 << 20


def _kernel_heap(device: torch.device, world: int, nbytes: int = KERNEL_HEAP_BYTES):
    """The ranks' symmetric heap for the kernel microbenchmarks, or on one GPU its pseudo-peer
    stand-in (``microbench.PseudoPeerHeap``: a second half of its own memory as rank 1)."""
    if world > 1:
        return _heap(device, nbytes)
    from taxmodel.runtime.microbench import PseudoPeerHeap

    return PseudoPeerHeap(nbytes, device)


def _on_peers(measure: Callable[..., dict], device: torch.device, world: int, rank: int,
              nbytes: int = KERNEL_HEAP_BYTES) -> dict:
    """``measure(device, heap, rank, world, barrier)`` on the ranks' heap (one GPU: rank 0 of 2 on the
    pseudo-peer heap), the heap closed after, and where the peers were."""
    heap = _kernel_heap(device, world, nbytes)
    try:
        res = measure(device, heap, rank if world > 1 else 0, max(world, 2), heap.barrier)
    finally:
        heap.close()
    res["peers"] = "NVLink/xGMI peers" if world > 1 else ONE_GPU_PEERS
    return res


def _copy_share(device: torch.device, world: int, rank: int) -> dict:
    from taxmodel.runtime import calibrate_gemm

    return _on_peers(calibrate_gemm.measure_copy_share, device, world, rank)


#: Symmetric heap for the rs_gemm step: the receive slots at M = 8192 (two halves of M x N bf16:
#: 256 MiB, whatever W) and the flags.
RS_HEAP_BYTES = 272 << 20


def _rs_gemm(device: torch.device, world: int, rank: int) -> dict:
    from taxmodel.runtime import calibrate_gemm

    return _on_peers(calibrate_gemm.measure_rs_gemm, device, world, rank, RS_HEAP_BYTES)


def _ll_push(device: torch.device, world: int, rank: int) -> dict:
    from taxmodel.runtime import calibrate_decode

    heap = _heap(device, 64 << 20)
    try:
        return calibrate_decode.measure_push(device, heap, rank, world, heap.barrier)
    finally:
        heap.close()


def _measure_collectives(device: torch.device, world: int, sizes: tuple[int, ...], rank: int) -> dict:
    res = collective_curve(device, world, sizes)
    if res["graph_note"] and rank == 0:
        print(f"calibrate: collective graph timing: {res['graph_note']} (the curve's ops without graph rows stay "
              "eager-timed)", flush=True)
    out = {"collectives": res["eager"], "collectives_graph": res["graph"]}
    if res["graph_note"]:
        out["collectives_graph_note"] = res["graph_note"]
    return out


_STATE: RankState | None = None
"""This rank's phase (the step it measures) for the launcher's status file; None outside ``main``."""


def main(argv: list[str] | None = None) -> None:
    """One calibration rank. Started by ``run_calibration`` (a status directory is set): its
    phase and any failure go to the status file, a traceback to its log, and the launcher says
    what happened in one line; started by hand or by torchrun: failures go to stderr."""
    global _STATE
    disable_multicast()  # NVLink multicast stays off in every rank, before torch.distributed starts
    _STATE = state = RankState(int(os.environ.get("RANK", "0")), os.environ.get(STATUS_DIR_ENV))
    if not state.status_dir:
        _calibrate(argv)
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the launcher stopping the run: clean up (a half-written file)
        signal.signal(sig, _raise_interrupted)
    state.enter("init")
    try:
        _calibrate(argv)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the rank's status, read by the launcher
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        if isinstance(exc, SystemExit):  # the checks below say what is wrong in the exit message
            msg = str(exc.code).removeprefix("taxmodel calibrate: ")
            code = exc.code if isinstance(exc.code, int) else RunError.exit_code
        else:
            msg, code = rank_failure(exc, state)
        write_status(state.status_dir, state.rank, phase=state.phase, error=msg, exit_code=code)
        sys.stdout.flush()
        os._exit(code)  # peers may be stuck in a collective: do not wait for a clean teardown
    state.enter("done")


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def _calibrate(argv: list[str] | None = None) -> None:
    """One rank's calibration: check the arguments, join the ranks, run the steps (``_measure``),
    and on rank 0 fit and write the hardware file (``_write``)."""
    args, steps, sizes = _parse_args(argv)
    cpu = args.device == "cpu"
    existing = json.loads(Path(args.update).read_text()) if args.update else None
    if not cpu and not torch.cuda.is_available():
        raise SystemExit("taxmodel calibrate: no GPU here; calibration measures a GPU machine (datasheet presets serve elsewhere)")
    distributed = "WORLD_SIZE" in os.environ
    if distributed:  # started by the launcher (run_calibration) or torchrun
        device = join_process_group("cpu" if cpu else "cuda").device
    else:
        device, _ = rank_device("cpu" if cpu else "cuda", int(os.environ.get("LOCAL_RANK", 0)))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if world < 2 and "collectives" in steps and set(steps) != set(STEP_KEYS):
        raise SystemExit("taxmodel calibrate: the collectives step needs 2 or more ranks (--world-size)")
    if existing is not None:
        try:
            check_update(existing, steps, world)
        except Exception as exc:  # noqa: BLE001 - every rank stops before measuring anything
            raise SystemExit(f"taxmodel calibrate: {exc}") from exc
    props = None if cpu else torch.cuda.get_device_properties(device)
    t_start = time.perf_counter()
    meas = _measure(steps, device, rank, world, distributed, sizes, props)
    if distributed:
        dist.barrier()
    if rank == 0:
        _write(args.output, steps, meas, existing, props=props, world=world, seconds=time.perf_counter() - t_start)
    if distributed:
        dist.destroy_process_group()


def _parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, tuple[str, ...], tuple[int, ...]]:
    """(the rank's arguments, the steps to run, the collective message sizes); a wrong argument
    ends the rank with argparse's usage error before anything starts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True, help="hardware JSON file to write (rank 0)")
    parser.add_argument("--only", default=None, metavar="STEP[,STEP]",
                        help=f"run only these steps ({', '.join(STEP_KEYS)}); needs --update unless hbm and gemm are among them")
    parser.add_argument("--update", default=None, metavar="FILE",
                        help="an earlier calibration's hardware JSON: the steps not run keep its raw measurements, "
                             "every number is refit (written to --output, another file)")
    parser.add_argument("--sizes", default=None, metavar="BYTES[,BYTES]",
                        help="collective message sizes per rank (default: 8 KB .. 128 MB)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: gloo ranks, collectives step only (tests the CPU path; the numbers describe CPU gloo)")
    args = parser.parse_args(argv)
    try:
        steps = parse_steps(args.only)
    except Exception as exc:  # noqa: BLE001 - an argument error
        parser.error(str(exc))
    if set(steps) != set(STEP_KEYS) and not args.update and not {"hbm", "gemm"} <= set(steps):
        parser.error("--only without the hbm and gemm steps needs --update EXISTING.json (the other numbers come from it)")
    if args.device == "cpu" and set(steps) != {"collectives"}:
        parser.error("--device cpu measures the collectives step only: pass --only collectives")
    if args.update:
        try:
            check_not_input(args.output, [args.update], "hardware file")
        except Exception as exc:  # noqa: BLE001 - an argument error
            parser.error(str(exc))
    sizes = tuple(int(float(x)) for x in args.sizes.split(",")) if args.sizes else COLLECTIVE_SIZES
    return args, steps, sizes


def _measure(steps: tuple[str, ...], device: torch.device, rank: int, world: int, distributed: bool,
             sizes: tuple[int, ...], props) -> dict:
    """The raw measurements of ``steps``, in run order: the single-GPU basics on every rank, the
    multi-rank steps between barriers, then rank 0's own steps (a failed step is recorded under
    ``errors`` by ``_step``, not raised)."""
    meas: dict = {}
    if "hbm" in steps:
        _step("HBM copy", lambda: hbm_bandwidth(device), meas, "hbm", rank)
    if "gemm" in steps:
        _step("GEMM rates", lambda: {**{name: gemm_rate(device, dt) for name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16))},
                                     "fp32": gemm_rate(device, torch.float32, n=4096)}, meas, "gemm", rank)
    if "launch" in steps:
        _step("launch costs", lambda: launch_costs(device), meas, "launch", rank)
    meas["collectives"] = []
    if distributed and world > 1:
        _measure_ranks_together(steps, device, rank, world, sizes, props, meas)
    if not isinstance(meas.get("collectives"), list):
        meas["collectives"] = []
    meas["peer_copy"] = []
    if rank == 0:
        _measure_rank0(steps, device, world, meas)
    return meas


def _measure_ranks_together(steps: tuple[str, ...], device: torch.device, rank: int, world: int,
                            sizes: tuple[int, ...], props, meas: dict) -> None:
    """The steps every rank runs at once (collectives, barrier, peer access, flags, the copy
    kernel beside the GEMM, LL pushes, GEMM+RS's GEMM pushing), between two barriers."""
    if "collectives" in steps:
        _step("collectives", lambda: _measure_collectives(device, world, sizes, rank), meas, "collectives", rank)
        if isinstance(meas.get("collectives"), dict):  # the step's keys, flattened into the raw measurements
            meas.update(meas.pop("collectives"))
    dist.barrier()
    if "barrier" in steps:
        _step("barrier skew", lambda: barrier_skew(device), meas, "barrier", rank)
    if "peer" in steps:
        _step("peer loads/stores", lambda: peer_access(device, world, props.multi_processor_count), meas, "peer", rank)
    if "flag" in steps:
        _step("flag round trip", lambda: flag_roundtrip(device), meas, "flag", rank)
    if "copy_share" in steps:
        _step("copy kernel beside the GEMM", lambda: _copy_share(device, world, rank), meas, "copy_share", rank)
    if "ll" in steps:
        _step("LL pushes", lambda: _ll_push(device, world, rank), meas, "ll_push", rank)
    if "rs_gemm" in steps:
        _step("GEMM+RS's GEMM, every rank pushing", lambda: _rs_gemm(device, world, rank), meas, "rs_gemm", rank)
    dist.barrier()


def _measure_rank0(steps: tuple[str, ...], device: torch.device, world: int, meas: dict) -> None:
    """The steps rank 0 runs alone (P2P copies to each peer, and one GPU's microbenchmarks)."""
    rank = 0
    if "p2p" in steps:
        _step("P2P copies", lambda: peer_copy_bandwidth(device, world), meas, "peer_copy", rank)
    if "combine" in steps:
        from taxmodel.runtime import calibrate_combine

        _step("flash decode combine step", lambda: calibrate_combine.measure(device), meas, "combine", rank)
    if "sync" in steps:
        from taxmodel.runtime import calibrate_sync

        _step("flag wait on a set flag", lambda: calibrate_sync.measure(device), meas, "sync", rank)
    if "tile_gemm" in steps:
        from taxmodel.runtime import calibrate_gemm

        _step("tile GEMM against the vendor GEMM", lambda: calibrate_gemm.measure_tile_gemm(device), meas, "tile_gemm",
              rank)
    if "copy_share" in steps and world == 1:
        _step("copy kernel beside the GEMM (one GPU)", lambda: _copy_share(device, 1, 0), meas, "copy_share", rank)
    if "rs_gemm" in steps and world == 1:
        _step("GEMM+RS's GEMM (one GPU)", lambda: _rs_gemm(device, 1, 0), meas, "rs_gemm", rank)
    if "ll" in steps:
        from taxmodel.runtime import calibrate_decode

        _step("LL merges", lambda: calibrate_decode.measure_merge(device), meas, "ll_merge", rank)
    if "fused_combine" in steps:
        from taxmodel.runtime import calibrate_fused

        _step("fused flash decode's local combine (one rank)", lambda: calibrate_fused.measure(device), meas,
              "fused_combine", rank)
    if "reduce" in steps:
        from taxmodel.runtime import calibrate_reduce

        _step("GEMM+RS reduction program", lambda: calibrate_reduce.measure(device, (max(world, 2), 8)), meas,
              "reduce", rank)


def _write(output: str, steps: tuple[str, ...], meas: dict, existing: dict | None, *, props, world: int,
           seconds: float) -> None:
    """Rank 0: fit ``meas`` (or merge it into ``existing``, an update) into a hardware file, write
    it atomically, check that it loads, and print its numbers (and the collective curve)."""
    if _STATE is not None:
        _STATE.enter("write")
    cpu = props is None
    device_name = "cpu (gloo)" if cpu else props.name
    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "world_size": world,
        "device": device_name,
        "seconds": round(seconds, 1),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda and not cpu else None,
        "repetitions": REPS,
        "taxmodel": _taxmodel_version(),
    }
    if existing is not None:
        failed = {k: v for k, v in (meas.get("errors") or {}).items() if k in steps}
        if failed:
            raise SystemExit(f"taxmodel calibrate: step(s) failed: {failed}; {output} not written")
        spec = update_spec(existing, meas, steps, device_name=None if cpu else props.name,
                           num_sms=None if cpu else props.multi_processor_count, world=world, info=info)
    else:
        for key in ("hbm", "gemm"):
            if key not in meas:
                raise SystemExit(f"taxmodel calibrate: the {key} measurement failed ({meas.get('errors', {}).get(key)}); nothing written")
        spec = fit(meas, props.name, props.multi_processor_count, world,
                   vendor="amd" if getattr(torch.version, "hip", None) else "nvidia")
        spec["measured"] = {**info, "raw": meas}
    out = atomic_write(output, json.dumps(spec, indent=2, default=float) + "\n", what="hardware file")
    from taxmodel.hardware.specs import load_hardware

    load_hardware(out)  # the file must load as a HardwareSpec
    hidden = ("measured", "collectives", "collectives_eager", "collectives_by_world")
    print(json.dumps({k: v for k, v in spec.items() if k not in hidden}, indent=2, default=float))
    if "collectives" in steps and meas.get("collectives"):
        print(curve_table(meas), flush=True)
        own_world = int((spec.get("measured") or {}).get("world_size") or world)
        if world != own_world:
            print(f"calibrate: this curve ({world} ranks) is collectives_by_world[\"{world}\"] in {out}; the file's "
                  f"own curve (collectives, {own_world} ranks) and the link numbers fitted to it stay", flush=True)


def _taxmodel_version() -> str:
    from taxmodel.version import __version__

    return str(__version__)


def calibration_command(output: str | os.PathLike, *, only: str | None = None,
                        update: str | os.PathLike | None = None, sizes: str | None = None,
                        device: str = "cuda") -> list[str]:
    """One calibration rank's command line (``launcher.launch_ranks`` starts one per rank)."""
    from taxmodel.runtime.launcher import python_module_command

    cmd = [*python_module_command("taxmodel.runtime.calibrate"), "-o", str(Path(output).resolve())]
    if only:
        cmd += ["--only", str(only)]
    if update:
        cmd += ["--update", str(Path(update).resolve())]
    if sizes:
        cmd += ["--sizes", str(sizes)]
    if device != "cuda":
        cmd += ["--device", device]
    return cmd


def run_calibration(output: str | os.PathLike, *, world_size: int | None = None, timeout_s: float = 600.0,
                    only: str | None = None, update: str | os.PathLike | None = None, sizes: str | None = None,
                    device: str = "cuda", quiet: bool = False):
    """`taxmodel calibrate`: run ``main`` on ``world_size`` local ranks through the launcher that
    ``taxmodel profile`` uses (each rank its own process group, multicast off, every rank killed
    within seconds of ``timeout_s``, of a failure, or of SIGINT/SIGTERM/SIGHUP: then Interrupted,
    exit 128 + the signal) and return the HardwareSpec it wrote. On a machine without a GPU raise
    UnavailableError. ``only``: comma-separated steps (``parse_steps``); ``update``: an earlier
    calibration's file that the steps not run take their numbers from (needed unless ``only`` has
    hbm and gemm). ``device="cpu"``: gloo ranks, the collectives step only (default 2 ranks)."""
    from taxmodel.errors import InputError, UnavailableError
    from taxmodel.fsutil import check_output_file
    from taxmodel.hardware.specs import load_hardware
    from taxmodel.runtime.launcher import launch_ranks, ranks_output_note, run_directory

    steps = parse_steps(only)
    if update is not None and not Path(update).is_file():
        raise InputError(f"--update {update}: no such file; pass the hardware JSON of an earlier calibration")
    if set(steps) != set(STEP_KEYS) and update is None and not {"hbm", "gemm"} <= set(steps):
        raise InputError("--only without the hbm and gemm steps needs --update EXISTING.json (the other numbers come from it)")
    if device == "cpu":
        if set(steps) != {"collectives"}:
            raise InputError("a CPU calibration measures the collectives step only: pass --only collectives")
        n = 2 if world_size is None else world_size
        if n < 2:
            raise InputError(f"--world-size {n}: the collectives step needs 2 or more ranks")
    else:
        if not torch.cuda.is_available():
            raise UnavailableError(
                "no GPU here: calibration measures the GPUs it runs on. Predictions and ledgers use the datasheet presets "
                "(h100, h200, mi300x, b200) meanwhile; on a GPU machine run `taxmodel calibrate -o hw.json` (or "
                "`torchrun --nproc-per-node N -m taxmodel.runtime.calibrate -o hw.json`) and pass --hardware hw.json")
        n = world_size or torch.cuda.device_count()
        if n < 1 or n > torch.cuda.device_count():
            raise UnavailableError(f"--world-size {n}: this machine has {torch.cuda.device_count()} GPU(s)")
    # never over the file it updates: the earlier calibration stays as it was (write beside it, compare, then move)
    out = check_output_file(Path(output).resolve(), "hardware file", [update] if update is not None else [])
    before = out.stat().st_mtime_ns if out.exists() else None
    cmd = calibration_command(out, only=",".join(steps) if only else None, update=update, sizes=sizes, device=device)
    with run_directory() as run_dir:
        run = launch_ranks(cmd, n, run_dir=run_dir, device=device, deadline_unix=time.time() + timeout_s,
                           timeout_s=timeout_s, quiet=quiet, stopped=f"{out} was not written")
    if run.log is not None:
        print(f"calibrate: {ranks_output_note(run)}", file=sys.stderr, flush=True)
    if not out.exists() or out.stat().st_mtime_ns == before:
        where = f" and in {run.log}" if run.log is not None else ""
        raise RunError(f"calibration ended without writing {out}; its output above{where} says why")
    return load_hardware(out)


if __name__ == "__main__":
    main()
