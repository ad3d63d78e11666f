"""The model parameters `taxmodel validate --update-docs` fitted on measured bundles
(``taxmodel/data/fitted.json``), read back for predictions on the hardware they were fitted on."""
from __future__ import annotations

import json
import os
from pathlib import Path

from taxmodel.errors import InputError

#: Where ``validate --update-docs`` keeps the fitted parameters that every prediction uses.
FITTED_FILE = Path(__file__).resolve().parents[2] / "data" / "fitted.json"


def load_fitted(path: str | os.PathLike) -> tuple[dict[str, float], list[str]]:
    """(fitted values, names of the hardware they were fitted on) from a file ``write_fitted`` wrote;
    InputError if it is not one."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
        return {k: float(v) for k, v in doc["fitted"].items()}, [str(h) for h in doc["hardware"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{p}: not a fitted-parameters file of `taxmodel validate --update-docs` ({exc})") from None


def fitted_for(hardware_name: str, path: str | os.PathLike | None = None) -> tuple[dict[str, float], str | None]:
    """The fitted parameters that apply to ``hardware_name`` (empty when none were fitted on it, or
    no file is there) and a sentence for the prediction's assumptions."""
    p = Path(path) if path is not None else FITTED_FILE
    if not p.is_file():
        return {}, None
    values, hardware = load_fitted(p)
    if hardware_name not in hardware or not values:
        return {}, None
    return values, ("fitted on the measured bundles of this hardware (`taxmodel validate`, " + p.name + "): "
                    + ", ".join(f"{k} = {v:.3g}" for k, v in values.items()))


def latency_error_bands(hardware_name: str, path: str | os.PathLike | None = None) -> dict[str, tuple[float, float]]:
    """Per ``workload/variant``: (10th, 90th percentile of predicted / measured - 1) of the model's
    latency on the hardware its fit was made on, as ``validate --update-docs`` recorded it
    (out-of-sample CUDA-graph cases); empty for other hardware or no file."""
    p = Path(path) if path is not None else FITTED_FILE
    if not p.is_file():
        return {}
    try:
        doc = json.loads(p.read_text())
        if hardware_name not in doc["hardware"]:
            return {}
        return {k: (float(v["p10"]), float(v["p90"])) for k, v in doc.get("latency_error", {}).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{p}: not a fitted-parameters file of `taxmodel validate --update-docs` ({exc})") from None

