"""The ledger's categories and sub-categories (definitions: docs/ledger.md).

For each rank and iteration the parts sum exactly to the global iteration window:

    window = useful + compute_inefficiency + locality_tax + bsp_tax + launch_tax + unattributed

Categories without sub-parts use the category name as their sub-category, so a tidy ledger
always has both columns filled.
"""
from __future__ import annotations

CATEGORIES: dict[str, tuple[str, ...]] = {
    "useful": ("useful",),
    "compute_inefficiency": ("compute_inefficiency",),
    "locality_tax": ("locality_tax",),
    "bsp_tax": ("skew_wait", "exposed_comm", "barrier_idle", "flag_wait", "stream_wait"),
    "launch_tax": ("host_starved", "launch_latency", "kernel_gap"),
    "unattributed": ("unattributed",),
}

CATEGORY_ORDER: tuple[str, ...] = tuple(CATEGORIES)
SUBCATEGORY_ORDER: tuple[str, ...] = tuple(s for subs in CATEGORIES.values() for s in subs)
TAXES: tuple[str, ...] = ("bsp_tax", "locality_tax", "launch_tax")
PARENT: dict[str, str] = {s: c for c, subs in CATEGORIES.items() for s in subs}

LABELS: dict[str, str] = {
    "useful": "Useful work (roofline floor)",
    "compute_inefficiency": "Compute inefficiency",
    "locality_tax": "Data-locality tax",
    "bsp_tax": "Bulk-synchronous tax",
    "launch_tax": "Launch-overhead tax",
    "unattributed": "Unattributed",
    "skew_wait": "Skew wait",
    "exposed_comm": "Exposed communication",
    "barrier_idle": "Barrier idle",
    "flag_wait": "Flag wait",
    "stream_wait": "Stream wait",
    "host_starved": "Host-starved",
    "launch_latency": "Launch latency",
    "kernel_gap": "Kernel gap",
}

LEDGER_COLUMNS: tuple[str, ...] = ("repetition", "iteration", "rank", "category", "subcategory", "ns")
"""Columns of the tidy ledger DataFrame (``Ledger.parts``)."""
