"""Check the analytic model against real bundles: predicted vs measured latency and taxes.

For every bundle under a directory (``profiles/`` by default) whose meta names a modeled workload,
variant, shape and world size (``cases``), the model predicts the ledger from the bundle's own
declared cost and hardware (the calibrated spec when one ships, else the datasheet preset: the same
spec for the measured ledger, so "useful" means the same on both sides), and the table lists the
error per (workload, variant, shape, world size) and quantity. Targets: latency within 15% for
every case, each tax within 25% or 20 us. A locality row is a validation only where the bundle's
kernels carry DRAM counters (its ``basis`` "measured"); without them the measured ledger's
locality is the declared-intermediate estimate (``basis`` "estimated"), a formula rather than a
measurement: such rows are listed, marked ``validated`` False and left out of the tally and
``passed``.

The free parameters are fitted first (``fitting``: each on its documented in-sample subset, never
per case), or read from a fitted file (``fitted_from``: every bundle out of sample). The Markdown
of a validation is ``validation_markdown``.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from taxmodel.fsutil import atomic_write
from taxmodel.model.analytic.fitted import choose_fitted, fitted_sets
from taxmodel.model.analytic.params import calibrated_mechanisms, not_borrowed
from taxmodel.model.case_store import CaseStore
from taxmodel.model.cases import Case, predict_case
from taxmodel.ledger.categories import TAXES
from taxmodel.model.fitting import IN_SAMPLE_RULE, fit_params, mark_in_sample
from taxmodel.ledger.per_kernel import LOCALITY_MEASURED

LATENCY_TOLERANCE = 0.15
TAX_TOLERANCE = 0.25
TAX_ABS_US = 20.0
QUANTITIES = ("latency",) + TAXES


@dataclass
class Validation:
    """One validation run: the cases, one table row per (case, quantity), the bundles skipped and
    why, the fitted parameters and notes on how."""

    cases: list[Case]
    table: pd.DataFrame  # one row per (case, quantity)
    skipped: list[str]
    fitted: dict[str, float] = field(default_factory=dict)  # the fits of the GPU with the most in-sample cases
    notes: list[str] = field(default_factory=list)
    #: GPU name -> its fitted values (``taxmodel validate`` fits each GPU's parameters on its own bundles)
    fitted_by_hardware: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the directory the bundles were found under, and the hardware every bundle was measured and
    #: predicted with when one was given (``validate``'s ``root`` and ``hardware``): what the fitted
    #: file says it was fitted on
    root: str = "profiles"
    hardware: str | None = None

    @property
    def validated(self) -> pd.DataFrame:
        """The rows that compare a prediction with a measurement (not with the declared-intermediate estimate)."""
        return self.table[self.table["validated"]]

    @property
    def passed(self) -> bool:
        return bool(len(self.validated)) and bool(self.validated["ok"].all())


def compare(case: Case, fitted: Mapping[str, float], borrowed_from: str | None = None) -> list[dict[str, Any]]:
    """One row per quantity: ``case`` measured against its prediction with ``fitted`` parameters
    (fitted on the GPU ``borrowed_from`` when that is another one)."""
    return compare_rows(case, predict_case(case, fitted, borrowed_from).taxes_ns())


def compare_rows(case: Case, pred: Mapping[str, float]) -> list[dict[str, Any]]:
    """One row per quantity: ``case`` measured against ``pred`` (``Prediction.taxes_ns``)."""
    pred = {**pred, "latency": pred["window"]}
    rows = []
    for q in QUANTITIES:
        basis = ("measured" if case.locality == LOCALITY_MEASURED else "estimated") if q == "locality_tax" else "measured"
        m, p = case.measured.get(q, 0.0), pred.get(q, 0.0)
        err_us = (p - m) / 1e3
        rel = (p - m) / m if m > 0 else (0.0 if p == 0 else math.inf)
        ok = abs(rel) <= LATENCY_TOLERANCE if q == "latency" else (abs(rel) <= TAX_TOLERANCE or abs(err_us) <= TAX_ABS_US)
        rows.append({"workload": case.workload, "variant": case.variant,
                     "shape": case.shape_label, "world_size": case.world_size,
                     "hardware": f"{case.hardware.name} ({case.hardware.source})", "quantity": q,
                     "measured_us": m / 1e3, "predicted_us": p / 1e3, "error_us": err_us, "error_pct": rel * 100.0,
                     "ok": bool(ok), "sample": "in" if case.in_sample else "out", "bundle": case.path.name,
                     "launches": case.launches, "basis": basis, "validated": basis == "measured"})
    return rows


def validate(root: str | os.PathLike = "profiles", *, fit: bool = True,
             fitted_from: str | os.PathLike | None = None, hardware: str | os.PathLike | None = None,
             jobs: int | None = 1, cache: bool = True, progress: bool = False) -> Validation:
    """Predict every modeled bundle under ``root`` and compare (see the module docstring).

    ``fitted_from``: fit nothing and use the parameters of that file (``write_fitted``'s format):
    a GPU's own fits for its bundles, another GPU's, borrowed, for what a GPU without fits did not
    calibrate (``fitted.choose_fitted``; the predictions say so), so every bundle is predicted out
    of sample: the test of bundles captured after the fit (a new world size, new shapes, a new GPU).
    Fitting (``fit``) fits each GPU's parameters on its own bundles, except what its calibration
    measured. ``hardware``: the hardware name or file (``taxmodel calibrate``'s) every bundle is
    predicted and measured with, instead of the one each bundle's GPU resolves to.

    The measured cases and the predictions come from a ``CaseStore``: kept on disk between runs
    unless ``cache`` is False, computed on ``jobs`` processes (None: one per CPU; see ``case_store``
    for what more than one asks of a script), with a progress bar on stderr when ``progress``. The
    fit runs here, on the in-sample cases."""
    with CaseStore(jobs=jobs, cache=cache, progress=progress) as store:
        cases, skipped = store.cases(root, hardware=hardware)
        caveats = sorted({c for case in cases for c in case.caveats})
        if fitted_from is not None:
            sets = fitted_sets(fitted_from)
            chosen = {c.hardware.name: choose_fitted(sets, c.hardware.name, calibrated_mechanisms(c.hardware),
                                                     not_borrowed(c.hardware)) for c in cases}
            per_case = [chosen[c.hardware.name] for c in cases]
            by_hw = {h: values for h, (values, lender) in chosen.items() if lender is None and values}
            fitted = next(iter(sets.values()), {})
        else:
            if fit:
                mark_in_sample(cases)
            by_hw = fit_params(cases) if fit else {}
            per_case = [(by_hw.get(c.hardware.name, {}), None) for c in cases]
            fitted = _primary(cases, by_hw)
        predicted = store.predicted_taxes(cases, per_case)
    # as given when relative (what the user typed); an absolute path by its last folder only (no
    # machine's paths in the committed fitted.json)
    where = Path(root)
    source = {"root": where.name if where.is_absolute() else where.as_posix(),
              "hardware": None if hardware is None else (Path(hardware).name if Path(hardware).is_file() else str(hardware))}
    rows = [r for c, p in zip(cases, predicted) for r in compare_rows(c, p)]
    table = pd.DataFrame(rows, columns=["workload", "variant", "shape", "world_size", "hardware", "quantity",
                                        "measured_us", "predicted_us", "error_us", "error_pct", "ok", "sample", "bundle",
                                        "launches", "basis", "validated"])
    if fitted_from is not None:
        lent = sorted({f"{h}: borrowed from {lender}" for h, (_, lender) in chosen.items() if lender})
        notes = [f"fitted nothing: parameters from {Path(fitted_from).name} ("
                 + "; ".join(f"{h}: " + (", ".join(f"{k} = {v:.3g}" for k, v in vals.items()) or "none")
                             for h, vals in sets.items()) + "; every bundle is out of sample"]
        notes += [f"{line} (fitted there; what this GPU's calibration measured is its own)" for line in lent]
        return Validation(cases, table, skipped, dict(fitted), notes + caveats, by_hw, **source)
    notes = [f"fitting subset: {IN_SAMPLE_RULE}"]
    for h, values in by_hw.items():
        if values:
            notes.append(f"fitted ({h}): " + ", ".join(f"{k} = {v:.3g}" for k, v in values.items()))
    if fit and not any(by_hw.values()):
        notes.append("fitted: nothing (no in-sample case whose latency the fitted parameter explains); defaults used")
    return Validation(cases, table, skipped, fitted, notes + caveats, by_hw, **source)


def _primary(cases: list[Case], by_hw: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The fits of the GPU with the most in-sample cases (what ``fitted`` and older readers of the
    fitted file take as the fits)."""
    counts: dict[str, int] = {}
    for c in cases:
        if c.in_sample:
            counts[c.hardware.name] = counts.get(c.hardware.name, 0) + 1
    best = sorted(counts, key=lambda h: (-counts[h], h))
    return dict(by_hw.get(best[0], {})) if best else {}


#: launch modes whose latency errors make the model's error band: CUDA-graph captures (eager ones
#: carry the profiler's host time, which the model does not predict)
BAND_LAUNCHES = ("graph", "graph+gate", "graph+b2b")
#: fewest out-of-sample cases a variant needs for a band
BAND_MIN_CASES = 3


def latency_error_band(table: pd.DataFrame, hardware_name: str | None = None) -> dict[str, dict[str, Any]]:
    """Per ``workload/variant``: the 10th and 90th percentiles of the model's relative latency
    error (predicted / measured - 1) over its out-of-sample CUDA-graph cases (on the GPU
    ``hardware_name`` when given), and how many there were; what ``taxmodel advise`` turns into a
    range for a predicted saving."""
    if hardware_name is not None:
        table = table[table["hardware"].astype(str).str.startswith(hardware_name + " (")]
    lat = table[(table["quantity"] == "latency") & table["validated"] & (table["sample"] == "out")
                & table["launches"].isin(BAND_LAUNCHES) & np.isfinite(table["error_pct"].astype(float))]
    out = {}
    for (w, var), g in lat.groupby(["workload", "variant"], sort=True):  # a loop over the few variants
        if len(g) >= BAND_MIN_CASES:
            e = g["error_pct"].to_numpy(np.float64) / 100.0
            out[f"{w}/{var}"] = {"n": int(len(g)), "p10": round(float(np.percentile(e, 10)), 4),
                                 "p90": round(float(np.percentile(e, 90)), 4)}
    return out


def fitted_document(v: Validation) -> dict[str, Any]:
    """The fitted parameters as ``taxmodel predict`` reads them: per GPU (``by_hardware``) its values
    and the model's latency error band per variant on its out-of-sample CUDA-graph cases, the GPU with
    the most in-sample cases first (its fits are the ones other GPUs borrow); at the top level that
    GPU's values and name (what taxmodel versions before per-GPU fits read) and how."""
    counts: dict[str, int] = {}
    for c in v.cases:
        if c.in_sample:
            counts[c.hardware.name] = counts.get(c.hardware.name, 0) + 1
    order = sorted((h for h in v.fitted_by_hardware if v.fitted_by_hardware[h]), key=lambda h: (-counts.get(h, 0), h))
    by_hw = {h: {"fitted": dict(sorted(v.fitted_by_hardware[h].items())), "latency_error": latency_error_band(v.table, h)}
             for h in order}
    first = order[0] if order else None
    return {"fitted": dict(sorted(v.fitted_by_hardware.get(first, {}).items())) if first else {},
            "hardware": [first] if first else [],
            "by_hardware": by_hw,
            "how": (f"taxmodel validate on {len(v.cases)} bundles under {v.root}/"
                    + (f", each measured and predicted with --hardware {v.hardware}" if v.hardware else "")
                    + f": {IN_SAMPLE_RULE}"),
            "latency_error": by_hw[first]["latency_error"] if first else {},
            "latency_error_how": ("per workload/variant: 10th and 90th percentile of predicted / measured - 1 over "
                                  f"its out-of-sample cases captured as CUDA graphs ({', '.join(BAND_LAUNCHES)}), "
                                  f"at least {BAND_MIN_CASES}")}


def write_fitted(path: str | os.PathLike, v: Validation) -> Path:
    """Write ``fitted_document(v)`` to ``path`` (JSON; replaced atomically)."""
    return atomic_write(path, json.dumps(fitted_document(v), indent=2, sort_keys=True) + "\n", what="fitted parameters")
