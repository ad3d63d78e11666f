"""Deprecated: the hardware specs are their own package, ``taxmodel.hardware`` (docs/hardware.md):
``from taxmodel.hardware.specs import HardwareSpec, resolve_hardware``. This module only hands on
the names of ``taxmodel.hardware.specs``, with a DeprecationWarning; it goes in a later release."""
from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    from taxmodel.hardware import specs

    if name.startswith("__") or not hasattr(specs, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (the specs moved to taxmodel.hardware.specs)")
    warnings.warn(f"taxmodel.model.hardware is deprecated: import {name} from taxmodel.hardware.specs",
                  DeprecationWarning, stacklevel=2)
    return getattr(specs, name)
