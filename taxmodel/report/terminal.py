"""What `taxmodel analyze` prints: per bundle the mean ledger (every category and sub-part in us
and % of the iteration window), how the clocks were aligned and which hardware numbers were
used, the caveats and what was skipped; then, for bundles of the same workload and shape, the
variants side by side with ``bsp`` as reference and the headline of what each one saves.

Tables come from ``taxmodel.report.headline`` so that the terminal, HTML and Markdown reports
show the same numbers.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import pandas as pd

from taxmodel.ledger.categories import LABELS
from taxmodel.ledger.coverage import missing_ranks
from taxmodel.report import compare, headline
from taxmodel.report.kernels import top_kernel_lines
from taxmodel.trace.capture_meta import unprofiled_step_ns
from taxmodel.trace.summary import launch_mode


#: how a ledger's locality tax was obtained, as the terminal says it (docs/ledger.md 5b)
_LOCALITY_SOURCE = {"measured": "measured (DRAM counters)", "estimated": "estimated (declared intermediates)",
                    "not measured": "not measured (n/m: attach DRAM counters, see docs/counters.md)",
                    "predicted": "predicted (the analytic model's DRAM bytes)"}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "n/m" if math.isnan(v) else f"{v:,.1f}"  # not measured (e.g. locality without counters)
    return str(v)


#: what a terminal table may take; wider tables leave their last columns to ``--wide`` (and ``--json``)
TERMINAL_WIDTH = 120


def _text_table(df: pd.DataFrame, max_width: int | None = None) -> str:
    """``df`` as aligned text. With ``max_width``, the last columns that do not fit are left out
    and a line after the table says how many and where they are."""
    cols = list(df.columns)
    cells = [[_fmt(v) for v in row] for row in df.itertuples(index=False)]
    widths = [max(len(str(c)), *(len(r[i]) for r in cells)) if cells else len(str(c)) for i, c in enumerate(cols)]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in cols]
    shown = len(cols)
    while max_width is not None and shown > 1 and sum(widths[:shown]) + 2 * (shown - 1) > max_width:
        shown -= 1

    def line(vals):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals[:shown], widths, numeric)).rstrip()

    out = [line([str(c) for c in cols]), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    if shown < len(cols):
        out.append(f"(left out to fit {max_width} characters: {', '.join(map(str, cols[shown:]))}; see --wide)")
    return "\n".join(out)


def render_ledger(ledger, per_rank: bool = False, wide: bool = False) -> str:
    """One bundle: header, the mean ledger table, clock and hardware, caveats, skipped."""
    w = ledger.windows
    n_iter = len(w)
    missing = missing_ranks(ledger.meta or {}, ledger.ranks)
    of = f" of {len(ledger.ranks) + len(missing)} (skew unknowable, see caveats)" if missing else ""
    head = (f"== {ledger.label}: {n_iter} iteration window(s) x {len(ledger.ranks)} rank(s){of}; "
            f"mean window {compare.mean_window_ns(ledger) / 1e3:,.1f} us "
            f"(min {w['window_ns'].min() / 1e3:,.1f}, max {w['window_ns'].max() / 1e3:,.1f})")
    launches = launch_mode(ledger.meta or {})
    if launches:
        head += f"; launches: {launches}"
    width = None if wide else TERMINAL_WIDTH
    lines = [head]
    unprofiled = unprofiled_step_line(ledger)
    if unprofiled:
        lines.append(unprofiled)
    lines.append(_text_table(headline.ledger_table(ledger), width))
    if per_rank:  # one row per part, one column per rank: as many columns as ranks, not as parts
        pr = (ledger.per_rank() / 1e3).T
        table = pd.DataFrame({"part": [LABELS[s] for s in pr.index],
                              **{f"rank {r}": pr[r].to_numpy() for r in pr.columns}})
        lines += ["", "per rank (mean us per iteration):", _text_table(table, width)]
    kernel_lines = top_kernel_lines(getattr(ledger, "kernels", None), n_iter * max(len(ledger.ranks), 1))
    if kernel_lines:
        lines += [""] + kernel_lines
    hw = ledger.hardware
    hw_text = "none" if hw is None else hw.shown
    c = ledger.clock
    lines.append("")
    lines.append(f"hardware: {hw_text}; clock alignment: {c.method}, uncertainty {c.uncertainty_ns / 1e3:.1f} us; "
                 f"locality: {_LOCALITY_SOURCE.get(ledger.locality, ledger.locality)}")
    if ledger.caveats:
        lines.append("caveats:")
        lines.extend(f"  - {x}" for x in ledger.caveats)
    if ledger.skipped:
        lines.append("skipped:")
        lines.extend(f"  - {x}" for x in ledger.skipped)
    return "\n".join(lines)


#: How far a traced step may be from the same step un-profiled before the line says which way.
UNPROFILED_TOLERANCE = 0.05


def unprofiled_step_line(ledger) -> str:
    """The same step with nothing traced, beside the traced window (``capture_meta.unprofiled_step_ns``),
    and what a difference over ``UNPROFILED_TOLERANCE`` means; "" where the bundle has none."""
    ref = unprofiled_step_ns(ledger.meta or {})
    window = compare.mean_window_ns(ledger)
    if not ref or not window:
        return ""
    ratio = window / ref
    line = (f"un-profiled, the same step took {ref / 1e3:,.1f} us as a benchmark runs it "
            f"(traced / un-profiled {ratio:.3f})")
    if ratio > 1 + UNPROFILED_TOLERANCE:
        line += ": the tracer lengthened the traced steps (its cost at kernel boundaries shows in short steps)"
    elif ratio < 1 - UNPROFILED_TOLERANCE:
        line += ": the traced steps ran faster than the same steps un-profiled (a GPU slowed by a longer run?)"
    return line


def render_analysis(ledgers: Sequence, per_rank: bool = False, wide: bool = False) -> str:
    """Every ledger, then side-by-side comparisons of variants at the same (workload, shape):
    the reference's column and each variant's difference from it first, each variant's own
    column after them (left out where ``TERMINAL_WIDTH`` ends, unless ``wide``)."""
    blocks = [render_ledger(led, per_rank, wide) for led in ledgers]
    for (workload, shape), group in compare.group_by_shape(ledgers).items():
        if len(group) < 2:
            continue
        ident = compare.identity(group[0])
        ref = compare.reference_of(group)
        title = f"== {ident.workload} at {ident.shape_label}: variants side by side (us per iteration"
        title += f", reference {compare.REFERENCE_VARIANT})" if ref is not None else "; no bsp bundle to compare against)"
        modes = [(led.meta.get("variant"), launch_mode(led.meta or {})) for led in group]
        if len({m for _, m in modes if m}) > 1:
            title += ("\n   launch modes differ (" + ", ".join(f"{v}: {m or 'unknown'}" for v, m in modes)
                      + "): launch_tax is not comparable between them")
        table = headline.comparison_table(group)
        own = [c for c in table.columns[3:] if "−" not in c]  # after category, part and the reference
        table = table[[c for c in table.columns if c not in own] + own]
        blocks.append(title + "\n" + _text_table(table, None if wide else TERMINAL_WIDTH))
    sentences = headline.headlines(ledgers)
    if sentences:
        blocks.append("\n".join(f"* {s}" for s in sentences))
    return "\n\n".join(blocks) + "\n"


def analysis_document(ledgers: Sequence) -> dict[str, Any]:
    """The machine-readable form of `taxmodel analyze --json`."""
    comps = []
    for c in headline.comparisons(ledgers):
        comps.append({"workload": c.workload, "shape": c.shape, "reference": c.reference, "candidate": c.candidate,
                      "reference_ns": c.reference_ns, "candidate_ns": c.candidate_ns, "saved_ns": c.saved_ns,
                      "saved_pct": c.saved_pct, "category_saved_ns": c.category_saved_ns})
    docs = []
    for led in ledgers:
        doc = led.to_dict()
        ref = unprofiled_step_ns(led.meta or {})
        if ref:
            doc["unprofiled_step_ns"] = ref
        docs.append(doc)
    return {"ledgers": docs, "comparisons": comps, "headlines": headline.headlines(ledgers)}
