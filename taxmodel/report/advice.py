"""What fusing would buy, as the reports show it: the advisor's ranked table (``taxmodel.model.advise``)
for the terminal (``taxmodel advise``), and the HTML/Markdown report's section with a figure.

The figure stacks, per candidate, the three taxes on its boundaries (the bound on what fusing it
recovers) in the ledger's category colours, and marks the analytic model's predicted saving where
a built-in workload matches: the distance between the bar's end and the mark is what the model
thinks a fine-grained kernel would not get back.
"""
from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING, Any, Sequence

import pandas as pd

from taxmodel.errors import AnalysisError
from taxmodel.model.advise import Inputs, advise
from taxmodel.model.advise_regions import MAX_CHAIN_KERNELS
from taxmodel.ledger.categories import LABELS
from taxmodel.report import blocks as d
from taxmodel.report.terminal import TERMINAL_WIDTH, _text_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TAX_COLUMNS = (("launch_tax_us", "launch_tax"), ("bsp_tax_us", "bsp_tax"), ("locality_tax_us", "locality_tax"))
TERMINAL_COLUMNS = ["kind", "action", "kernels", "ops", "per_iteration", "launch_tax_us", "locality_tax_us", "bsp_tax_us",
                    "bound_us", "bound_pct", "predicted_saving_us", "saving_range_us", "model", "confidence", "missing"]
#: the terminal's default view (``taxmodel advise`` without --wide), within ``TERMINAL_WIDTH``
NARROW_COLUMNS = ["kind", "kernels", "bound_us", "bound_pct", "predicted_saving_us", "saving_range_us", "confidence"]
#: what fusing a candidate of each kind means in practice (docs/advise.md, "Candidates")
KIND_ACTIONS = {
    "run": "CUDA graph of the region",
    "chain": "fuse (epilogue / torch.compile)",
    "optimizer": "fused optimizer (fused=True)",
    "AG+GEMM": "fine-grained AG+GEMM",
    "GEMM+RS": "fused GEMM+RS",
    "GEMM+AR": "fused GEMM+AR",
    "attention+AG": "fused flash decode",
}
MAX_OPS_TEXT = 60
REPORT_TOP = 5  # rows per bundle in the report; the CLI's --top sets its own
MAX_KERNELS_TEXT = 90
FIGURE_ROWS = 10  # the largest bounds over all bundles


def kernels_text(text: str, limit: int = MAX_KERNELS_TEXT) -> str:
    """A candidate's kernel sequence, shortened in the middle when long (runs can hold hundreds)."""
    parts = text.split(" -> ")
    if len(text) <= limit or len(parts) <= 2:
        return text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{parts[0]} -> ... ({len(parts) - 2} more) -> {parts[-1]}"


def shown_table(table: pd.DataFrame) -> pd.DataFrame:
    """The advisor's table as the terminal and the report show it: what to do per kind, kernel
    and op sequences shortened in the middle."""
    return table.assign(action=table["kind"].map(KIND_ACTIONS).fillna(""), kernels=table["kernels"].map(kernels_text),
                        ops=table["ops"].map(lambda t: kernels_text(t, MAX_OPS_TEXT)),
                        saving_range_us=[_range(lo, hi) for lo, hi in zip(table["predicted_saving_lo_us"],
                                                                          table["predicted_saving_hi_us"])])[TERMINAL_COLUMNS]


def _range(lo: float, hi: float) -> str:
    return "" if math.isnan(lo) or math.isnan(hi) else f"{lo:,.1f} to {hi:,.1f}"


def render_advice(table: pd.DataFrame, label: str, window_us: float, wide: bool = False) -> str:
    """The ranked table for the terminal, with a line on what the columns mean and the ledger's
    caveats that bear on it (a profiler-inflated launch tax). Without ``wide``, the columns that
    rank and judge a candidate (``NARROW_COLUMNS``), its kernels shortened to fit ``TERMINAL_WIDTH``."""
    head = f"== {label}: what fusing would buy (us per iteration and rank; step {window_us:,.1f} us)"
    if table.empty:
        return head + "\nno fusion candidates: no two kernels on one stream between host syncs, no collective next " \
                      "to a GEMM\n"
    shown = shown_table(table)
    if not wide:
        shown = shown[NARROW_COLUMNS]
        rest = _table_width(shown.drop(columns="kernels")) + 2  # the other columns and one more separator
        shown = shown.assign(kernels=table["kernels"].map(lambda t: kernels_text(t, max(TERMINAL_WIDTH - rest, 24))))
    note = ("bound_us: launch + locality + bulk-synchronous tax on the candidate's boundaries (what a perfect fusion "
            "recovers at most); predicted_saving_us: the analytic model's bsp minus its best fine-grained variant; "
            "saving_range_us: what its measured latency errors (10th-90th percentile, CUDA-graph captures) allow"
            + ("" if wide else "; --wide adds what to do, the ops, each tax, the model and what it could not use"))
    caveats = [f"caveat: {c}" for c in table.attrs.get("caveats", [])]
    return "\n".join([head, _text_table(shown, None if wide else TERMINAL_WIDTH), *textwrap.wrap(note, TERMINAL_WIDTH),
                      *caveats]) + "\n"


def _table_width(df: pd.DataFrame) -> int:
    """How wide ``_text_table`` draws ``df``."""
    return max(len(line) for line in _text_table(df).splitlines())


def advice_document(table: pd.DataFrame, label: str, window_us: float) -> dict[str, Any]:
    """`taxmodel advise --json`: the rows with NaN as null."""
    rows = table.astype(object).where(pd.notna(table), None).to_dict(orient="records")
    return {"label": label, "window_us": window_us, "candidates": rows, "caveats": list(table.attrs.get("caveats", []))}


def fusion_figure(tables: Sequence[tuple[str, pd.DataFrame]]) -> Figure:
    """Horizontal stacked bars of the candidates' bounds by tax (the ``FIGURE_ROWS`` largest), the
    predicted saving as a mark; candidates of several bundles are labelled with their bundle.
    (matplotlib is imported here, not for ``taxmodel advise``'s table.)"""
    import matplotlib

    from taxmodel.report import style
    from taxmodel.report.figures import _new_figure

    rows = [(label, r) for label, t in tables for r in t.to_dict(orient="records")]
    if not rows:
        raise AnalysisError("no fusion candidates to draw")
    rows = sorted(rows, key=lambda x: x[1]["bound_us"])[-FIGURE_ROWS:]
    with matplotlib.rc_context(style.RC_PARAMS):
        fig = _new_figure(9.0, 1.2 + 0.42 * len(rows))
        ax = fig.add_subplot()
        for y, (label, r) in enumerate(rows):
            left = 0.0
            for col, cat in TAX_COLUMNS:
                v = r[col] if not math.isnan(r[col]) else 0.0
                ax.barh(y, v, left=left, color=style.CATEGORY_COLORS[cat], edgecolor=style.EDGE_COLOR, linewidth=0.5,
                        label=LABELS[cat] if y == 0 else None)
                left += v
            saving = r["predicted_saving_us"]
            lo, hi = r.get("predicted_saving_lo_us", math.nan), r.get("predicted_saving_hi_us", math.nan)
            if not (math.isnan(lo) or math.isnan(hi)):
                ax.plot([lo, hi], [y, y], color="black", linewidth=1.0,
                        label="the model's error band" if not any(
                            h.get_label().startswith("the model") for h in ax.get_lines()) else None)
            if not math.isnan(saving):
                ax.plot([saving], [y], marker="D", color="black", markersize=6, linestyle="none",
                        label="predicted saving (analytic model)" if not any(
                            h.get_label().startswith("predicted") for h in ax.get_lines()) else None)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"{r['kind']}: {kernels_text(r['kernels'], 50)}" + (f"\n{label}" if len(tables) > 1 else "")
                            for label, r in rows], fontsize=7)
        ax.axvline(0, color=style.EDGE_COLOR, linewidth=0.8)
        ax.set_xlabel("us per iteration and rank")
        ax.set_title("What fusing would buy: taxes on each candidate's boundaries")
        ax.legend(loc="lower right", fontsize=7)
    return fig


def section(cases: Sequence[tuple[Any, Any]]) -> list:
    """The report's "What fusing would buy" blocks for (bundle, ledger) pairs."""
    blocks: list = [d.Heading("What fusing would buy"),
                    d.Paragraph("Per bundle, the fusion candidates the trace shows (runs of kernels on one stream between "
                                "host syncs, ending at a new launching thread or step annotation; a collective with its "
                                "GEMM; memory-bound ops after a GEMM or attention, at most "
                                f"{MAX_CHAIN_KERNELS} kernels; a foreach optimizer's step), ranked by the taxes on their "
                                "boundaries: the bound on what fusing them recovers. Where a built-in fine-grained workload "
                                "matches, the analytic model's predicted saving stands beside it (definitions: "
                                "docs/advise.md).")]
    tables = []
    for bundle, led in cases:
        if not hasattr(led, "intervals") or not hasattr(led, "clock"):
            continue
        t = advise(Inputs(bundle, led), top=REPORT_TOP)
        if t.empty:
            continue
        tables.append((led.label, t))
        blocks += [d.Heading(led.label, level=3), d.table_from_frame(shown_table(t), caption="us per iteration and rank.")]
        blocks += [d.Paragraph(f"Caveat: {c}") for c in t.attrs.get("caveats", [])]
    if not tables:
        return blocks + [d.Paragraph("No fusion candidates in these bundles.")]
    try:
        fig = fusion_figure(tables)
        blocks.append(d.Figure(fig, "what-fusing-would-buy", "Taxes on each candidate's boundaries (the bound on what "
                               "fusing recovers) and the model's predicted saving (diamond) with the range its measured latency errors "
                               "allow (line).",
                               "Bars of the fusion candidates' bounds"))
    except AnalysisError as exc:
        blocks.append(d.Paragraph(f"Figure not drawn: {exc}"))
    return blocks
