"""The report's content as a small document model, assembled once and rendered by ``html`` and
``markdown`` (so the two formats can never disagree about what a report says).

A document is a title and a flat list of blocks (``blocks.py``). ``build_document`` decides what
goes in it from (bundle, ledger) pairs: headline, per-size comparisons, timelines, sweeps, per-CTA
views, the caveats the ledgers raised, and the runs' metadata.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable, Sequence

import pandas as pd
from matplotlib.figure import Figure as MplFigure

from taxmodel.version import __version__
from taxmodel.errors import AnalysisError
from taxmodel.ledger.coverage import missing_ranks
from taxmodel.report import advice, compare, figures, headline
from taxmodel.report.blocks import Block, Bullets, Document, Figure, Heading, Paragraph, slug, table_from_frame
from taxmodel.report.compare import LedgerLike
from taxmodel.trace.bundle import Bundle
from taxmodel.trace.capture_meta import unprofiled_step_ns

MAX_TIMELINE_VARIANTS = 4  # more stacked panels than this stop being readable


def build_document(cases: Sequence[tuple[Bundle, LedgerLike]], *, title: str = "taxmodel report") -> Document:
    """Everything a reader needs, in reading order: headline first, evidence after, caveats and
    provenance last."""
    ledgers = [led for _, led in cases]
    bundle_of = {id(led): b for b, led in cases}
    doc = Document(title)
    names: set[str] = set()

    def fig_block(draw: Callable[[], MplFigure], name: str, caption: str, alt: str) -> Block:
        """The figure, or a sentence saying why it could not be drawn (the rest of the report stands)."""
        try:
            fig = draw()
        except AnalysisError as exc:
            return Paragraph(f"Figure not drawn ({alt}): {exc}")
        stem, i = slug(name), 2
        unique = stem
        while unique in names:
            unique, i = f"{stem}-{i}", i + 1
        names.add(unique)
        return Figure(fig, unique, caption, alt)

    created = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    doc.add(Paragraph(f"{len(cases)} bundle(s); generated {created} by taxmodel {__version__}. "
                      "Times are means per iteration over repetitions, iterations and ranks."))
    doc.add(Heading("Headline"))
    doc.add(*[Paragraph(s, emphasis=True) for s in headline.headlines(ledgers)])

    by_shape = compare.group_by_shape(ledgers)
    workloads = sorted({w for w, _ in by_shape})
    for workload in workloads:
        groups = [(shape, g) for (w, shape), g in by_shape.items() if w == workload]
        doc.add(Heading(f"{workload}: ledger per variant"))
        wl_ledgers = [led for _, g in groups for led in g]
        doc.add(fig_block(lambda: figures.ledger_bars(wl_ledgers), f"{workload}-ledger",
                          "Mean ledger per variant and size: bar height is the iteration latency, "
                          "the black line the useful (roofline) floor.",
                          f"Stacked bars of the ledger of {workload} per variant"))
        for shape, group in groups:
            label = compare.shape_label(dict(shape))
            doc.add(Heading(f"{workload} at {label}", level=3))
            table = headline.comparison_table(group)
            caption = "Mean us per iteration and rank."
            if any("−" in str(c) for c in table.columns):
                caption += (f" The difference columns are variant minus {compare.REFERENCE_VARIANT} "
                            "(negative: the variant spends less).")
            doc.add(table_from_frame(table, caption=caption, total_last=True, missing="n/m"))
            shown = group[:MAX_TIMELINE_VARIANTS]
            doc.add(fig_block(lambda: figures.iteration_timeline([(bundle_of[id(led)], led) for led in shown]),
                              f"{workload}-{label}-timeline",
                              "One typical (median) iteration per variant on the aligned clock: kernels per stream, "
                              "and under each rank the ledger's intervals.",
                              f"Per-rank timeline of one iteration of {workload} at {label}"))
        by_variant = compare.group_by_variant(wl_ledgers)
        if any(len(g) > 1 for g in by_variant.values()):
            doc.add(Heading(f"{workload}: sweep over problem size"))
            doc.add(fig_block(lambda: figures.sweep(wl_ledgers, workload=workload), f"{workload}-sweep",
                              f"Latency, speedup over {compare.REFERENCE_VARIANT} and each tax against problem size.",
                              f"Sweep of {workload} over problem size"))

    doc.add(*advice.section(cases))

    with_records = [(b, led) for b, led in cases if figures.has_cta_records(b)]
    if with_records:
        doc.add(Heading("Inside fused kernels"))
        for b, led in with_records:
            doc.add(fig_block(lambda: figures.cta_timeline(b), f"{led.label}-cta",
                              "Per-CTA phases of one fused kernel (flag waits in the flag-wait colour), with the total "
                              "wait and work per CTA.", f"Per-CTA view of {led.label}"))

    doc.add(Heading("Ledgers"))
    for led in ledgers:
        doc.add(Heading(led.label, level=3))
        doc.add(table_from_frame(headline.ledger_table(led), total_last=True, missing="n/m"))

    doc.add(Heading("Caveats"))
    doc.add(Bullets(caveats(ledgers) or ["None raised."]))
    doc.add(Heading("Runs"))
    doc.add(table_from_frame(metadata_table(cases)))
    return doc


def caveats(ledgers: Sequence[LedgerLike]) -> list[str]:
    """What the reader must know before trusting the numbers: the ledgers' own caveats and
    skipped parts, clock alignment uncertainty, unattributed time, datasheet (uncalibrated) hardware."""
    out: list[str] = []
    for led in ledgers:
        lab = led.label
        out.extend(f"{lab}: {c}" for c in led.caveats)
        out.extend(f"{lab}: skipped (--lenient): {s}" for s in led.skipped)
        clock = getattr(led, "clock", None)
        unc = getattr(clock, "uncertainty_ns", None)
        if unc:
            out.append(f"{lab}: clocks aligned by {getattr(clock, 'method', 'unknown method')}, "
                       f"uncertainty {unc / 1000:.1f} us; parts smaller than that are not resolved")
        window = compare.mean_window_ns(led)
        unattributed = compare.category_means_ns(led)["unattributed"]
        if window and unattributed > 0:
            out.append(f"{lab}: {unattributed / 1000:.1f} us per iteration ({100 * unattributed / window:.1f}%) is unattributed")
        hw = _hardware(led)
        if hw.get("source") == "datasheet" and not any("datasheet" in c for c in led.caveats):
            out.append(f"{lab}: the useful floor uses datasheet peaks for {hw.get('name') or 'unknown hardware'}; "
                       "run `taxmodel calibrate` for measured ones")
    return list(dict.fromkeys(out))  # the ledger may already say some of these


def _hardware(led: LedgerLike) -> dict:
    hw = getattr(led, "hardware", None)
    if hw is not None and hasattr(hw, "source"):
        return {"name": getattr(hw, "name", None), "source": hw.source}
    return dict((led.meta or {}).get("hardware") or {})


def _ranks_cell(meta: dict, led: LedgerLike, bundle: Bundle) -> str:
    """``8``, or ``1 of 8`` when only some of the run's ranks were imported (ledger/coverage.py)."""
    world = meta.get("world_size") or bundle.world_size
    ranks = list(getattr(led, "ranks", None) or [])
    return f"{len(ranks)} of {world}" if ranks and missing_ranks(meta, ranks) else str(world)


def _unprofiled_cell(meta: dict) -> str:
    """The step timed with nothing traced (``capture_meta.unprofiled_step_ns``), or "" without one."""
    ref = unprofiled_step_ns(meta)
    return f"{ref / 1e3:,.1f}" if ref else ""


def metadata_table(cases: Sequence[tuple[Bundle, LedgerLike]]) -> pd.DataFrame:
    rows = []
    for bundle, led in cases:
        meta = led.meta or bundle.meta or {}
        hw = meta.get("hardware") or {}
        sw = meta.get("software") or {}
        rows.append({
            "bundle": led.label,
            "device": str(hw.get("name") or "unknown"),
            "ranks": _ranks_cell(meta, led, bundle),
            "source": str(meta.get("source") or ""),
            "versions": ", ".join(f"{k} {v}" for k, v in sorted(sw.items())) or "unknown",
            "date": str(meta.get("created") or "unknown"),
            "repetitions": str(meta.get("repetitions") or 1),
            "iterations": str(len(led.windows)),
            "un-profiled step (us)": _unprofiled_cell(meta),
            "path": bundle.path.name if bundle.path else "(in memory)",
        })
    return pd.DataFrame(rows)
