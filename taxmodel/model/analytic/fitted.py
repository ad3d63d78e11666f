"""The model parameters `taxmodel validate --update-docs` fitted on measured bundles
(``taxmodel/data/fitted.json``), per GPU, read back for predictions.

A prediction on a GPU that has fits of its own uses them. On a GPU without any, the fits of another
GPU stand in for what this GPU's calibration did not measure (``params.calibrated_mechanisms``):
they are borrowed, and the prediction says so in one line (``borrowed_note``), naming the GPU they
come from and how to measure them here (`taxmodel calibrate`).

The file: ``{"by_hardware": {NAME: {"fitted": {...}, "latency_error": {...}}}, "fitted": {...},
"hardware": [...], ...}``; the top-level ``fitted``/``hardware`` are the first GPU's (what taxmodel
versions before per-GPU fits read), and a file with only those is read as that one GPU's.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from taxmodel.errors import InputError

#: Where ``validate --update-docs`` keeps the fitted parameters that every prediction uses.
FITTED_FILE = Path(__file__).resolve().parents[2] / "data" / "fitted.json"


def _read(p: Path) -> dict[str, Any]:
    try:
        doc = json.loads(p.read_text())
        if not isinstance(doc, dict):
            raise TypeError("not a JSON object")
        return doc
    except (OSError, ValueError, TypeError) as exc:
        raise InputError(f"{p}: not a fitted-parameters file of `taxmodel validate --update-docs` ({exc})") from None


def fitted_sets(path: str | os.PathLike) -> dict[str, dict[str, float]]:
    """GPU name -> its fitted values, in the file's order (the first is the one borrowed elsewhere);
    InputError if ``path`` is not a file ``write_fitted`` wrote."""
    p = Path(path)
    doc = _read(p)
    try:
        if isinstance(doc.get("by_hardware"), dict) and doc["by_hardware"]:
            return {str(h): {k: float(v) for k, v in (entry.get("fitted") or {}).items()}
                    for h, entry in doc["by_hardware"].items()}
        values = {k: float(v) for k, v in doc["fitted"].items()}
        return {str(h): dict(values) for h in doc["hardware"]}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{p}: not a fitted-parameters file of `taxmodel validate --update-docs` ({exc})") from None


def load_fitted(path: str | os.PathLike) -> tuple[dict[str, float], list[str]]:
    """(the first GPU's fitted values, the names of every GPU with fits) from a file ``write_fitted``
    wrote; InputError if it is not one."""
    sets = fitted_sets(path)
    first = next(iter(sets.values()), {})
    return dict(first), list(sets)


def choose_fitted(sets: Mapping[str, Mapping[str, float]], hardware_name: str,
                  calibrated: set[str] | frozenset[str] = frozenset(),
                  not_borrowed: set[str] | frozenset[str] = frozenset()) -> tuple[dict[str, float], str | None]:
    """The fitted values a prediction on ``hardware_name`` uses and, when borrowed, the GPU they come
    from: this GPU's own fits less what its calibration measured (``calibrated``), else the first
    GPU's (borrowed) less ``not_borrowed`` (what it measured, and what a measurement of it keeps
    from being borrowed: ``params.not_borrowed``); ({}, None) when there are none."""
    if hardware_name in sets:
        return {k: v for k, v in sets[hardware_name].items() if k not in calibrated}, None
    blocked = set(calibrated) | set(not_borrowed)
    for other, values in sets.items():
        kept = {k: v for k, v in values.items() if k not in blocked}
        return (kept, other) if kept else ({}, None)
    return {}, None


def borrowed_note(borrowed: Mapping[str, str]) -> str | None:
    """One line saying which parameters were borrowed from which GPU (``ModelParams.borrowed()``)."""
    if not borrowed:
        return None
    by_gpu: dict[str, list[str]] = {}
    for name, gpu in sorted(borrowed.items()):
        by_gpu.setdefault(gpu, []).append(name)
    parts = "; ".join(f"{', '.join(names)} from {gpu}" for gpu, names in by_gpu.items())
    return (f"borrowed from another GPU (fitted there, not measured on this one): {parts}; "
            "`taxmodel calibrate` on this GPU measures them")


def fitted_for(hardware_name: str, path: str | os.PathLike | None = None,
               calibrated: set[str] | frozenset[str] = frozenset(),
               not_borrowed: set[str] | frozenset[str] = frozenset()) -> tuple[dict[str, float], str | None]:
    """The fitted parameters that apply to ``hardware_name`` (``choose_fitted``; empty when no file is
    there) and a sentence for the prediction's assumptions when they are this GPU's own (borrowed
    ones are named by ``borrowed_note`` from the parameters' sources)."""
    p = Path(path) if path is not None else FITTED_FILE
    if not p.is_file():
        return {}, None
    values, lender = choose_fitted(fitted_sets(p), hardware_name, calibrated, not_borrowed)
    if not values or lender is not None:
        return values, None
    return values, ("fitted on the measured bundles of this hardware (`taxmodel validate`, " + p.name + "): "
                    + ", ".join(f"{k} = {v:.3g}" for k, v in values.items()))


def latency_error_bands(hardware_name: str, path: str | os.PathLike | None = None) -> dict[str, tuple[float, float]]:
    """Per ``workload/variant``: (10th, 90th percentile of predicted / measured - 1) of the model's
    latency on the hardware its fit was made on, as ``validate --update-docs`` recorded it
    (out-of-sample CUDA-graph cases); empty for other hardware or no file."""
    p = Path(path) if path is not None else FITTED_FILE
    return _bands(_read(p), hardware_name, p) if p.is_file() else {}


def error_bands_for(hardware_name: str, path: str | os.PathLike | None = None) -> tuple[dict[str, tuple[float, float]], str | None]:
    """``latency_error_bands`` of ``hardware_name``, or where that GPU has none recorded, those of
    the GPU whose bands cover the most workload/variants (then by name), and that GPU's name: a
    GPU the model was never validated on is at least as uncertain as the one it was."""
    p = Path(path) if path is not None else FITTED_FILE
    if not p.is_file():
        return {}, None
    doc = _read(p)
    own = _bands(doc, hardware_name, p)
    if own:
        return own, None
    by_hw = doc.get("by_hardware")
    lenders = [(len(b), n, b) for n in (by_hw if isinstance(by_hw, dict) else {})
               if n != hardware_name and (b := _bands(doc, n, p))]
    if not lenders:
        return {}, None
    _, name, bands = max(lenders, key=lambda t: (t[0], t[1]))
    return bands, name


def _bands(doc: dict[str, Any], hardware_name: str, p: Path) -> dict[str, tuple[float, float]]:
    """``hardware_name``'s latency error bands in the fitted-parameters document ``doc`` (read from ``p``)."""
    try:
        if isinstance(doc.get("by_hardware"), dict) and doc["by_hardware"]:
            entry = doc["by_hardware"].get(hardware_name)
            bands = (entry or {}).get("latency_error", {})
        else:
            if hardware_name not in doc["hardware"]:
                return {}
            bands = doc.get("latency_error", {})
        return {k: (float(v["p10"]), float(v["p90"])) for k, v in bands.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{p}: not a fitted-parameters file of `taxmodel validate --update-docs` ({exc})") from None