#!/usr/bin/env bash
# GPU smoke test of `taxmodel profile`: 4-rank NVIDIA runs of every built-in workload, one run
# with injected taxes, and the ledger of each bundle. Everything lands under $OUT.
#
#   OUT=out/gpu_profile bash scripts/gpu_profile_smoke.sh        # from the repo root, 4 GPUs
#
# Needs taxmodel importable with its kernels (`pip install --no-deps -e .`) and Iris
# (tokenspeed-iris + tokenspeed-tritonblas wheels) for the fine-grained variants; variants whose
# requirements are missing are skipped with the reason printed, not failed.
set -uo pipefail
OUT=${OUT:-out/gpu_profile}
WORLD=${WORLD:-4}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

python -c "import taxmodel.kernels" 2>/dev/null || pip install --no-deps --no-build-isolation -q -e . >"$OUT/install.log" 2>&1
nvidia-smi -L >"$OUT/gpus.txt" 2>&1 || true

status=0
run() {  # run NAME CMD...: log to $OUT/NAME.log, remember failures
  local name=$1; shift
  echo "== $name: $*" | tee -a "$OUT/summary.txt"
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc" | tee -a "$OUT/summary.txt"
  tail -n 8 "$OUT/$name.log" | tr '\r' '\n' | grep -v '^\s*$' | tail -n 6 | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || status=1
}

run ag_gemm      taxmodel profile ag_gemm      --device cuda --world-size "$WORLD" --preset m4096 --iterations 5 --warmup 3 --timeout 240 -o "$OUT/runs"
run flash_decode taxmodel profile flash_decode --device cuda --world-size "$WORLD" --preset b16-kv16k --iterations 5 --warmup 3 --timeout 200 -o "$OUT/runs"
# Known taxes: rank 1 starts 500 us late; 4 empty launches between stages; an extra copy of the gathered A.
run inject       taxmodel profile ag_gemm      --device cuda --world-size "$WORLD" --preset m4096 --variants bsp --iterations 5 \
                 --inject sleep_rank=1:500 --inject extra_launches=4 --inject extra_copy=1 --timeout 120 -o "$OUT/inject"

for b in "$OUT"/runs/*/* "$OUT"/inject/*/*; do
  [ -f "$b/meta.json" ] || continue
  run "analyze_$(basename "$(dirname "$b")")_$(basename "$b")" taxmodel analyze "$b" --hardware h200 --per-rank
done
exit $status
