"""Analytic model: predicted ledgers from shapes and hardware (formulas: docs/model.md).

    predict("ag_gemm", "pull", {"M": 8192, "N": 8192, "K": 8192}, world_size=8, hardware="h200-calibrated")
        -> Prediction (summary() in the columns of Ledger.summary())

One module per workload (``ag_gemm.py``, ``flash_decode.py``, ``gemm_rs.py``) turns a shape into each rank's
kernel plans from the building blocks (``params``, ``topology``, ``costs``, ``collective_model``);
``timeline`` places them on a timeline and ``prediction`` splits it with the measured ledger.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

import pandas as pd

from taxmodel.errors import InputError
from taxmodel.hardware.specs import HardwareSpec, choose_hardware
from taxmodel.trace.capture_meta import CaptureSettings

from . import ag_gemm, flash_decode, gemm_rs
from .collective_model import CollectiveModel
from .fitted import FITTED_FILE, borrowed_note, choose_fitted, fitted_sets
from .params import ModelParams, calibrated_mechanisms, hardware_values, not_borrowed
from .prediction import Prediction, standard_assumptions
from .timeline import as_graph_launch
from .topology import topology

MODELS = {"ag_gemm": ag_gemm, "flash_decode": flash_decode, "gemm_rs": gemm_rs}


def variants(workload: str) -> tuple[str, ...]:
    return _module(workload).VARIANTS


def _module(workload: str):
    if workload not in MODELS:
        raise InputError(f"no analytic model for workload '{workload}'; modeled: {', '.join(MODELS)}")
    return MODELS[workload]


# --- hardware: the one resolver, preferring a calibrated file over a datasheet preset ----------

def resolve_model_hardware(name_or_path: str | os.PathLike | None, meta: Mapping[str, Any] | None = None,
                           search: tuple[str | os.PathLike, ...] = ()) -> tuple[HardwareSpec, str]:
    """The spec to predict with and a sentence saying which one was used and why:
    ``taxmodel.hardware.specs.choose_hardware`` (the ledger's resolver too) with the calibrated
    preference, so a prediction's hardware differs from the ledger's only where a calibrated file
    for that GPU wins."""
    return choose_hardware(name_or_path, meta, prefer_calibrated=True, search=search)


# --- prediction ------------------------------------------------------------------------------------

def with_hardware_note(assumptions: list[str], note: str | None) -> list[str]:
    """``note`` (which spec and why) first, in place of the plain hardware line: the choice is said
    once. What that line says beyond the name (a datasheet's scaled peaks) joins the note."""
    if not note:
        return list(assumptions)
    more = [m.group(1) for a in assumptions if a.startswith("hardware: ") and (m := _MORE.search(a))]
    return ["; ".join([note, *more])] + [a for a in assumptions if not a.startswith("hardware: ")]


_MORE = re.compile(r"\([^;()]*; ([^()]*)\)$")
"""What a plain hardware line says after its source: 'hardware: X (datasheet; <this>)'."""


def model_params(hardware: HardwareSpec, settings: CaptureSettings | None = None,
                 fitted: Mapping[str, float] | None = None, borrowed_from: str | None = None,
                 **overrides: Any) -> tuple[ModelParams, str | None]:
    """The one way every door (the CLI, ``taxmodel.predict``, ``Profile.predict``, ``validate``)
    builds the model's parameters, so that one bundle gets one prediction whichever door asks:
    ``hardware``'s calibration, how the bundle was captured (``settings``), the parameters that
    ``taxmodel validate`` fitted (``fitted`` None: the shipped ones, ``taxmodel/data/fitted.json``:
    this GPU's, else another GPU's, borrowed; ``{}``: none; a dict: those, fitted on
    ``borrowed_from`` when that names another GPU), then explicit ``overrides``. What this GPU's
    calibration measured (``params.calibrated_mechanisms``) is never replaced by a fit.
    Returns the parameters and a sentence naming this GPU's own fitted values (None when none;
    borrowed ones are named in the prediction's assumptions, ``fitted.borrowed_note``)."""
    s = settings or CaptureSettings()
    note = None
    calibrated = calibrated_mechanisms(hardware)
    if fitted is None:
        sets = fitted_sets(FITTED_FILE) if FITTED_FILE.is_file() else {}
        fitted, borrowed_from = choose_fitted(sets, hardware.name, calibrated, not_borrowed(hardware))
        if fitted and borrowed_from is None:
            note = ("fitted on the measured bundles of this hardware (`taxmodel validate`, " + FITTED_FILE.name + "): "
                    + ", ".join(f"{k} = {v:.3g}" for k, v in fitted.items()))
    else:
        blocked = calibrated | (not_borrowed(hardware) if borrowed_from else set())
        fitted = {k: v for k, v in fitted.items() if k not in blocked}
        if fitted and borrowed_from is None:
            note = "fitted: " + ", ".join(f"{k} = {v:.3g}" for k, v in fitted.items())
    params = ModelParams.from_hardware(hardware, instrumented=s.instrumented, graph_launch=s.graph_launch,
                                       ag_transport=s.transport, start_alignment=s.align, gate_hold_s=s.gate_hold_s,
                                       kernel_revision=s.kernel_revision)
    params = params.with_fitted(fitted, borrowed_from=borrowed_from)
    given = {k: v for k, v in overrides.items() if v is not None}
    if given:
        params = params.with_given(given)
    return params, note


def predict(workload: str, variant: str, shape: Mapping[str, int], world_size: int, hardware: HardwareSpec | str,
            params: ModelParams | None = None, cost: Mapping[str, Any] | None = None) -> Prediction:
    """Predicted ledger of one iteration of ``workload``/``variant`` on ``world_size`` GPUs.

    ``cost``: the declared cost to measure "useful" against (default: the workload's own, as
    a real bundle would carry it)."""
    mod = _module(workload)
    hw_note = None
    if isinstance(hardware, str):
        hardware, hw_note = resolve_model_hardware(hardware)
    params = params or ModelParams.from_hardware(hardware)
    topo = topology(hardware, int(world_size), params)
    coll = CollectiveModel.from_hardware(hardware, topo, params)
    shape = {k: int(v) for k, v in dict(shape).items()}
    plans, details, notes = mod.plans(variant, shape, int(world_size), hardware, params, coll)
    if params.graph_launch:
        plans = as_graph_launch(plans, params)
        notes = list(notes) + ["launches: each iteration is one CUDA graph launch (all kernels queued behind it)"]
    cost = dict(cost) if cost else mod.cost(shape, int(world_size), variant)
    assumptions = with_hardware_note(standard_assumptions(hardware, topo, params) + notes, hw_note)
    assumptions.append(coll.curve_note(int(world_size)))
    assumptions += hardware_caveats(hardware, params)
    return Prediction(workload, variant, shape, int(world_size), hardware, params, plans, cost, assumptions, details)


def hardware_caveats(hardware: HardwareSpec, params: ModelParams) -> list[str]:
    """One line each: parameters borrowed from another GPU's fits (``fitted.borrowed_note``), and
    fields of the hardware file that did not read as their parameters (left at their defaults)."""
    out = []
    borrowed = borrowed_note(params.borrowed())
    if borrowed:
        out.append(borrowed)
    bad = hardware_values(hardware)[1]
    if bad:
        out.append(f"hardware file {hardware.name}: ignored field(s) {', '.join(bad)}; their defaults used")
    return out


def sweep(workload: str, variant: str, shape: Mapping[str, int], world_size: int, hardware: HardwareSpec | str,
          key: str, values: list[int], params: ModelParams | None = None) -> pd.DataFrame:
    """Predictions over ``values`` of one shape key: one row per value with the predicted window
    and every category (mean ns per rank-iteration)."""
    from taxmodel.ledger.categories import CATEGORY_ORDER

    if isinstance(hardware, str):
        hardware, _ = resolve_model_hardware(hardware)
    rows = []
    for v in values:
        p = predict(workload, variant, {**dict(shape), key: int(v)}, world_size, hardware, params)
        t = p.taxes_ns()
        rows.append({key: int(v), "window_ns": t["window"], **{cat: t.get(cat, 0.0) for cat in CATEGORY_ORDER}})
    return pd.DataFrame(rows)


def parse_range(text: str) -> tuple[str, list[int]]:
    """'M=1024:16384' -> ('M', [1024, 2048, 4096, 8192, 16384]) (powers of two between the ends);
    'M=1024:16384:1024' -> arithmetic steps; 'M=1,2,3' -> a list."""
    if "=" not in text:
        raise InputError(f"--sweep '{text}': expected KEY=LO:HI, KEY=LO:HI:STEP or KEY=V1,V2,...")
    key, spec = text.split("=", 1)
    try:
        if ":" in spec:
            parts = [int(float(x)) for x in spec.split(":")]
            lo, hi = parts[0], parts[1]
            if lo <= 0 or hi < lo:
                raise ValueError
            if len(parts) == 3:
                vals = list(range(lo, hi + 1, parts[2]))
            else:
                vals, v = [], lo
                while v <= hi:
                    vals.append(v)
                    v *= 2
                if vals[-1] != hi:
                    vals.append(hi)
        else:
            vals = [int(float(x)) for x in spec.split(",") if x]
    except ValueError as exc:
        raise InputError(f"--sweep '{text}': values must be positive integers, LO <= HI") from exc
    return key.strip(), vals


__all__ = ["CaptureSettings", "model_params", "ModelParams", "Prediction", "predict", "sweep", "parse_range", "resolve_model_hardware", "variants", "MODELS"]
