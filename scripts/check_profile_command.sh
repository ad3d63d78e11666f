#!/usr/bin/env bash
# GPU check of `taxmodel profile -- COMMAND` (issue 40 item 4), on one GPU and, where there are
# two, on two (DDP over NCCL under torchrun):
#   1. the job (benchmarks/train_loop.py, a plain AdamW loop over train_step.py's decoder) traced
#      by `python -m taxmodel profile --skip 5 --steps 5 -o ... -- python train_loop.py`, and the
#      hand-written torch.profiler capture of the same steps (train_loop.py --trace-dir) imported
#      with `taxmodel import`, twice (two runs); benchmarks/compare_command_capture.py compares the
#      hook's ledger with the first part by part (kernels per step identical by name, useful within
#      0.5%, every timed part within max(3 x the combined standard error, 3% of the step, the
#      difference between the two hand-written runs));
#   2. a program that ends before the traced steps: exit 3 and one line, nothing written;
#   3. one GPU: `--counters` (a second run under ncu counting step 6 only; DRAM bytes attached),
#      last (the longest); everything ends within BUDGET_S (540 s) so that the results come back.
# Run from anywhere (it works outside the source tree, as `python -m taxmodel`); results in $OUT:
#   summary.txt env.txt compare_1gpu.md compare_2gpu.md compare.json logs.tar.gz bundles.tar.gz
#
#   OUT=/tmp/o bash scripts/check_profile_command.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-out/check_profile_command}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d)
mkdir -p "$W/b" "$W/t" "$W/logs"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$W" || exit 2
TRAIN="$REPO/benchmarks/train_loop.py"
COMPARE="$REPO/benchmarks/compare_command_capture.py"
JOB=(--loop 20 --layers 4 --hidden 1024 --seq 512 --batch 4)
SKIP=5
STEPS=5
HW=${HW:-}  # a hardware key for the ledgers; empty: each bundle's own GPU
BUDGET_S=${BUDGET_S:-540}  # every step ends by then, so that the results are always written
RUNS=${RUNS:-3}            # hook and hand-written runs per GPU count, alternated
PARTS=${PARTS:-1gpu 2gpu counters}  # which parts run ("counters": the early-end check and --counters)
S="$OUT/summary.txt"
: >"$S"
t0=$(date +%s)
status=0

step() {  # step NAME LIMIT EXPECTED_EXIT CMD...: output to logs/NAME.log, a status line to the summary
  local name=$1 limit=$2 want=$3; shift 3
  local a left
  a=$(date +%s)
  left=$(( t0 + BUDGET_S - a ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then echo "== $name: skipped, out of time" | tee -a "$S"; status=1; return; fi
  timeout -k 10 "$limit" "$@" >"$W/logs/$name.log" 2>&1
  local rc=$?
  local verdict=ok
  [ "$rc" -eq "$want" ] || { verdict="UNEXPECTED (wanted exit $want)"; status=1; }
  echo "== $name: exit $rc $verdict in $(( $(date +%s) - a )) s (t=$(( $(date +%s) - t0 )) s): $*" | tee -a "$S"
  grep -E "^taxmodel|^wrote|^--counters|^train_loop|^\*|Error|Traceback|PASS|FAIL" "$W/logs/$name.log" | grep -v USDT \
    | tail -n 12 | sed 's/^/   /' | tee -a "$S"
}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import torch, taxmodel; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), 'taxmodel', taxmodel.__version__, taxmodel.__file__)"
  /usr/local/cuda/bin/ncu --version 2>/dev/null | tail -n 1 || ncu --version | tail -n 1
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")

check_pair() {  # check_pair TAG NPROC: RUNS hook and hand-written captures, alternated; imports; compare
  local tag=$1 n=$2 i
  local launch=(python)
  [ "$n" -gt 1 ] && launch=(python -m torch.distributed.run --standalone --nproc-per-node "$n")
  local hooks=() hands=()
  for i in $(seq 1 "$RUNS"); do
    step "hook${i}_$tag" 300 0 python -m taxmodel profile --skip $SKIP --steps $STEPS -o "$W/b/hook${i}_$tag" -- \
      "${launch[@]}" "$TRAIN" "${JOB[@]}"
    step "hand${i}_$tag" 300 0 "${launch[@]}" "$TRAIN" "${JOB[@]}" --trace-dir "$W/t/hand${i}_$tag" --trace-skip $SKIP \
      --trace-steps $STEPS
    step "import${i}_$tag" 120 0 python -m taxmodel import "$W"/t/hand${i}_"$tag"/rank*.json.gz -o "$W/b/hand${i}_$tag"
    [ -d "$W/b/hook${i}_$tag" ] && hooks+=("$W/b/hook${i}_$tag")
    [ -d "$W/b/hand${i}_$tag" ] && hands+=("$W/b/hand${i}_$tag")
  done
  if [ ${#hooks[@]} -eq 0 ] || [ ${#hands[@]} -eq 0 ]; then
    echo "== compare_$tag: nothing to compare" | tee -a "$S"; status=1; return
  fi
  step "compare_$tag" 120 0 python "$COMPARE" --hook "${hooks[@]}" --hand "${hands[@]}" \
    ${HW:+--hardware "$HW"} --markdown "$OUT/compare_$tag.md" --json "$W/compare_$tag.json"
  cat "$OUT/compare_$tag.md" >>"$S" 2>/dev/null
}

case " $PARTS " in *" 1gpu "*) check_pair 1gpu 1 ;; esac
case " $PARTS " in *" 2gpu "*)
  if [ "$GPUS" -ge 2 ]; then check_pair 2gpu 2; else echo "== 2gpu: skipped, $GPUS GPU(s) here" | tee -a "$S"; fi ;;
esac
if [[ " $PARTS " == *" counters "* ]]; then
step ends_early 120 3 python -m taxmodel profile --skip 50 --steps $STEPS -o "$W/b/never" -- python "$TRAIN" "${JOB[@]}"
[ -e "$W/b/never" ] && { echo "   UNEXPECTED: $W/b/never was written" | tee -a "$S"; status=1; }
step counters_1gpu 400 0 python -m taxmodel profile --counters --skip $SKIP --steps $STEPS -o "$W/b/counters_1gpu" -- \
  python "$TRAIN" "${JOB[@]}"
if ! grep -q "^--counters: DRAM counters" "$W/logs/counters_1gpu.log"; then  # does ncu need the program to end by itself?
  step counters_1gpu_to_end 400 0 python -m taxmodel profile --counters --run-to-end --force --skip $SKIP --steps $STEPS \
    -o "$W/b/counters_1gpu" -- python "$TRAIN" "${JOB[@]}"
fi
step counters_meta 30 0 python -c "
import json, sys
m = json.load(open('$W/b/counters_1gpu/meta.json')).get('counters') or {}
print('counters:', json.dumps({k: m.get(k) for k in ('match', 'kernels_with_counters', 'counter_rows', 'counted_step', 'pass_wall_s')}))
sys.exit(0 if m.get('kernels_with_counters', 0) > 0 else 1)"
step analyze_counters 60 0 python -m taxmodel analyze "$W/b/counters_1gpu" ${HW:+--hardware "$HW"}
fi

python - "$W" "$OUT/compare.json" <<'EOF'
import json, sys
from pathlib import Path
w, out = Path(sys.argv[1]), Path(sys.argv[2])
out.write_text(json.dumps({p.stem: json.loads(p.read_text()) for p in sorted(w.glob("compare_*.json"))}, indent=1) + "\n")
EOF
tar -C "$W" -czf "$OUT/logs.tar.gz" logs
tar -C "$W" --exclude=raw -czf "$OUT/bundles.tar.gz" b
echo "== overall: $([ $status -eq 0 ] && echo PASS || echo FAIL) in $(( $(date +%s) - t0 )) s" | tee -a "$S"
rm -rf "$W"
exit $status
