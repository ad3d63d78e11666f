"""taxmodel: where the time of multi-GPU kernels goes (the Three Taxes), measured and predicted."""
from __future__ import annotations

__version__ = "0.1.0"


def load(path):
    """Load a profile bundle for analysis (see ``taxmodel.trace.bundle.load_bundle``)."""
    from taxmodel.trace.bundle import load_bundle

    return load_bundle(path)
