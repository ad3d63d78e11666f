#!/usr/bin/env bash
# One GPU call for issue 25: tune the tile GEMM's per-shape table (bench_gemm.py --tune), benchmark
# it against cuBLAS with that table, then a few shapes outside the table (the default config, M=1,
# M not a multiple of the tile). With TUNE=0 it benchmarks the committed table only.
#
#   OUT=/tmp/o bash scripts/gpu_gemm_call.sh            # from the repo root, one GPU
set -uo pipefail
OUT=${OUT:-out/gemm}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then  # Iris for gemm_tiles' import (carried wheels, see the device README)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site
fi
python -c "import taxmodel.kernels" 2>/dev/null || ln -sfn ../kernels taxmodel/kernels   # see gpu_counters_call2.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # benchmarks/*.py run as scripts import taxmodel from the repo root
L="$OUT/log.txt"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } >"$L" 2>&1
D=$(python -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_gemm, torch; print(bench_gemm.device_label(torch.device('cuda')))")
t0=$(date +%s)
R=$(mktemp -d)
B=(python benchmarks/bench_gemm.py --samples "${SAMPLES:-40}" --out-dir "$R")
if [ "${TUNE:-1}" = 1 ]; then
  timeout -k 5 "${TUNE_LIMIT:-300}" "${B[@]}" --tune --table-out "$OUT/table.json" >>"$L" 2>&1
  echo "== tune+bench: exit $? in $(( $(date +%s) - t0 )) s" >>"$L"
  if [ ! -s "$OUT/table.json" ] || [ "$(cat "$OUT/table.json")" = "{}" ]; then  # e.g. a compiler crash on a candidate
    timeout -k 5 200 "${B[@]}" --tune --no-ws --table-out "$OUT/table.json" >>"$L" 2>&1
    echo "== tune+bench without warp specialization: exit $? at $(( $(date +%s) - t0 )) s" >>"$L"
  elif [ ! -f "$R/gemm_$D.json" ]; then  # stopped before its benchmark: benchmark the table written so far
    TAXMODEL_GEMM_TABLE="$OUT/table.json" timeout -k 5 120 "${B[@]}" >>"$L" 2>&1
    echo "== bench (partial table): exit $? at $(( $(date +%s) - t0 )) s" >>"$L"
  fi
  [ -s "$OUT/table.json" ] && export TAXMODEL_GEMM_TABLE="$OUT/table.json"
else
  timeout -k 5 200 "${B[@]}" >>"$L" 2>&1
  echo "== bench: exit $? in $(( $(date +%s) - t0 )) s" >>"$L"
fi
timeout -k 5 90 python benchmarks/bench_gemm.py --ms 1,1000,2048 --n 4096 --k 4096 --world 1 --samples 30 \
  --device-name "$D-outside" --out-dir "$R" >>"$L" 2>&1
echo "== outside-table shapes: exit $? at $(( $(date +%s) - t0 )) s" >>"$L"
cp "$R"/* "$OUT"/ 2>/dev/null
cat "$L"; ls -la "$OUT"
