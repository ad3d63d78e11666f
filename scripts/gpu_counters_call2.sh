#!/usr/bin/env bash
# Second H200 call for the measured-locality work: the training step's eager + CUDA-graph traces
# (batch 1 and 8), `taxmodel profile --counters` bundles of AG+GEMM, GEMM+RS and Flash Decode on one
# GPU, and the locality chain's DRAM bytes per range (ncu range replay). Results under $OUT.
#
#   OUT=/tmp/o bash scripts/gpu_counters_call2.sh             # from the repo root, one GPU
set -uo pipefail
OUT=${OUT:-out/call2}
W=$(mktemp -d)
mkdir -p "$OUT" "$W/train" "$W/loc" "$W/runs" "$W/logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg
METRICS=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum
t0=$(date +%s)
BUDGET_S=${BUDGET_S:-520}
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
  tr '\r' '\n' <"$W/logs/$name.log" | grep -E "^train_step|^bench_locality|rror|Traceback|bundle|--counters|skipped|--graph" \
    | grep -v USDT | tail -n 10 | sed 's/^/   /' | tee -a "$S"
}

if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >"$W/logs/wheels.log" 2>&1
  export PYTHONPATH=/tmp/site
fi
# kernels/ ships as taxmodel.kernels (pyproject's package-dir); `python -m` from the repo root finds the
# source tree's taxmodel/ first, so link the kernels into it on this throw-away copy.
python -c "import taxmodel.kernels" 2>/dev/null || ln -sfn ../kernels taxmodel/kernels
python -c "import taxmodel.kernels, iris; print('taxmodel.kernels and iris import')" 2>&1 | tail -n 2 | tee -a "$S"

TRAIN=${TRAIN:-1}
# 1. The training step, eager + whole-step CUDA graph, batch 1 and 8 (traces + interleaved timings).
[ "$TRAIN" = 1 ] && step train_b1 120 python benchmarks/train_step.py --batch 1 --modes eager,graph --out "$W/train"
[ "$TRAIN" = 1 ] && step train_b8 120 python benchmarks/train_step.py --batch 8 --modes eager,graph --out "$W/train"
# 2. The locality chain: DRAM bytes of each whole chain (ncu range replay: one result per
#    cudaProfilerStart/Stop range, the L2 left as the kernels leave it between them).
step loc_range 60 ncu --csv --print-units base --cache-control none --clock-control none --replay-mode range \
  --metrics "$METRICS" --log-file "$W/loc/locality_ncu_range.csv" \
  python benchmarks/bench_locality.py --mode ncu --sizes 8m,1g
# 3. taxmodel profile --counters on one GPU.
P="python -m taxmodel profile -n 1 --device cuda --graph --counters --iterations 5 --warmup 2 --timeout 200 -o $W/runs"
step ag_gemm 230 $P ag_gemm --preset m1024,m8192
step gemm_rs 150 $P gemm_rs --preset m1024
step flash_decode 150 $P flash_decode --preset b1-kv16k

tar czf "$OUT/train.tar.gz" -C "$W" train
tar czf "$OUT/loc.tar.gz" -C "$W" loc
tar czf "$OUT/runs.tar.gz" -C "$W" runs
tar czf "$OUT/logs.tar.gz" -C "$W" logs
echo "== done in $(( $(date +%s) - t0 )) s" | tee -a "$S"
ls -la "$OUT"; du -sh "$W"/*
