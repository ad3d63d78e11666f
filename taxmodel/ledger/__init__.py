"""The measured ledger: a bundle's events in, its time split exactly into useful work, compute
inefficiency, the three taxes and what is left unattributed (docs/ledger.md).

``compute.compute_ledger`` runs four phases; ``on_dask.compute_ledger_dask`` runs the per-rank
ones as Dask tasks:

  (a) ``rank_summary``  each rank's events reduced to a few rows per iteration and collective
  (b) ``plan``          the global decisions: hardware, skipped iterations, clock offsets
                        (``clock``), windows (``windows``), collectives' last arrivals (``collectives``)
  (c) ``sweep``         each rank's windows swept into labelled segments (``segments``,
                        ``intervals``): idle time by cause (``idle_gaps``, ``stream_waits``), busy
                        time by each kernel's shares (``kernel_shares``, ``kernel_records``)
  (d) ``assemble``      the ranks' parts together, the per-kernel table, the caveats -> ``result.Ledger``

Per-kernel floors: ``kernel_costs`` (roofline floors from shapes, ``copy_costs`` for copies) and
``per_kernel`` (floors, locality and the per-kernel table); ``categories`` names the parts and
``coverage`` says what missing ranks make unknowable.

``compute_ledger`` and ``Ledger`` are loaded on first use: the light modules of this package
(``categories``, ``coverage``), which the report and the command line read, must not import pandas.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.ledger.result import Ledger

__all__ = ["Ledger", "compute_ledger"]


def __getattr__(name: str) -> Any:
    if name == "compute_ledger":
        from taxmodel.ledger.compute import compute_ledger

        return compute_ledger
    if name == "Ledger":
        from taxmodel.ledger.result import Ledger

        return Ledger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
