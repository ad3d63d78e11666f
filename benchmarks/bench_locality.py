"""Locality as the only difference: an elementwise chain unfused (two kernels, y in memory) vs fused.

Why (issue "Measured data locality", point 4): the locality tax measured from DRAM counters
must equal what fusing actually saves when the intermediate does not fit in L2, and be small
when it does. The chain is ``y = a*x + b; z = relu(y)`` over fp32 vectors:

  unfused  two Triton kernels, ``axpb`` (reads x, writes y) then ``relu`` (reads y, writes z);
  fused    one Triton kernel (reads x, writes z): y never leaves registers.

Both move the same compulsory bytes (x read once, z written once) and do the same arithmetic;
the unfused chain adds y's round trip, which the 60 MiB L2 of an H200 absorbs at 8 MB and
cannot at 1 GB.

Timing (``--mode time``): per size, ``--rounds`` alternations unfused/fused after warm-up, each
a replay of one CUDA graph of ``--calls`` chains rotating over input sets (so x and z come from
and go to HBM even when they would fit in L2; y is one buffer, as an intermediate would be),
timed with CUDA events; the median per chain. A device-to-device copy gives the achievable
HBM bandwidth. ``--mode ncu`` runs every kernel of each variant once between
``cudaProfilerStart/Stop`` for ``ncu --profile-from-start off``, NVTX-free (kernel order:
per size, unfused axpb, unfused relu, fused). Analysis: ``benchmarks/locality_report.py``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from taxmodel.runtime import timing
import triton.language as tl

BLOCK = 4096


@triton.jit
def axpb_kernel(x_ptr, y_ptr, a, b, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * a + b, mask=mask)


@triton.jit
def relu_kernel(y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(z_ptr + offs, tl.maximum(tl.load(y_ptr + offs, mask=mask), 0.0), mask=mask)


@triton.jit
def fused_kernel(x_ptr, z_ptr, a, b, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(z_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask) * a + b, 0.0), mask=mask)


A, B = 1.5, -0.25


def unfused(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> None:
    grid = (triton.cdiv(x.numel(), BLOCK),)
    axpb_kernel[grid](x, y, A, B, x.numel(), BLOCK=BLOCK, num_warps=8)
    relu_kernel[grid](y, z, x.numel(), BLOCK=BLOCK, num_warps=8)


def fused(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> None:
    del y  # same signature as unfused; the fused chain needs no intermediate
    fused_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, z, A, B, x.numel(), BLOCK=BLOCK, num_warps=8)


VARIANTS = {"unfused": unfused, "fused": fused}


class Case:
    """Buffers of one size: ``sets`` (x, z) pairs to rotate over and one intermediate y."""

    def __init__(self, nbytes: int, sets: int, device: torch.device) -> None:
        self.n = nbytes // 4
        self.nbytes = self.n * 4
        self.xs = [torch.randn(self.n, device=device) for _ in range(sets)]
        self.zs = [torch.full((self.n,), float("nan"), device=device) for _ in range(sets)]
        self.y = torch.empty(self.n, device=device)

    def run(self, variant: str, calls: int, start: int = 0) -> None:
        for c in range(calls):
            k = (start + c) % len(self.xs)
            VARIANTS[variant](self.xs[k], self.y, self.zs[k])

    def check(self, variant: str) -> float:
        """Relative error of one chain against torch (outputs poisoned first)."""
        self.zs[0].fill_(float("nan"))
        self.run(variant, 1)
        ref = torch.relu(self.xs[0].double() * A + B)
        return float((self.zs[0].double() - ref).norm() / ref.norm())


def sizes_from(text: str) -> list[int]:
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    return [int(float(s[:-1]) * units[s[-1].lower()]) if s[-1].lower() in units else int(s) for s in text.split(",")]


def copy_bandwidth(device: torch.device, nbytes: int = 2 * 2**30, reps: int = 20) -> float:
    """Achievable HBM bandwidth (bytes read + written per second) of a large device copy, median."""
    return timing.copy_bandwidth(torch.randn(nbytes // 4, device=device), reps=reps)


def time_case(case: Case, calls: int, rounds: int, warmup: int) -> dict:
    graphs = {}
    for v in VARIANTS:
        case.run(v, calls)  # compile + warm
        graphs[v] = timing.capture_graph(lambda v=v: case.run(v, calls), device=case.y.device)
    timing.warm_up([g.replay for g in graphs.values()], warmup)
    per = timing.time_interleaved({v: g.replay for v, g in graphs.items()}, rounds, device=case.y.device)
    per = {v: [ms * 1e6 / calls for ms in t] for v, t in per.items()}  # ns per chain
    diffs = [u - f for u, f in zip(per["unfused"], per["fused"])]
    return {v: timing.spread(t, "ns") for v, t in per.items()} | timing.spread(diffs, "ns", prefix="diff_") | {
        "rounds": rounds, "calls_per_round": calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["time", "ncu", "check"], default="time")
    ap.add_argument("--sizes", default="8m,1g", help="intermediate (y) bytes per size, e.g. 8m,1g")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--budget", type=int, default=8 * 2**30, help="bytes of x+z per size to rotate over")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    device = torch.device(args.device)
    sizes = sizes_from(args.sizes)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "triton": triton.__version__, "dtype": "float32", "block": BLOCK,
              "chain": "y = 1.5*x - 0.25; z = relu(y)", "sizes": []}
    if device.type == "cuda" and args.mode == "time":
        result["copy_bandwidth_Bps"] = copy_bandwidth(device)
        print(f"bench_locality: device copy {result['copy_bandwidth_Bps'] / 1e12:.3f} TB/s (read+write)", flush=True)
    for nbytes in sizes:
        sets = max(2, min(16, args.budget // (2 * nbytes)))
        case = Case(nbytes, 1 if args.mode != "time" else sets, device)
        errs = {v: case.check(v) for v in VARIANTS}
        bad = {v: e for v, e in errs.items() if not e < 1e-6}
        if bad:
            raise SystemExit(f"bench_locality: wrong result at {nbytes} B: {bad}")
        if args.mode == "ncu":
            scratch = torch.empty(256 * 2**20 // 4, device=device)
            for v in VARIANTS:  # each chain starts with x, z out of L2, as in the timed rotation
                scratch.fill_(1.0)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.profiler.start()
                case.run(v, 1)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.profiler.stop()
            del scratch
            print(f"bench_locality: ncu pass at {nbytes} B (unfused: axpb, relu; fused)", flush=True)
        elif args.mode == "time":
            calls = max(1, min(200, (256 * 2**20) // nbytes)) if nbytes < 2**30 else 1
            calls = max(calls, sets) if nbytes < 2**30 else calls
            row = {"intermediate_bytes": case.nbytes, "elements": case.n, "input_sets": sets,
                   "compulsory_bytes": 2 * case.nbytes, "rel_err": errs} | time_case(case, calls, args.rounds, args.warmup)
            result["sizes"].append(row)
            print(f"bench_locality: {case.nbytes / 2**20:9.1f} MiB unfused {row['unfused']['median_ns'] / 1e3:9.2f} us "
                  f"fused {row['fused']['median_ns'] / 1e3:9.2f} us diff {row['diff_median_ns'] / 1e3:8.2f} us "
                  f"({args.rounds} alternations, {calls} chains each)", flush=True)
        else:
            print(f"bench_locality: {nbytes} B correct: {errs}", flush=True)
        del case
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.out and args.mode == "time":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
