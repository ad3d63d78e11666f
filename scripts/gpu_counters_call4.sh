#!/usr/bin/env bash
# Fourth H200 call: the .ncu-rep path of taxmodel.trace.ncu through Nsight Compute's own Python module
# (ncu_report), against the CSV export of the same report. Results under $OUT.
set -uo pipefail
OUT=${OUT:-out/call4}
mkdir -p "$OUT"
W=$(mktemp -d)
METRICS=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum
ncu --cache-control none --clock-control none --profile-from-start off --metrics "$METRICS" -o "$W/loc" \
  python benchmarks/bench_locality.py --mode ncu --sizes 8m,64m >"$OUT/ncu.log" 2>&1
echo "ncu -o: exit $?" | tee "$OUT/summary.txt"
ncu --import "$W/loc.ncu-rep" --csv >"$OUT/loc_from_rep.csv" 2>>"$OUT/ncu.log"
echo "ncu --import --csv: exit $?" | tee -a "$OUT/summary.txt"
cp "$W/loc.ncu-rep" "$OUT/" 2>/dev/null
EXTRAS=$(dirname "$(find / -name ncu_report.py -path '*extras/python*' 2>/dev/null | head -n 1)")
echo "ncu_report at: $EXTRAS" | tee -a "$OUT/summary.txt"
PYTHONPATH="$EXTRAS" python - "$W/loc.ncu-rep" "$OUT/loc_from_rep.csv" <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import sys
import pandas as pd
from taxmodel.trace.ncu import read_counters
rep, csv = read_counters(sys.argv[1]), read_counters(sys.argv[2])
cols = ["name", "dram_read_bytes", "dram_write_bytes", "l2_hit_pct", "duration_ns"]
print(rep[cols].to_string())
print(csv[cols].to_string())
same = (rep[cols[1:3]].to_numpy() == csv[cols[1:3]].to_numpy()).all() and list(rep["name"]) == list(csv["name"])
print("rep == csv (names, DRAM bytes):", same)
PY
ls -la "$OUT"
