"""taxmodel: where the time of multi-GPU kernels goes (the Three Taxes), measured and predicted."""
from __future__ import annotations

from taxmodel.version import __version__  # noqa: F401  (taxmodel.__version__)


def load(path, **kwargs):
    """Open a bundle (-> Profile), a directory of bundles (-> ProfileSet) or trace files for
    analysis in Python or Jupyter; see ``taxmodel.api.load``."""
    from taxmodel.api import load as _load

    return _load(path, **kwargs)


def predict(workload, variant, shape, world_size=4, hardware="h200-calibrated", **params):
    """The analytic model's predicted ledger; see ``taxmodel.api.predict``."""
    from taxmodel.api import predict as _predict

    return _predict(workload, variant, shape, world_size, hardware, **params)
