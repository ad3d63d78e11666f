"""Deprecated: the measured ledger is its own package, ``taxmodel.ledger`` (docs/ledger.md):
``from taxmodel.ledger import compute_ledger, Ledger``. This module only hands on the names that
were imported from here, with a DeprecationWarning; it goes in a later release."""
from __future__ import annotations

import warnings
from typing import Any

_NEW_HOME = {"compute_ledger": "taxmodel.ledger.compute", "ledger_windows": "taxmodel.ledger.compute",
             "Ledger": "taxmodel.ledger.result"}


def __getattr__(name: str) -> Any:
    if name not in _NEW_HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (the ledger moved to taxmodel.ledger)")
    warnings.warn(f"taxmodel.model.ledger is deprecated: import {name} from {_NEW_HOME[name]}"
                  + (" (or taxmodel.ledger)" if name != "ledger_windows" else ""), DeprecationWarning, stacklevel=2)
    import importlib

    return getattr(importlib.import_module(_NEW_HOME[name]), name)
