#!/usr/bin/env bash
# The analytic model on the GPUs at hand (issue 33), in one call of at most ~9 minutes on a machine of
# N GPUs (1, 2 or 4), from the repo root:
#   1. taxmodel calibrate (every step, the microbenchmarks of the workloads' own kernels included)
#   2. taxmodel profile of the three workloads, every variant, --graph, the default alignment (auto:
#      back-to-back on GPUs), REPEAT repetitions; each graph bundle also times its step un-profiled
#      (meta capture.replay_step_us: the steps of one traced repetition in one graph, replayed)
#   3. taxmodel validate of those bundles with the fits of the 4x H200 (taxmodel/data/fitted.json)
#      and this machine's calibration (--hardware): nothing refit, every bundle out of sample
#   4. the advisor on the AG+GEMM and GEMM+RS pairs (benchmarks/advise_h200x4.py --root)
#   5. the traced step against the same step replayed un-profiled, per bundle; if time is left, the
#      short steps (flash decode b1-kv16k, b16-kv1k; AG+GEMM m1024) also with --align host and device
#
#   OUT=/tmp/o bash scripts/gpu_model_check.sh                  # on the GPU machine
#   DEV=cpu N=2 OUT=/tmp/o bash scripts/gpu_model_check.sh      # CPU dry run (interpreter, tiny presets,
#                                                               # the shipped H200 calibration)
#
# Writes under $OUT (7 files): calibration.json, validation.md, advise.md, profile_vs_replay.md,
# summary.txt, bundles.tar.gz (every bundle, raw traces dropped), logs.tar.gz. Each step has its own
# timeout; a failing step is logged and the others still run; partial results are kept.
set -uo pipefail
REPO=$PWD
OUT=${OUT:-out/model_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DEV=${DEV:-cuda}
BUDGET=${BUDGET:-540}      # seconds for the whole call: optional steps are skipped when too little is left
OTHER_ALIGN=${OTHER_ALIGN:-1}  # 0: no --align host/device runs in step 5
REPEAT=${REPEAT:-2}
if [ "$DEV" = cpu ]; then
  N=${N:-2}; FD_PRESETS=${FD_PRESETS:-tiny}; AG_PRESETS=${AG_PRESETS:-tiny}; RS_PRESETS=${RS_PRESETS:-tiny}
  SHORT_FD=${SHORT_FD:-tiny}; SHORT_AG=${SHORT_AG:-tiny}
else
  N=${N:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  FD_PRESETS=${FD_PRESETS:-b1-kv16k,b16-kv1k}
  AG_PRESETS=${AG_PRESETS:-m1024,m8192}
  RS_PRESETS=${RS_PRESETS:-m1024,m8192}
  SHORT_FD=${SHORT_FD:-b1-kv16k,b16-kv1k}; SHORT_AG=${SHORT_AG:-m1024}
fi
# every variant; on one GPU the ones that need peers are left out
if [ "$N" -gt 1 ]; then FD_V=bsp,fused; AG_V=bsp,pull,push,torch_fused; RS_V=bsp,fused,torch_fused
else FD_V=bsp,fused; AG_V=bsp,pull,push; RS_V=bsp,fused; fi

W=$(mktemp -d)
L="$W/logs"; R="$W/runs"
mkdir -p "$L" "$R/default"
S="$OUT/summary.txt"
: >"$S"
t0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg
# AG+GEMM's transport: the Triton copy kernel by default here (graph-safe for pull and push: the committed
# captures'); AG_TRANSPORT= (empty) leaves the product's default (copy engines: pull in graphs, push eager)
if [ -n "${AG_TRANSPORT-sm}" ]; then export TAXMODEL_AG_GEMM_TRANSPORT=${AG_TRANSPORT-sm}; fi
if [ -d .whl ]; then   # no network there: the carried wheels (click, tqdm, tokenspeed-iris, tokenspeed-tritonblas)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$L/pip.log" 2>&1
  export PYTHONPATH=/tmp/site
fi
python3 -c "import taxmodel.kernels" 2>/dev/null || ln -sfn ../kernels taxmodel/kernels   # pyproject's package mapping
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
TM="python3 -m taxmodel"
cd "$W"   # the CLI runs from outside the source tree

left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
run() {  # run NAME LIMIT CMD...: output to logs/NAME.log, its exit and last lines to summary.txt
  local name=$1 limit=$2; shift 2
  local room; room=$(left)
  [ "$limit" -gt "$room" ] && limit=$room
  if [ "$limit" -lt 20 ]; then echo "== $name: skipped (${room} s of the budget left)" | tee -a "$S"; return 99; fi
  echo "== $name (limit ${limit} s): $*" | tee -a "$S"
  timeout -k 10 "$limit" "$@" >"$L/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc at $(( $(date +%s) - t0 )) s" | tee -a "$S"
  tr '\r' '\n' <"$L/$name.log" | grep -E "bundle\(s\)|rror|skipped|failed|--graph|wrote|Traceback|within target" \
    | grep -v USDT | tail -n 6 | sed 's/^/   /' | tee -a "$S"
  return $rc
}
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; echo "N=$N DEV=$DEV"
} >>"$S" 2>&1

# 1. calibration (a name with "calibrated" in it: validate's search finds it beside the bundles too),
#    in two calls: the peaks, links and probes first, then the kernel microbenchmarks as an update, so
#    that a failing microbenchmark cannot cost the file
HW="$R/default/machine-calibrated.json"
if [ "$DEV" = cpu ]; then
  cp "$REPO/taxmodel/data/hardware/h200-calibrated.json" "$HW"
  echo "== calibrate: skipped on CPU (the shipped H200 calibration stands in)" | tee -a "$S"
else
  KSTEPS=tile_gemm,copy_share,rs_gemm,ll,fused_combine,reduce
  # one GPU: no steps that need peers (their numbers come from the datasheet, and nothing here crosses a link)
  BASE=$(python3 -c "from taxmodel.model.calibration import STEP_KEYS, MULTI_RANK_STEPS as M
skip = '$KSTEPS'.split(',') + (list(M) if $N < 2 else [])
print(','.join(s for s in STEP_KEYS if s not in skip))")
  run calibrate 120 $TM calibrate -o "$W/base.json" -n "$N" --timeout 110 --only "$BASE"
  if [ -f "$W/base.json" ]; then
    run calibrate_kernels 170 $TM calibrate -o "$HW" -n "$N" --timeout 160 --only "$KSTEPS" --update "$W/base.json"
    if [ ! -f "$HW" ]; then  # an update with a failed step writes nothing: keep the steps that work, one by one
      cp "$W/base.json" "$W/cur.json"
      for st in ${KSTEPS//,/ }; do
        [ "$(left)" -gt 380 ] || break
        run "calibrate_$st" 80 $TM calibrate -o "$W/step.json" -n "$N" --timeout 70 --only "$st" --update "$W/cur.json" \
          && cp "$W/step.json" "$W/cur.json"
      done
      cp "$W/cur.json" "$HW"
    fi
  fi
fi
[ -f "$HW" ] && cp "$HW" "$OUT/calibration.json"
HWARG=(); [ -f "$HW" ] && HWARG=(--hardware "$HW")

# 2. the three workloads, default alignment, CUDA graphs
P="$TM profile --device $DEV -n $N --repeat $REPEAT --timeout 160 --graph"
run fd 170 $P flash_decode --preset "$FD_PRESETS" --variants "$FD_V" -o "$R/default"
run ag 190 $P ag_gemm --preset "$AG_PRESETS" --variants "$AG_V" -o "$R/default"
run rs 170 $P gemm_rs --preset "$RS_PRESETS" --variants "$RS_V" -o "$R/default"

# 3. the model out of sample: the 4x H200 fits, this machine's calibration
run validate 150 $TM validate "$R/default" --fitted-from "$REPO/taxmodel/data/fitted.json" ${HWARG[@]+"${HWARG[@]}"} \
  --markdown "$OUT/validation.md"

# 4. the advisor on the pairs
run advise 120 python3 "$REPO/benchmarks/advise_h200x4.py" --root "$R/default" ${HWARG[@]+"${HWARG[@]}"}
cp "$L/advise.log" "$OUT/advise.md" 2>/dev/null

# 5. the traced step against the same graph replayed un-profiled; the other alignments if time is left
if [ "${OTHER_ALIGN:-1}" = 1 ] && [ "$(left)" -gt 200 ]; then
  for align in host device; do
    run "fd_$align" 110 $P flash_decode --preset "$SHORT_FD" --variants "$FD_V" --align "$align" -o "$R/align-$align"
    run "ag_$align" 110 $P ag_gemm --preset "$SHORT_AG" --variants bsp,pull,push --align "$align" -o "$R/align-$align"
  done
else
  echo "== other alignments: skipped ($(left) s of the budget left)" | tee -a "$S"
fi
timeout 120 python3 - "$R" >"$OUT/profile_vs_replay.md" 2>"$L/profile_vs_replay.err" <<'EOF'
import sys
from pathlib import Path

import taxmodel
from taxmodel.trace.bundle import find_bundles

print("# Traced step against the same step replayed un-profiled\n")
print("Traced: the mean iteration window of the bundle (`taxmodel profile --graph`, the alignment given). Replayed: "
      "the same step with nothing traced, in the same process, timed as the benchmark scripts time a graph: "
      "capture.iterations steps captured in one CUDA graph, the median of 5 replays per step, the slowest rank's "
      "(meta capture.replay_step_us; bundles without capture.replay_method timed one graph launch per step). "
      "Target: within 5%.\n")
print("| run | workload/variant | shape | align | traced step us | replayed step us | traced / replayed | within 5% |")
print("|---|---|---|---|---:|---:|---:|---|")
for path in find_bundles(Path(sys.argv[1])):
    try:
        p = taxmodel.load(path)
        cap = p.meta.get("capture") or {}
        rep = cap.get("replay_step_us")
        step = p.window_ns / 1e3
        shape = ",".join(f"{k}={v}" for k, v in sorted(p.shape.items()) if k in ("M", "batch", "kv_len"))
        ratio = step / rep if rep else float("nan")
        ok = "n/a" if not rep else ("yes" if abs(ratio - 1) <= 0.05 else "**no**")
        print(f"| {path.relative_to(sys.argv[1]).parts[0]} | {p.workload}/{p.variant} | {shape} | {cap.get('align')} | "
              f"{step:.1f} | {rep:.1f} | {ratio:.3f} | {ok} |" if rep else
              f"| {path.relative_to(sys.argv[1]).parts[0]} | {p.workload}/{p.variant} | {shape} | {cap.get('align')} | "
              f"{step:.1f} | - | - | {ok} ({'eager' if not cap.get('graph') else 'no replay timing'}) |")
    except Exception as exc:  # noqa: BLE001 - one bad bundle must not hide the others
        print(f"| {path.name} | cannot load: {type(exc).__name__}: {str(exc)[:80]} | | | | | | |")
EOF
echo "== profile_vs_replay: exit $? at $(( $(date +%s) - t0 )) s" | tee -a "$S"

find "$R" -name raw -type d -prune -exec rm -rf {} + 2>/dev/null
tar czf "$OUT/bundles.tar.gz" -C "$W" runs
tar czf "$OUT/logs.tar.gz" -C "$W" logs
echo "== done in $(( $(date +%s) - t0 )) s; bundles.tar.gz $(du -h "$OUT/bundles.tar.gz" | cut -f1)" | tee -a "$S"
echo; tail -n 25 "$OUT/validation.md" 2>/dev/null
echo; tail -n 6 "$OUT/advise.md" 2>/dev/null
echo; cat "$OUT/profile_vs_replay.md"
