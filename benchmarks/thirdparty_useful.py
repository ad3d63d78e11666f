"""Useful work on the real third-party traces: per case of the corpus test, the spec the ledger
used, the share of the window that is useful work, and the share of GPU time that got a floor.

    python benchmarks/thirdparty_useful.py [--markdown OUT.md]

Runs the library calls `taxmodel import` / `taxmodel analyze` make on every ledger case of
``tests/trace/test_thirdparty_corpus.py`` (``CASES``), one at a time, on CPU. Written to compare
the corpus before and after a change (``benchmarks/results/thirdparty_corpus.md``): it uses only
``import_bundle`` and ``compute_ledger``, so it runs against older checkouts too (PYTHONPATH).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "trace"))

from test_thirdparty_corpus import CASES, LEDGER  # noqa: E402

from taxmodel.errors import TaxmodelError  # noqa: E402
from taxmodel.ledger.compute import compute_ledger  # noqa: E402
from taxmodel.trace import importers  # noqa: E402


def row(case) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            bundle, _ = importers.import_bundle(case.paths(), Path(tmp) / "b", keep_raw=False, **case.options)
            led = compute_ledger(bundle)
        except TaxmodelError as exc:
            return {"case": case.id, "hardware": "", "useful_pct": float("nan"), "costed_pct": float("nan"),
                    "error": str(exc)[:80]}
    total = float(led.parts.groupby(["repetition", "iteration", "rank"])["ns"].sum().sum())
    useful = float(led.parts.loc[led.parts["subcategory"] == "useful", "ns"].sum())
    k = led.kernels
    gpu = float(k["time_ns"].sum()) if k is not None and len(k) else 0.0
    costed = float(k.loc[k["costed"], "time_ns"].sum()) if gpu else 0.0
    hw = led.hardware
    return {"case": case.id, "hardware": "none" if hw is None else hw.label,
            "useful_pct": useful / total * 100 if total else 0.0, "costed_pct": costed / gpu * 100 if gpu else 0.0,
            "error": ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", help="write the table as Markdown to this file")
    args = ap.parse_args()
    rows = [row(c) for c in CASES if c.expect == LEDGER]
    lines = ["| case | hardware | useful (% of window) | GPU time with a floor (%) |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['hardware'] or r['error']} | {r['useful_pct']:.1f} | {r['costed_pct']:.1f} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
