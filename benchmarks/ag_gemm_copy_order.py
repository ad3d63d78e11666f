"""Which of the fused AG+GEMM's two kernels reached the SMs first, and what it cost the GEMM: per
committed pull/push bundle with the Triton copy kernel (the ``sm`` transport), every (repetition,
iteration, rank) split by whether ``copy_blocks_kernel`` started before ``ag_gemm_kernel``; medians of
both kernels' durations and of the GEMM's end after the copy's end (``tail``) in each group; and the
step as the ledger measures it (the mean window) beside the mean over steps of the slowest rank's
GEMM (``E[max]``) and the mean GEMM over every rank (``mean``).

    python benchmarks/ag_gemm_copy_order.py [--markdown benchmarks/results/ag_gemm_copy_order.md]

The model's reading (``taxmodel/model/analytic/ag_gemm.py``, ``copy_first_share``): a copy program
placed first holds its SM and the GEMM's last programs start when the copy ends (GEMM = copy + its
own work: the tail); placed after the GEMM's, the copy shares SMs with it; the window is the
slowest rank's GEMM.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

import taxmodel
from taxmodel.kernels.names import AG_GEMM_KERNEL, COPY_BLOCKS_KERNEL

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("benchmarks/results/h200x2-model-check/default", "benchmarks/results/h200x2-model-check/align-device",
           "benchmarks/results/h200x2-model-check/align-host", "benchmarks/results/h200x2-model-check-run2/runs/default",
           "benchmarks/results/h100x4-model-check/default", "benchmarks/results/h100x4-model-check/align-device",
           "benchmarks/results/h100x4-model-check/align-host", "benchmarks/results/h200x4-graph-gate-rerun",
           "profiles/h200x2-graph-gate", "profiles/h200x4-graph-gate", "profiles/h200x4-graph",
           "profiles/h200x8-graph-gate")
BEGIN, END = "<!-- copy-order:begin -->", "<!-- copy-order:end -->"


def bundle_row(path: Path) -> dict | None:
    meta = json.loads((path / "meta.json").read_text())
    ev = pd.read_parquet(path / "events.parquet")
    k = ev[(ev.kind == "kernel") & (ev.iteration >= 0)]
    gemm, copy = k[k.name == AG_GEMM_KERNEL], k[k.name == COPY_BLOCKS_KERNEL]
    if gemm.empty or copy.empty:
        return None
    keys = ["repetition", "iteration", "rank"]
    both = gemm.merge(copy, on=keys, suffixes=("_g", "_c"))
    both["gd"] = (both.end_ns_g - both.start_ns_g) / 1e3
    both["cd"] = (both.end_ns_c - both.start_ns_c) / 1e3
    both["after"] = (both.end_ns_g - both.end_ns_c) / 1e3
    first = both.start_ns_c < both.start_ns_g
    cf, gf = both[first], both[~first]
    step = both.groupby(["repetition", "iteration"]).gd
    window = taxmodel.load(str(path)).window_ns / 1e3
    med = lambda s: f"{s.median():.1f}" if len(s) else "-"  # noqa: E731
    return {"bundle": f"{path.parent.parent.relative_to(ROOT)}/{path.name}", "W": meta["world_size"],
            "align": (meta.get("capture") or {}).get("align") or "host",
            "copy first": f"{len(cf)}/{len(both)}", "GEMM (copy first)": med(cf.gd), "GEMM (GEMM first)": med(gf.gd),
            "copy (copy first)": med(cf.cd), "copy (GEMM first)": med(gf.cd), "tail (copy first)": med(cf["after"]),
            "window": f"{window:.1f}", "E[max]": f"{step.max().mean():.1f}", "mean": f"{both.gd.mean():.1f}"}


def table() -> pd.DataFrame:
    rows = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder / "ag_gemm").glob("p*-M*")):
            if path.name.split("-")[0] in ("pull", "push") and (path / "events.parquet").is_file():
                r = bundle_row(path)
                if r:
                    rows.append(r)
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" if c in ("bundle", "align") else "---:" for c in cols) + "|"]
    out += ["| " + " | ".join(str(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", help="write the table between the copy-order markers of this file")
    args = ap.parse_args(argv)
    text = markdown(table())
    if args.markdown:
        doc = Path(args.markdown).read_text()
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        Path(args.markdown).write_text(f"{head}{BEGIN}\n{text}{END}{tail}")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
