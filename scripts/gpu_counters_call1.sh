#!/usr/bin/env bash
# One H200 call for the measured-locality work (issues 23/24/26): a plain training step traced
# (eager, CUDA graph, torch.compile; batch 1 and 8) with un-profiled timings, the same eager step
# under ncu, the locality microbenchmark (timings + ncu), and a trial of taxmodel profile under
# ncu. Everything lands under $OUT (few files: one tarball per group).
#
#   OUT=/tmp/o bash scripts/gpu_counters_call1.sh            # from the repo root, one GPU
set -uo pipefail
OUT=${OUT:-out/call1}
W=$(mktemp -d)
mkdir -p "$OUT" "$W/train" "$W/loc" "$W/tm" "$W/logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg
NCU=${NCU:-ncu}
METRICS=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum
NCU_ARGS=(--csv --cache-control none --clock-control none --metrics "$METRICS")
t0=$(date +%s)
BUDGET_S=${BUDGET_S:-500}  # every step ends by then, so the tarballs below are always written
S="$OUT/summary.txt"
: >"$S"

step() {  # step NAME LIMIT CMD...: output to logs/NAME.log, status line to summary
  local name=$1 limit=$2; shift 2
  local a=$(date +%s)
  local left=$(( t0 + BUDGET_S - a ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then echo "== $name: skipped, out of time" | tee -a "$S"; return; fi
  timeout -k 5 "$limit" "$@" >"$W/logs/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $(( $(date +%s) - a )) s (t=$(( $(date +%s) - t0 )) s): $*" | tee -a "$S"
  grep -E "^train_step|^bench_locality|rror|Traceback|bundle|==ERROR" "$W/logs/$name.log" | grep -v USDT | tail -n 8 | sed 's/^/   /' | tee -a "$S"
}

{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__); p = torch.cuda.get_device_properties(0); print(p.name, p.multi_processor_count, 'SMs', getattr(p, 'L2_cache_size', '?'), 'B L2')"
  $NCU --version | tail -n 1
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. Locality microbenchmark: timings, then one chain of each variant under ncu (base units).
step loc_time 90 python benchmarks/bench_locality.py --mode time --sizes 8m,1g --rounds 40 -o "$W/loc/locality_time.json"
step loc_ncu 90 $NCU "${NCU_ARGS[@]}" --print-units base --profile-from-start off --log-file "$W/loc/locality_ncu.csv" \
  python benchmarks/bench_locality.py --mode ncu --sizes 8m,1g

# 2. Training step, batch 1: eager + CUDA graph traced, timings interleaved.
step train_b1 150 python benchmarks/train_step.py --batch 1 --modes eager,graph --out "$W/train"
# 3. The eager batch-1 step under ncu: one step between cudaProfilerStart/Stop, ncu's default
#    units, program output mixed in (as a user's `> counters.csv` would be).
step train_b1_ncu 150 bash -c "$NCU ${NCU_ARGS[*]} --profile-from-start off python benchmarks/train_step.py --batch 1 --ncu-step > $W/train/ncu_eager_b1.csv"
# 4. Batch 8, eager + graph.
step train_b8 120 python benchmarks/train_step.py --batch 8 --modes eager,graph --out "$W/train"
# 5. taxmodel profile on one GPU, plain and under ncu (does the tracer run under ncu? how long?).
step tm_plain 100 python -m taxmodel profile ag_gemm -n 1 --device cuda --preset m1024 --variants bsp --iterations 3 --graph -o "$W/tm/plain"
step tm_ncu 120 $NCU "${NCU_ARGS[@]}" --print-units base --target-processes all --log-file "$W/tm/ncu_ag_gemm_bsp.csv" \
  python -m taxmodel profile ag_gemm -n 1 --device cuda --preset m1024 --variants bsp --iterations 3 --graph -o "$W/tm/ncu"
# 6. torch.compile (default mode) with eager interleaved, both batch sizes (compiles are slow: last).
mkdir -p "$W/compile"
step compile_b1 150 python benchmarks/train_step.py --batch 1 --modes eager,compile --out "$W/compile"
step compile_b8 120 python benchmarks/train_step.py --batch 8 --modes eager,compile --out "$W/compile"

cp "$W/compile"/trace_compile_* "$W/train/" 2>/dev/null
for b in 1 8; do [ -f "$W/compile/timing_b$b.json" ] && cp "$W/compile/timing_b$b.json" "$W/train/timing_compile_b$b.json"; done
tar czf "$OUT/train.tar.gz" -C "$W" train
tar czf "$OUT/loc.tar.gz" -C "$W" loc
tar czf "$OUT/tm.tar.gz" -C "$W" tm
tar czf "$OUT/logs.tar.gz" -C "$W" logs
echo "== done in $(( $(date +%s) - t0 )) s" | tee -a "$S"
ls -la "$OUT" "$W/train" "$W/loc"
