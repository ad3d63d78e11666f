"""Fingerprint of every committed profile's ledger and of the model's validation table, to show
that a change moved nothing it should not have (`python scripts/ledger_fingerprint.py -o a.json`
before, `-o b.json` after, then `--diff a.json b.json`).

Per bundle: each ledger sub-category summed over every (repetition, iteration, rank), in integer
ns, and the ledger's caveats; per validation row: measured and predicted us. Exact integers, so
any move shows.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def fingerprint(root: Path) -> dict:
    from taxmodel.model import validate as val
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.trace.bundle import load_bundle

    ledgers = {}
    for meta in sorted(root.glob("**/meta.json")):
        path = meta.parent
        try:
            led = compute_ledger(load_bundle(path), lenient=True)
        except Exception as exc:  # noqa: BLE001 - a bundle that fails is part of the fingerprint
            ledgers[str(path.relative_to(root))] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        sums = led.parts.groupby("subcategory")["ns"].sum()
        ledgers[str(path.relative_to(root))] = {"parts_ns": {k: int(v) for k, v in sorted(sums.items())},
                                                "caveats": sorted(led.caveats)}
    v = val.validate(root)
    table = [{"case": f"{r.workload}/{r.variant} {r.shape} W={r.world_size} {r.launches}", "quantity": r.quantity,
              "measured_us": round(float(r.measured_us), 3), "predicted_us": round(float(r.predicted_us), 3)}
             for r in v.table.itertuples(index=False)]
    return {"ledgers": ledgers, "validation": table}


def diff(a: dict, b: dict) -> int:
    moved = 0
    for key in sorted(set(a["ledgers"]) | set(b["ledgers"])):
        x, y = a["ledgers"].get(key), b["ledgers"].get(key)
        if x != y:
            moved += 1
            print(f"ledger {key}:\n  before {x}\n  after  {y}")
    rows_a = {(r["case"], r["quantity"]): r for r in a["validation"]}
    rows_b = {(r["case"], r["quantity"]): r for r in b["validation"]}
    for key in sorted(set(rows_a) | set(rows_b)):
        if rows_a.get(key) != rows_b.get(key):
            moved += 1
            print(f"validation {key}: before {rows_a.get(key)} after {rows_b.get(key)}")
    print(f"{len(a['ledgers'])} / {len(b['ledgers'])} ledgers, {len(rows_a)} / {len(rows_b)} validation rows: "
          f"{moved} differ")
    return 1 if moved else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profiles", default="profiles", type=Path)
    p.add_argument("-o", "--output", type=Path)
    p.add_argument("--diff", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = p.parse_args()
    if args.diff:
        return diff(*(json.loads(f.read_text()) for f in args.diff))
    doc = fingerprint(args.profiles)
    text = json.dumps(doc, indent=1, sort_keys=True)
    if args.output:
        args.output.write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
