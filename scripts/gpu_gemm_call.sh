#!/usr/bin/env bash
# GPU calls for the GEMM engine (issues 25, 34), one GPU, from the repo root; results under $OUT.
#
#   PHASE=tune  OUT=/tmp/o bash scripts/gpu_gemm_call.sh   # tune the per-shape table (bench_gemm.py --tune)
#   PHASE=all   OUT=/tmp/o bash scripts/gpu_gemm_call.sh   # tune, then the benchmark with the new table
#   PHASE=all CANDIDATE_SET=table OUT=/tmp/o bash scripts/gpu_gemm_call.sh
#       # a shorter tuning: the committed tables' entries only, and the voting wait against the spin
#   PHASE=bench OUT=/tmp/o TABLE=path bash scripts/gpu_gemm_call.sh
#       # the benchmark (every engine impl beside cuBLAS, SAMPLES per impl) with TABLE (default: the
#       # committed table of this GPU's family), then shapes outside the table (M=1, M=1000, K not a
#       # multiple of BLOCK_K)
#
# Carried wheels (.whl: tokenspeed-iris and its tritonblas) are installed into /tmp/site first.
set -uo pipefail
OUT=${OUT:-out/gemm}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site
fi
python -c "import taxmodel.kernels" 2>/dev/null || ln -sfn ../kernels taxmodel/kernels   # the package mapping of pyproject.toml
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # benchmarks/*.py run as scripts import taxmodel from the repo root
L="$OUT/log_${PHASE:-bench}.txt"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } >"$L" 2>&1
D=$(python -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_gemm, torch; print(bench_gemm.device_label(torch.device('cuda')))")
t0=$(date +%s)
if [ "${PHASE:-bench}" = tune ] || [ "${PHASE:-bench}" = all ]; then
  timeout -k 5 "${TUNE_LIMIT:-540}" python benchmarks/bench_gemm.py --tune --table-out "$OUT/table_$D.json" \
    --tune-samples "${TUNE_SAMPLES:-16}" --samples 1 --warmup 0 --out-dir "$OUT" --impls taxmodel_wait,taxmodel_rs \
    --candidate-set "${CANDIDATE_SET:-all}" >>"$L" 2>&1
  echo "== tune: exit $? in $(( $(date +%s) - t0 )) s" >>"$L"
  rm -f "$OUT/gemm_$D.json" "$OUT/gemm_$D.md"   # the one-sample benchmark after the tuning is not a result
  [ "$PHASE" = all ] && [ -s "$OUT/table_$D.json" ] && TABLE="$OUT/table_$D.json"
fi
if [ "${PHASE:-bench}" != tune ]; then
  [ -n "${TABLE:-}" ] && export TAXMODEL_GEMM_TABLE="$TABLE"
  timeout -k 5 "${BENCH_LIMIT:-420}" python benchmarks/bench_gemm.py --samples "${SAMPLES:-40}" --out-dir "$OUT" \
    --impls "${IMPLS:-taxmodel,taxmodel_wait,taxmodel_rs,taxmodel_wait_spin,taxmodel_epoch}" >>"$L" 2>&1
  echo "== bench: exit $? in $(( $(date +%s) - t0 )) s" >>"$L"
  [ "${SKIP_OUTSIDE:-0}" = 1 ] || timeout -k 5 120 python benchmarks/bench_gemm.py --ms 1,1000 --n 4096 --k 4136 --world 4 --samples 30 \
    --device-name "$D-outside" --out-dir "$OUT" >>"$L" 2>&1
  echo "== outside-table shapes: exit $? at $(( $(date +%s) - t0 )) s" >>"$L"
fi
grep -v "^  tune" "$L" | tail -40; ls -la "$OUT"
