"""The validation as Markdown: the table ``benchmarks/results/model_validation.md`` holds between
its markers (``taxmodel validate --update-docs`` rewrites it there), deterministic so that a test
can tell when the committed table is stale.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

from taxmodel.errors import InputError
from taxmodel.fsutil import atomic_write
from taxmodel.model.validate import Validation

MARK_START, MARK_END = "<!-- validation:start -->", "<!-- validation:end -->"


def markdown_table(v: Validation) -> str:
    """The validation as Markdown (deterministic: what benchmarks/results/model_validation.md holds between the markers)."""
    lines = []
    if v.table.empty:
        lines.append("No measured bundles to validate against yet.")
    else:
        lines.append("| workload/variant | shape | W | launches | quantity | measured us | predicted us | error | within target | fit |")
        lines.append("|---|---|---:|---|---|---:|---:|---:|---|---|")
        for r in v.table.itertuples(index=False):
            err = f"{r.error_pct:+.1f}%" if math.isfinite(r.error_pct) else "n/a"
            measured = f"{r.measured_us:.1f}" + ("" if r.validated else " (estimated)")
            verdict = ("yes" if r.ok else "**no**") if r.validated else "not a validation"
            lines.append(f"| {r.workload}/{r.variant} | {r.shape} | {r.world_size} | {r.launches} | {r.quantity} | "
                         f"{measured} | {r.predicted_us:.1f} | {err} ({r.error_us:+.1f} us) | "
                         f"{verdict} | {'in-sample' if r.sample == 'in' else 'out-of-sample'} |")
        t = v.validated
        n_ok = int(t["ok"].sum())
        lines.append("")
        lines.append(f"{n_ok} of {len(t)} comparisons within target (latency 15%; each tax 25% or 20 us).")
        lines.append(_tally_parts(t))
        est = v.table[~v.table["validated"]]
        if len(est):
            lines.append(f"{len(est)} locality_tax rows are not counted: their bundles carry no DRAM counters, so the "
                         "'measured' side is the ledger's estimate from the declared intermediates (2 x bytes / HBM "
                         "bandwidth), a formula, not a measurement; the rows are listed with '(estimated)' beside it.")
        for mode, g in t.groupby("launches", sort=True):
            lat = g[g["quantity"] == "latency"]
            lines.append(f"- {mode} launches: {int(g['ok'].sum())} of {len(g)} comparisons, latency {int(lat['ok'].sum())} "
                         f"of {len(lat)}; by workload/variant (latency within target / cases): " + ", ".join(
                             f"{wv} {int(x['ok'].sum())}/{len(x)}" for wv, x in
                             lat.assign(wv=lat["workload"] + "/" + lat["variant"]).groupby("wv", sort=True)))
    lines.append("")
    lines.extend(f"- {n}" for n in v.notes)
    hws = sorted({c.hardware_note for c in v.cases})
    lines.extend(f"- {h}" for h in hws)
    return "\n".join(lines) + "\n"


def _tally_parts(t) -> str:
    """What the tally holds besides out-of-sample checks: in-sample rows (a parameter was fitted on
    their bundle, to make one of its quantities match) and rows where both sides are exactly 0 (a
    tax neither the trace nor the model has, e.g. the launch tax of one kernel in a CUDA graph)."""
    out = t[t["sample"] != "in"]
    zero = t[(t["measured_us"] == 0) & (t["predicted_us"] == 0)]
    return (f"Out of sample (no parameter fitted on their bundle): {int(out['ok'].sum())} of {len(out)}; the other "
            f"{len(t) - len(out)} rows above are of bundles a parameter was fitted on. {len(zero)} of the {len(t)} "
            "compare a measured 0 with a predicted 0 (a tax neither side has).")


def update_docs(doc: str | os.PathLike, v: Validation) -> Path:
    """Replace the text between the validation markers of ``doc`` with the current table."""
    doc = Path(doc)
    text = doc.read_text()
    pat = re.compile(re.escape(MARK_START) + r".*?" + re.escape(MARK_END), re.S)
    if not pat.search(text):
        raise InputError(f"{doc}: no '{MARK_START}' ... '{MARK_END}' markers to put the table between")
    new = pat.sub(lambda _: f"{MARK_START}\n{markdown_table(v)}{MARK_END}", text)
    return atomic_write(doc, new, what="validation table")


def docs_table(doc: str | os.PathLike) -> str:
    """The text between the markers of ``doc`` (what ``update_docs`` last wrote)."""
    text = Path(doc).read_text()
    m = re.search(re.escape(MARK_START) + r"\n(.*?)" + re.escape(MARK_END), text, re.S)
    if not m:
        raise InputError(f"{doc}: no validation markers")
    return m.group(1)
