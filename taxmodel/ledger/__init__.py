"""The measured ledger: a bundle's events in, its time split exactly into useful work, compute
inefficiency, the three taxes and what is left unattributed (docs/ledger.md).

``compute_ledger`` and ``Ledger`` are loaded on first use: the light modules of this package
(``categories``, ``coverage``), which the report and the command line read, must not import pandas.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taxmodel.ledger.sweep import Ledger, compute_ledger

__all__ = ["Ledger", "compute_ledger"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from taxmodel.ledger import sweep

        return getattr(sweep, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
