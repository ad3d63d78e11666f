"""The headline: what a fine-grained variant saves over ``bsp`` and where the savings come from.

Every number is a difference of ledger means (per iteration, mean over repetitions, iterations
and ranks), so the parts of a saving add up to the saving exactly: the latency difference is
the sum of the category differences, and the sentence names the rest ("other") instead of
hiding it. ``headlines(ledgers)`` is what ``taxmodel analyze`` and ``taxmodel report`` print.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from taxmodel.ledger.categories import CATEGORIES, CATEGORY_ORDER, LABELS, TAXES
from taxmodel.ledger.per_kernel import LOCALITY_ABSENT, LOCALITY_ESTIMATED
from taxmodel.report import compare
from taxmodel.report.compare import LedgerLike
from taxmodel.trace.capture_meta import emulated_gpu

_SHORT = {"bsp_tax": "BSP tax", "launch_tax": "launch tax", "locality_tax": "locality tax"}
_TAX_ORDER = ("bsp_tax", "launch_tax", "locality_tax")  # the order the sentence names them
assert set(_TAX_ORDER) == set(TAXES)


@dataclass(frozen=True)
class Comparison:
    """One candidate variant against the reference at one (workload, shape). Times in ns per iteration."""

    workload: str
    shape: str
    reference: str
    candidate: str
    reference_ns: float
    candidate_ns: float
    category_saved_ns: dict[str, float]  # reference minus candidate, per category (positive = candidate pays less)
    cpu_run: bool = False  # either side ran in Triton's interpreter (trace.capture_meta.emulated_gpu): no GPU verdict
    #: the weaker basis of the two ledgers' locality tax (``per_kernel``: "estimated" from declared
    #: intermediates, "not measured"; "" where both measured it or a ledger does not say)
    locality_basis: str = ""

    @property
    def saved_ns(self) -> float:
        return self.reference_ns - self.candidate_ns

    @property
    def saved_pct(self) -> float:
        return 100.0 * self.saved_ns / self.reference_ns if self.reference_ns else float("nan")

    @property
    def speedup(self) -> float:
        return self.reference_ns / self.candidate_ns if self.candidate_ns else float("nan")

    @property
    def efficiency_lost_ns(self) -> float:
        """How much more compute inefficiency the candidate has (e.g. a Triton GEMM slower than cuBLAS)."""
        return -self.category_saved_ns["compute_inefficiency"]

    @property
    def other_saved_ns(self) -> float:
        """Savings outside the taxes and compute inefficiency (useful floor, unattributed)."""
        return self.category_saved_ns["useful"] + self.category_saved_ns["unattributed"]


def compare_ledgers(reference: LedgerLike, candidate: LedgerLike) -> Comparison:
    ref_id, cand_id = compare.identity(reference), compare.identity(candidate)
    ref_cat, cand_cat = compare.category_means_ns(reference), compare.category_means_ns(candidate)
    return Comparison(
        workload=cand_id.workload,
        shape=ref_id.shape_label,  # as the side-by-side heading names it (the reference first)
        reference=ref_id.variant,
        candidate=cand_id.variant,
        reference_ns=compare.mean_window_ns(reference),
        candidate_ns=compare.mean_window_ns(candidate),
        category_saved_ns={c: float(ref_cat[c] - cand_cat[c]) for c in CATEGORY_ORDER},
        cpu_run=emulated_gpu(reference.meta) or emulated_gpu(candidate.meta),
        locality_basis=_weaker_locality(reference, candidate),
    )


def _weaker_locality(*ledgers: LedgerLike) -> str:
    """"not measured" if any ledger's locality tax was not measured, else "estimated" if any was
    estimated (a formula over declared intermediates, not DRAM counters), else ""."""
    bases = {getattr(led, "locality", "") for led in ledgers}
    return next((b for b in (LOCALITY_ABSENT, LOCALITY_ESTIMATED) if b in bases), "")


def _tax_text(tax: str, ns: float, basis: str, pct: str = "") -> str:
    """``locality tax 4.0 us`` with what the number is when the locality tax was not measured: ``n/m``
    (no DRAM counters, no declared intermediates) or the value marked ``estimated``."""
    if tax == "locality_tax" and basis == LOCALITY_ABSENT:
        return f"{_SHORT[tax]} n/m"
    if tax == "locality_tax" and basis == LOCALITY_ESTIMATED:
        return f"{_SHORT[tax]} {_us(ns)} ({pct + ', ' if pct else ''}estimated, not measured)"
    return f"{_SHORT[tax]} {_us(ns)}" + (f" ({pct})" if pct else "")


def comparisons(ledgers: Sequence[LedgerLike]) -> list[Comparison]:
    """Every non-reference variant against ``bsp`` at the same (workload, shape)."""
    out = []
    for group in compare.group_by_shape(ledgers).values():
        ref = compare.reference_of(group)
        if ref is None:
            continue
        out.extend(compare_ledgers(ref, led) for led in group if led is not ref)
    return out


def _us(ns: float) -> str:
    us = ns / 1000.0
    text = f"{abs(us):.1f} us" if abs(us) < 1000 else f"{abs(us) / 1000:.3f} ms"
    return ("−" if us < 0 and text.strip("0.usm ") else "") + text


def comparison_sentence(c: Comparison) -> str:
    """"At M=... , fg saves X us (Y%) per iteration over bsp, of which BSP tax A, launch tax B,
    locality tax C; it loses D to compute efficiency." A negative part is a tax the candidate pays
    more of than the reference. A CPU run's sentence gives the difference and no verdict: its times
    are the interpreter's."""
    if c.cpu_run:
        more = "more" if c.saved_ns < 0 else "less"
        return (f"{c.workload} at {c.shape}: on CPU, in Triton's interpreter, {c.candidate} took {_us(abs(c.saved_ns))} "
                f"{more} per iteration than {c.reference}: interpreter times, not GPU times, so no verdict on which is "
                "faster on a GPU.")
    if c.saved_ns >= 0:
        lead = f"{c.candidate} saves {_us(c.saved_ns)} ({c.saved_pct:.1f}%) per iteration over {c.reference}"
    else:
        lead = f"{c.candidate} is {_us(-c.saved_ns)} ({-c.saved_pct:.1f}%) slower per iteration than {c.reference}"
    parts = ", ".join(_tax_text(t, c.category_saved_ns[t], c.locality_basis) for t in _TAX_ORDER)
    lost = c.efficiency_lost_ns
    if lost >= 0:
        eff = f"it loses {_us(lost)} to compute efficiency"
    else:
        eff = f"it gains {_us(-lost)} in compute efficiency"
    other = c.other_saved_ns
    tail = f" (other parts: {_us(other)})" if abs(other) >= max(0.005 * c.reference_ns, 50) else ""
    # "of which" only reads right for a saving; a slower candidate lists what each tax saved,
    # negative where the candidate pays more of it than the reference.
    join = ", of which" if c.saved_ns >= 0 else "; saved per tax (negative: paid more)"
    return f"{c.workload} at {c.shape}: {lead}{join} {parts}; {eff}{tail}."


def ledger_sentence(ledger: LedgerLike) -> str:
    """One ledger alone: its latency and how much of it each tax takes."""
    ident = compare.identity(ledger)
    window = compare.mean_window_ns(ledger)
    cats = compare.category_means_ns(ledger)
    basis = getattr(ledger, "locality", "")
    parts = ", ".join(_tax_text(t, cats[t], basis, f"{100 * cats[t] / window:.1f}%") for t in _TAX_ORDER) if window else ""
    name = ledger.label if not (ledger.meta or {}).get("workload") else f"{ident.workload}/{ident.variant} at {ident.shape_label}"
    if emulated_gpu(ledger.meta):
        name += " (on CPU: interpreter times, not GPU times)"
    return (f"{name}: {_us(window)} per iteration; "
            f"{parts}; useful floor {_us(cats['useful'])} ({100 * cats['useful'] / window:.1f}%).")


def headlines(ledgers: Sequence[LedgerLike]) -> list[str]:
    """The headline sentences for a set of ledgers: one per variant compared with ``bsp`` at the
    same (workload, shape); a (workload, shape) without ``bsp`` gets one sentence per ledger."""
    out = []
    for group in compare.group_by_shape(ledgers).values():
        ref = compare.reference_of(group)
        if ref is None or len(group) == 1:
            out.extend(ledger_sentence(led) for led in group)
            if ref is None and len(group) > 1:
                out.append(f"(no {compare.REFERENCE_VARIANT} bundle at this size: nothing to compare against)")
            continue
        out.extend(comparison_sentence(compare_ledgers(ref, led)) for led in group if led is not ref)
    return out


def _display_rows() -> list[tuple[str, str, tuple[str, ...]]]:
    """Table rows in ledger order: (category label, part label, sub-categories summed).

    Multi-part categories get a total row followed by their parts (category cell left blank),
    so the table shows the same totals the headline names."""
    rows = []
    for category, subs in CATEGORIES.items():
        if len(subs) == 1:
            rows.append((LABELS[category], "", subs))
            continue
        rows.append((LABELS[category], "total", subs))
        rows.extend(("", LABELS[sub], (sub,)) for sub in subs)
    return rows


def _table(columns: dict[str, pd.Series], windows: dict[str, float]) -> pd.DataFrame:
    """One numeric column per entry of ``columns`` (ns per sub-category), in us; total row last."""
    out = []
    for cat, part, subs in _display_rows():
        row = {"category": cat, "part": part}
        row.update({name: float(vals[list(subs)].sum(min_count=1)) / 1000.0 for name, vals in columns.items()})
        out.append(row)
    total = {"category": "Total", "part": "iteration window"}
    total.update({name: w / 1000.0 for name, w in windows.items()})
    out.append(total)
    return pd.DataFrame(out)


def ledger_table(ledger: LedgerLike) -> pd.DataFrame:
    """The mean ledger of one bundle: category totals, their parts, the window; us and % of window."""
    window = compare.mean_window_ns(ledger)
    table = _table({"mean (us)": compare.part_means_ns(ledger)}, {"mean (us)": window})
    table["% of window"] = 100.0 * table["mean (us)"] * 1000.0 / window if window else float("nan")
    if getattr(ledger, "launch_tax_inflated", False):  # said on the line itself, not only among the caveats
        row = (table["category"] == LABELS["launch_tax"]) & (table["part"] == "total")
        table.loc[row, "part"] = "total (profiler-inflated?)"
    return table


def comparison_table(group: Sequence[LedgerLike]) -> pd.DataFrame:
    """Variants side by side at one (workload, shape): mean us per part, and each variant minus
    ``bsp`` (negative = the variant spends less there). Repeated variant names get a #n suffix."""
    names: list[str] = []
    for led in group:
        v = compare.identity(led).variant
        name, i = v, 2
        while name in names:
            name, i = f"{v}#{i}", i + 1
        names.append(name)
    table = _table({f"{n} (us)": compare.part_means_ns(led) for n, led in zip(names, group)},
                   {f"{n} (us)": compare.mean_window_ns(led) for n, led in zip(names, group)})
    ref = compare.REFERENCE_VARIANT
    if ref in names:
        for n in names:
            if n != ref:
                table[f"{n} − {ref} (us)"] = table[f"{n} (us)"] - table[f"{ref} (us)"]
    return table
