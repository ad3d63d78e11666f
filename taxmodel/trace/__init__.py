"""Events in: the schema, the bundle store, importers and capture.

``Bundle``, ``load_bundle`` and ``write_bundle`` are loaded on first use: importing a light module
of this package (``capture_meta``, whose choices the command line's options are built from) must
not import pandas and pyarrow with the bundle store.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taxmodel.trace.bundle import Bundle, load_bundle, write_bundle

__all__ = ["Bundle", "load_bundle", "write_bundle"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from taxmodel.trace import bundle

        return getattr(bundle, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
