#!/usr/bin/env bash
# Third H200 call: the locality chain (benchmarks/locality_workload.py) through the tool itself,
# `taxmodel profile --counters` with CUDA graphs at an L2-resident (8 MB) and an HBM (1 GB)
# intermediate. Bundles tarred under $OUT.
#
#   OUT=/tmp/o bash scripts/gpu_counters_call3.sh             # from the repo root, one GPU
set -uo pipefail
OUT=${OUT:-out/call3}
W=$(mktemp -d)
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg
if [ -d .whl ]; then  # Iris for the built-in workloads' imports (carried wheels, see the device README)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site
fi
python -c "import taxmodel.kernels" 2>/dev/null || ln -sfn ../kernels taxmodel/kernels   # see gpu_counters_call2.sh
t0=$(date +%s)
timeout -k 5 300 python -m taxmodel profile locality_chain --workload-module benchmarks/locality_workload.py -n 1 \
  --device cuda --graph --counters --preset l2,hbm --iterations 10 --warmup 3 --timeout 250 -o "$W/runs" \
  >"$W/profile.log" 2>&1
echo "profile: exit $? in $(( $(date +%s) - t0 )) s" | tee "$OUT/summary.txt"
tr '\r' '\n' <"$W/profile.log" | grep -v USDT | grep -E "bundle|counters|rror|Traceback|--graph|locality" | tail -n 15 | tee -a "$OUT/summary.txt"
cp "$W/profile.log" "$OUT/profile.log"
tar czf "$OUT/runs.tar.gz" -C "$W" runs
ls -la "$OUT"
