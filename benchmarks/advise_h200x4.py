"""The advisor against what fine-grained kernels measured: per bulk-synchronous AG+GEMM and GEMM+RS
bundle captured on 4x H200, the advisor's predicted saving for its collective+GEMM candidate
(``taxmodel advise``: the analytic model's bsp minus its best fine-grained variant, at the bundle's
shape, world size and launch settings) against the measured saving of the best of the same
candidate variants (AG+GEMM pull and push, GEMM+RS fused; not PyTorch's torch_fused, which the
advisor does not price) captured at the same shape in the same folder (bsp window minus that
variant's window, means over repetitions and iterations). The bound (the taxes on the pair's boundaries) is listed beside them.

    python benchmarks/advise_h200x4.py [--markdown benchmarks/results/advise_h200x4.md]
    python benchmarks/advise_h200x4.py --root RUNS --hardware calibration.json   # another machine's capture

Folders: ``profiles/h200x4-graph-gate`` (CUDA graphs, ranks released by a device gate; AG+GEMM and
GEMM+RS) and ``profiles/h200x4-graph`` (CUDA graphs, host barrier; AG+GEMM). Eager captures are
left out: their fine-grained AG+GEMM steps are host-bound under the profiler (profiles/README.md).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from taxmodel.api import Profile
from taxmodel.model import advise_predict
from taxmodel.model.advise import Inputs, advise
from taxmodel.trace.bundle import find_bundles

ROOT = Path(__file__).resolve().parents[1]
SETS = (("h200x4-graph-gate", "ag_gemm"), ("h200x4-graph-gate", "gemm_rs"), ("h200x4-graph", "ag_gemm"))
PAIR_KIND = {"ag_gemm": "AG+GEMM", "gemm_rs": "GEMM+RS"}
TOLERANCE = 0.25


def _shape_key(p: Profile) -> tuple:
    return tuple(sorted(p.shape.items()))


def compare_folder(folder: Path, workload: str, hardware: str | None = None, strict: bool = True) -> list[dict]:
    """One row per bsp bundle of ``workload`` under ``folder`` that has fine-grained bundles of its shape
    (``hardware``: a name or calibrated file the predictions use instead of the bundles' own GPU's spec;
    ``strict`` False: a bsp bundle the advisor finds no candidate in is left out with a line on stderr)."""
    profiles = [Profile.from_path(b) for b in find_bundles(folder / workload)]
    candidates = advise_predict.WORKLOAD_OF_KIND[PAIR_KIND[workload]][1]  # the variants the advisor predicts
    rows = []
    for bsp in (p for p in profiles if p.variant == "bsp"):
        # measured against the same candidates (not torch_fused: PyTorch's op, eager, not the rewrite
        # the advisor prices)
        fine = [p for p in profiles if p.variant in candidates and _shape_key(p) == _shape_key(bsp)]
        if not fine:
            continue
        best = min(fine, key=lambda p: p.window_ns)
        table = advise(Inputs(bsp.bundle, bsp.analysis), top=None, hardware=hardware)
        pair = table[table["kind"] == PAIR_KIND[workload]]
        if len(pair) != 1 and not strict:
            print(f"left out {bsp.path}: the advisor found {len(pair)} {PAIR_KIND[workload]} candidates", file=sys.stderr)
            continue
        if len(pair) != 1:
            raise RuntimeError(f"{bsp.path}: expected one {PAIR_KIND[workload]} candidate, the advisor found {len(pair)}")
        r = pair.iloc[0]
        kind, variants = advise_predict.WORKLOAD_OF_KIND[PAIR_KIND[workload]]
        shape = {k: int(v) for k, v in bsp.shape.items()}
        fitted = advise_predict.predict_fusion(kind, variants, shape, bsp.world_size, bsp.meta, hardware)
        plain = advise_predict.predict_fusion(kind, variants, shape, bsp.world_size, bsp.meta, hardware, use_fitted=False)
        modeled = next(p for p in fine if f"{kind}/{p.variant}" == fitted.model)
        measured = (bsp.window_ns - best.window_ns) / 1e3
        rows.append({
            "folder": folder.name, "workload": workload,
            "shape": " ".join(f"{k}={v}" for k, v in sorted(bsp.shape.items()) if k != "tp"),
            "bsp_us": bsp.window_ns / 1e3, "best_variant": best.variant, "best_us": best.window_ns / 1e3,
            "measured_saving_us": measured, "bound_us": float(r["bound_us"]),
            "predicted_saving_us": float(r["predicted_saving_us"]), "model": str(r["model"]),
            "range_lo_us": float(r["predicted_saving_lo_us"]), "range_hi_us": float(r["predicted_saving_hi_us"]),
            "predicted_defaults_us": plain.saving_us,
            "model_bsp_error_pct": 100.0 * (fitted.bsp_us * 1e3 / bsp.window_ns - 1.0),
            "model_fused_error_pct": 100.0 * (fitted.fused_us * 1e3 / modeled.window_ns - 1.0),
            "within_25pct": bool(abs(r["predicted_saving_us"] - measured) <= TOLERANCE * abs(measured)),
            "in_range": (None if math.isnan(r["predicted_saving_lo_us"]) else
                         bool(r["predicted_saving_lo_us"] <= measured <= r["predicted_saving_hi_us"])),
            "bound_covers": bool(r["bound_us"] >= measured),
        })
    return rows


def comparison(root: Path = ROOT / "profiles", sets: tuple[tuple[str, str], ...] = SETS,
               hardware: str | None = None, strict: bool = True) -> pd.DataFrame:
    return pd.DataFrame([row for folder, wl in sets for row in compare_folder(root / folder, wl, hardware, strict)])


def markdown(t: pd.DataFrame) -> str:
    if t.empty:
        return "No AG+GEMM or GEMM+RS pair (bsp and a fine-grained variant at one shape) among these bundles.\n"
    lines = ["| folder | workload | shape | bsp us | best fine-grained (us) | measured saving us | bound us | "
             "predicted saving us (model variant) | within 25% | the model's range us | measured in it | "
             "predicted, defaults only | model error bsp / fused |",
             "|---|---|---|---:|---|---:|---:|---|---|---|---|---:|---:|"]
    for r in t.itertuples(index=False):
        lines.append(f"| {r.folder} | {r.workload} | {r.shape} | {r.bsp_us:.1f} | {r.best_variant} ({r.best_us:.1f}) | "
                     f"{r.measured_saving_us:.1f} | {r.bound_us:.1f} | {r.predicted_saving_us:.1f} ({r.model}) | "
                     f"{'yes' if r.within_25pct else 'no'} | {_range(r.range_lo_us, r.range_hi_us)} | "
                     f"{'n/a' if r.in_range is None else 'yes' if r.in_range else 'no'} | {_num(r.predicted_defaults_us)} | "
                     f"{r.model_bsp_error_pct:+.1f}% / {r.model_fused_error_pct:+.1f}% |")
    n = int(t["within_25pct"].sum())
    spans = int(((t["range_lo_us"] < 0) & (t["range_hi_us"] > 0)).sum())
    ranged = t[t["in_range"].notna()]
    open_sign = (t["range_lo_us"] < 0) & (t["range_hi_us"] > 0)
    either = int((t["within_25pct"].astype(bool) | open_sign).sum())
    lines += ["", f"{n} of {len(t)} pairs within 25%; {either} of {len(t)} within 25% or with the sign said to be open "
              "(the range spans 0);", f"the measured saving lies in the model's range in "
              f"{int(ranged['in_range'].astype(bool).sum())} of the {len(ranged)} pairs with one (the range spans 0 in "
              f"{spans}); the bound covers the measured saving in {int(t['bound_covers'].sum())} of {len(t)}."]
    return "\n".join(lines) + "\n"


def _range(lo: float, hi: float) -> str:
    return "none recorded" if math.isnan(lo) or math.isnan(hi) else f"{lo:.1f} to {hi:.1f}"


def _num(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", default=None, help="write the table (between markers) into this Markdown file")
    ap.add_argument("--root", default=None, help="a capture's folder (WORKLOAD/VARIANT-SHAPE bundles under it) instead of "
                                                 "the committed 4x H200 folders")
    ap.add_argument("--hardware", default=None, help="hardware name or calibrated file for the predictions")
    args = ap.parse_args()
    if args.root:
        root = Path(args.root)
        t = comparison(root.parent, tuple((root.name, wl) for wl in PAIR_KIND if (root / wl).is_dir()), args.hardware,
                       strict=False)
    else:
        t = comparison(hardware=args.hardware)
    text = markdown(t)
    print(text, end="")
    if args.markdown:
        replace_table(Path(args.markdown), text)


MARK_START, MARK_END = "<!-- advise-table:start -->", "<!-- advise-table:end -->"


def replace_table(doc: Path, text: str) -> None:
    """Put ``text`` between the markers of ``doc`` (the rest of the page is prose)."""
    page = doc.read_text()
    head, rest = page.split(MARK_START, 1)
    _, tail = rest.split(MARK_END, 1)
    doc.write_text(f"{head}{MARK_START}\n{text}{MARK_END}{tail}")


def table_in(doc: Path) -> str:
    """The text between the markers of ``doc``."""
    return doc.read_text().split(MARK_START, 1)[1].split(MARK_END, 1)[0].lstrip("\n")


if __name__ == "__main__":
    main()
