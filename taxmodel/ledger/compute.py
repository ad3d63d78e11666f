"""The ledger of a bundle in one process (``on_dask.py`` runs the per-rank phases as Dask tasks):

    (a) ``rank_summary.summarize_rank`` reduces each rank's events to a small summary,
    (b) ``plan.plan_ledger`` makes the global decisions from the summaries (clock offsets, windows,
        collectives' last arrivals, skipped iterations),
    (c) ``sweep.rank_ledger`` computes each rank's parts and intervals given the plan,
    (d) ``assemble.assemble_ledger`` concatenates them, with the per-kernel table and the caveats.
"""
from __future__ import annotations

from typing import Callable

import pandas as pd

from taxmodel.hardware.specs import HardwareSpec
from taxmodel.ledger import per_kernel
from taxmodel.ledger.assemble import assemble_ledger
from taxmodel.ledger.plan import LedgerPlan, plan_ledger
from taxmodel.ledger.rank_summary import RankEvents, bundle_ranks, events_by_rank, summarize_rank
from taxmodel.ledger.result import Ledger
from taxmodel.ledger.sweep import rank_ledger
from taxmodel.trace.bundle import Bundle


def compute_ledger(bundle: Bundle, hardware: HardwareSpec | None = None, lenient: bool = False) -> Ledger:
    """Split the bundle's measured time into the ledger's parts; see docs/ledger.md.

    Raises AnalysisError for data that cannot be analyzed as is (iterations that do not match
    across ranks, collectives missing on some member, clocks that cannot be aligned); with
    ``lenient`` the affected iterations are skipped and listed in ``Ledger.skipped``.
    """
    plan, events_of = _plan_bundle(bundle, hardware, lenient)
    pieces = [rank_ledger(events_of(r), plan) for r in plan.ranks]
    return assemble_ledger(plan, pieces, per_kernel.job_label(plan.meta, bundle.path) or bundle.label, hardware)


def ledger_windows(bundle: Bundle, hardware: HardwareSpec | None = None, lenient: bool = False) -> pd.DataFrame:
    """The windows ``compute_ledger`` would split (its ``Ledger.windows``, before sorting), from
    phases (a) and (b) only: what needs a window's length and none of its parts (the analytic
    model's fit on predicted latencies) skips the per-rank split."""
    return _plan_bundle(bundle, hardware, lenient)[0].windows


def _plan_bundle(bundle: Bundle, hardware: HardwareSpec | None,
                 lenient: bool) -> tuple[LedgerPlan, Callable[[int], RankEvents]]:
    """Phases (a) and (b) of ``compute_ledger``: the plan, and each rank's events by rank."""
    ranks = bundle_ranks(bundle)
    events_of = events_by_rank(bundle.events)
    return plan_ledger([summarize_rank(events_of(r)) for r in ranks], bundle.meta, ranks, hardware, lenient), events_of
