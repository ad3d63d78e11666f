#!/usr/bin/env bash
# GPU check of `taxmodel profile --graph`: fine-grained variants profiled as CUDA-graph replays
# (one cudaGraphLaunch per iteration), then the ledger of every bundle. About 3 minutes on 4 H200s.
#
#   OUT=out bash scripts/gpu_profile_graph.sh         # from the repo root; results under $OUT/graph/
#   DEV=cpu WORLD=2 FD_PRESETS=tiny AG_PRESETS=tiny EAGER=0 OUT=/tmp/o bash scripts/gpu_profile_graph.sh   # CPU dry run
#
# Writes $OUT/graph/: bundles.tar.gz (every bundle), logs/, analyze_*.txt (`taxmodel analyze`),
# table.md (one row per bundle: launch mode, window, launch tax, graph ids seen) and summary.txt.
# Each profile call has its own timeout; a failing one is logged and the rest still run.
# EAGER=1 (default) also profiles flash_decode eagerly at the same presets, for comparison;
# INSTRUMENT=1 (default) adds --instrument to both flash_decode runs (in-kernel records of the fused
# kernel, which under a graph share one buffer per repetition and are placed by time).
set -uo pipefail
OUT=${OUT:-out}
G="$OUT/graph"
DEV=${DEV:-cuda}
WORLD=${WORLD:-4}
FD_PRESETS=${FD_PRESETS:-b1-kv1k,b16-kv1k}
AG_PRESETS=${AG_PRESETS:-m1024,m8192}
REPEAT=${REPEAT:-3}
EAGER=${EAGER:-1}
INSTRUMENT=${INSTRUMENT:-1}
FD_EXTRA=""
[ "$INSTRUMENT" = 1 ] && FD_EXTRA="--instrument"
mkdir -p "$G/logs"
R=$(mktemp -d)/runs
mkdir -p "$R"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg
: >"$G/summary.txt"
t0=$(date +%s)

run() {  # run NAME TIMEOUT CMD...: output to logs/NAME.log, a few lines to summary.txt
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$G/summary.txt"
  timeout -k 10 "$limit" "$@" >"$G/logs/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$G/summary.txt"
  tr '\r' '\n' <"$G/logs/$name.log" | grep -E "bundle\(s\)|rror|skipped|--graph|Traceback" | grep -v USDT | tail -n 8 \
    | sed 's/^/   /' | tee -a "$G/summary.txt"
}

P="taxmodel profile --device $DEV -n $WORLD --repeat $REPEAT --timeout 150"
run fd_graph 170 $P flash_decode --preset "$FD_PRESETS" --graph $FD_EXTRA -o "$R/graph"
for preset in ${AG_PRESETS//,/ }; do  # one start-up per size: a failing size cannot take the other with it
  run "ag_${preset}_graph" 170 $P ag_gemm --preset "$preset" --variants bsp,pull,push --graph -o "$R/graph"
done
if [ "$EAGER" = 1 ]; then
  run fd_eager 120 $P flash_decode --preset "$FD_PRESETS" $FD_EXTRA -o "$R/eager"
fi

for wl in "$R"/graph/* "$R"/eager/*; do
  [ -d "$wl" ] || continue
  name="analyze_$(basename "$(dirname "$wl")")_$(basename "$wl")"
  timeout 120 taxmodel analyze "$wl" --lenient >"$G/$name.txt" 2>&1
  echo "== $name: exit $?" >>"$G/summary.txt"
done
first=$(find "$R/graph" -name meta.json -print -quit 2>/dev/null)
[ -n "$first" ] && taxmodel show "$(dirname "$first")" --top 5 >"$G/show_example.txt" 2>&1

# One row per bundle: how it was launched and what the ledger makes of it.
timeout 180 python - "$R" >"$G/table.md" 2>"$G/logs/table.err" <<'EOF'
import sys
from pathlib import Path

from taxmodel.ledger.compute import compute_ledger
from taxmodel.trace.bundle import load_bundle

print("| run | bundle | launches | graph note | GPU rows/iter | launch calls/iter | rows with graph id | window us | launch_tax us | bsp_tax us | records |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for meta in sorted(Path(sys.argv[1]).rglob("meta.json")):
    path = meta.parent
    try:
        b = load_bundle(path)
        cap, ev = b.meta.get("capture", {}), b.events
        inside = ev[ev["iteration"] >= 0]
        n = max(inside.groupby(["repetition", "iteration", "rank"]).ngroups, 1)
        gpu = inside[inside["kind"].isin(["kernel", "memcpy", "memset"])]
        row = [path.parents[1].name, f"{path.parent.name}/{path.name}", "graph" if cap.get("graph") else "eager",
               (cap.get("graph_note") or "")[:60], f"{len(gpu) / n:.1f}", f"{(inside['kind'] == 'launch').sum() / n:.1f}",
               f"{(gpu['graph_id'] >= 0).mean() * 100:.0f}%" if len(gpu) else "-"]
        try:
            led = compute_ledger(b, lenient=True)
            cat = led.category_summary()["mean_ns"]
            window = float(led.windows["window_ns"].mean())
            row += [f"{window / 1e3:.1f}", f"{cat.get('launch_tax', 0) / 1e3:.1f}", f"{cat.get('bsp_tax', 0) / 1e3:.1f}"]
        except Exception as exc:  # noqa: BLE001 - one bad bundle must not hide the others
            row += [f"ledger failed: {type(exc).__name__}: {str(exc)[:80]}", "", ""]
        rec = b.meta.get("records")
        row.append(f"{rec['records']} (unplaced {rec.get('unplaced', 0)})" if rec else "-")
    except Exception as exc:  # noqa: BLE001
        row = [path.parents[1].name, path.name, f"cannot load: {type(exc).__name__}: {str(exc)[:80]}"] + [""] * 8
    print("| " + " | ".join(row) + " |")
EOF
echo "== table: exit $?" >>"$G/summary.txt"

size=$(du -sm "$R" | cut -f1)
if [ "$size" -gt 60 ]; then  # the events are in each bundle; raw traces only if they fit
  find "$R" -name raw -type d -prune -exec rm -rf {} +
  echo "raw traces dropped (${size} MB)" >>"$G/summary.txt"
fi
tar czf "$G/bundles.tar.gz" -C "$(dirname "$R")" runs
echo "== done in $(( $(date +%s) - t0 )) s; bundles.tar.gz $(du -h "$G/bundles.tar.gz" | cut -f1)" >>"$G/summary.txt"

echo
cat "$G/summary.txt"
echo
cat "$G/table.md"
for f in "$G"/analyze_*.txt; do
  [ -f "$f" ] || continue
  echo; echo "### $(basename "$f")"
  grep -E "^== |^\* |launch modes differ|Launch|Total|caveat|skipped" "$f" | head -n 40
done
