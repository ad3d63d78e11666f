"""Import at scale: a synthetic 2-rank Kineto job of 2 million kernels (~533 MB of JSON), imported
with `taxmodel import`, its wall time and peak memory measured (issue 38 target: under 60 s and
2 GB on the 2-core development machine).

The traces look like torch.profiler's: per kernel a ``cuda_runtime`` cudaLaunchKernel and a
``kernel`` event with Kineto's args (device, stream, correlation, grid, block), times in
microseconds with nanosecond decimals, ProfilerStep#N markers every 100 kernels, an NCCL
all-gather (collective metadata) every 50 kernels, deviceProperties and distributedInfo.

    python benchmarks/bench_import_scale.py --kernels 1000000 --ranks 2 --dir /tmp/scale
    python benchmarks/bench_import_scale.py --kernels 1000000 --ranks 2 --dir /tmp/scale --keep

Writes the traces under --dir (never into the repository), runs the import as a child process
and prints one JSON line: kernels, bytes, wall_s, cpu_s (user + system of the child: on a shared
machine the wall time also counts other people's work, see load_avg_1min), peak_rss_mb (the
child's ru_maxrss).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

KERNELS_PER_STEP = 100
NCCL_EVERY = 50
BASE_US = 1_700_000_000_000  # wall-clock microseconds, as Kineto writes them


def _us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def write_rank(path: Path, rank: int, world: int, kernels: int) -> int:
    """One rank's trace of ``kernels`` kernels; returns its size in bytes."""
    head = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_000_000_000, "computeMajor": 9,
                              "computeMinor": 0, "numSms": 132, "warpSize": 32}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "nccl_version": "2.28.9"},
        "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
    }
    pid, tid, stream = 4000 + rank, 4000 + rank, 7
    t = BASE_US * 1000 + rank * 137
    out = [json.dumps(head)[:-1] + ', "traceEvents": [\n']
    with open(path, "w", encoding="utf-8") as f:
        step = 0
        for k in range(kernels):
            if k % KERNELS_PER_STEP == 0:
                step += 1
                out.append(f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{step}","pid":{pid},"tid":{tid},'
                           f'"ts":{_us(t)},"dur":{_us(KERNELS_PER_STEP * 5_000)},"args":{{"External id":{k}}}}},\n')
            corr = k + 1
            launch_dur = 2_345 + (k * 7919) % 1000
            out.append(f'{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":{pid},"tid":{tid},'
                       f'"ts":{_us(t + 100)},"dur":{_us(launch_dur)},"args":{{"correlation":{corr}}}}},\n')
            dur = 1_500 + (k * 104729) % 2000
            if k % NCCL_EVERY == NCCL_EVERY - 1:
                out.append(f'{{"ph":"X","cat":"kernel","name":"ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",'
                           f'"pid":0,"tid":{stream + 1},"ts":{_us(t + 3_000)},"dur":{_us(dur)},"args":{{"device":0,'
                           f'"stream":{stream + 1},"correlation":{corr},"grid":[4,1,1],"block":[512,1,1],'
                           f'"Collective name":"_allgather_base","In msg nelems":1024,"Out msg nelems":{1024 * world},'
                           f'"dtype":"BFloat16","Process Group Name":"0"}}}},\n')
            else:
                out.append(f'{{"ph":"X","cat":"kernel","name":"gemm_{k % 8}","pid":0,"tid":{stream},'
                           f'"ts":{_us(t + 3_000)},"dur":{_us(dur)},"args":{{"device":0,"stream":{stream},'
                           f'"correlation":{corr},"grid":[132,1,1],"block":[256,1,1]}}}},\n')
            t += 5_000
            if len(out) > 20_000:
                f.write("".join(out))
                out.clear()
        out.append('{"ph":"i","cat":"overhead","name":"end","pid":0,"tid":0,"ts":' + _us(t) + "}\n")
        out.append('], "traceName": "rank%d", "baseTimeNanoseconds": 1700000000000000000}\n' % rank)
        f.write("".join(out))
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=1_000_000, help="kernels per rank")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--dir", type=Path, required=True, help="where the traces and the bundle go (outside the repository)")
    ap.add_argument("--keep", action="store_true", help="reuse traces already there")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    paths = [args.dir / f"rank{r}.json" for r in range(args.ranks)]
    if not (args.keep and all(p.exists() for p in paths)):
        for r, p in enumerate(paths):
            write_rank(p, r, args.ranks, args.kernels)
    size = sum(p.stat().st_size for p in paths)
    out = args.dir / "bundle"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "taxmodel", "import", *map(str, paths), "-o", str(out), "--no-keep-raw"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = usage.ru_maxrss / 1024
    cpu = usage.ru_utime + usage.ru_stime
    if proc.returncode != 0:
        sys.exit(f"import failed ({proc.returncode}): {proc.stderr[-2000:]}")
    print(json.dumps({"ranks": args.ranks, "kernels": args.kernels * args.ranks, "json_bytes": size,
                      "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "peak_rss_mb": round(peak),
                      "cpus": os.cpu_count(), "load_avg_1min": round(os.getloadavg()[0], 1),
                      "python": sys.version.split()[0]}))


if __name__ == "__main__":
    main()
