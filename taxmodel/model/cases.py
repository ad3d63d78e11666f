"""The measured bundles the analytic model is checked against and fitted on: one ``Case`` per
bundle whose meta names a modeled workload, variant, shape and world size, with its measured
ledger (mean ns per category and sub-category), its kernels' durations and its in-kernel records'
summaries, and the model's prediction for it (``predict_case``: the bundle's own hardware, capture
settings and declared cost).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from taxmodel.errors import InputError
from taxmodel.model.analytic import MODELS, model_params, predict, resolve_model_hardware
from taxmodel.model.analytic.params import ModelParams
from taxmodel.model.analytic.prediction import Prediction
from taxmodel.kernels.revisions import KERNEL_REVISION
from taxmodel.trace.capture_meta import CaptureSettings, emulated_gpu

#: ``Case.measured`` key: mean over the CTAs that wait on a flag of the time from their first
#: ``flag_wait`` record's start to their last record's end (bundles with in-kernel records).
RECORDS_AFTER_WAIT = "records:after_wait"


@dataclass
class Case:
    """One bundle to validate against: what the model needs from its meta, and its measured ledger."""

    path: Path
    workload: str
    variant: str
    shape: dict[str, int]
    world_size: int
    cost: dict[str, Any] | None
    hardware: Any
    hardware_note: str
    measured: dict[str, float]  # window + categories + sub-categories, mean ns
    instrumented: bool = False
    fits: set[str] = field(default_factory=set)  # the fitted parameters whose subset this bundle is in
    graph_launch: bool = False  # captured with `taxmodel profile --graph` (one graph launch per iteration)
    transport: str | None = None  # AG+GEMM fine-grained transport the bundle ran with, when recorded
    align: str = "host"  # how traced steps started (meta capture.align; `taxmodel profile --align`)
    gate_hold_s: float | None = None  # the device gate's hold (capture.gate_hold_us), when aligned on the device
    kernel_revision: int = KERNEL_REVISION  # the built-in kernels' revision it ran (kernels/revisions.py)
    #: how the measured ledger got its locality tax (``Ledger.locality``): "measured" from DRAM
    #: counters, or "estimated" from the declared intermediates, the same formula the model used
    #: before it predicted DRAM bytes, so not a measurement to validate against
    locality: str = "estimated"
    #: one line each on what the prediction takes with a caveat (a hardware file of another GPU)
    caveats: list[str] = field(default_factory=list)

    @property
    def in_sample(self) -> bool:
        return bool(self.fits)

    @property
    def settings(self) -> CaptureSettings:
        """How the bundle was captured, as the model reads it (bundles from before the transport was
        recorded ran the default, the copy engines)."""
        return CaptureSettings(instrumented=self.instrumented, graph_launch=self.graph_launch, transport=self.transport,
                               align=self.align, gate_hold_s=self.gate_hold_s, kernel_revision=self.kernel_revision)

    @property
    def shape_label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.shape.items()))

    @property
    def launches(self) -> str:
        """How the bundle's iterations were launched: graph or eager, ``+gate`` when the device gate
        aligned the ranks' starts of every step, ``+b2b`` when it started back-to-back steps."""
        return ("graph" if self.graph_launch else "eager") + {"device": "+gate", "back-to-back": "+b2b"}.get(self.align, "")

    @property
    def label(self) -> str:
        return f"{self.workload}/{self.variant} {self.shape_label} W={self.world_size}"


def _measured(ledger, events: pd.DataFrame | None = None) -> dict[str, float]:
    """Window, ledger categories and sub-categories (mean ns), and each kernel's mean duration in
    the profiled iterations under ``kernel:<name>`` (what fit rules with a ``kernel`` use)."""
    s = ledger.summary()
    out = {"window": float(ledger.windows["window_ns"].mean()), "latency": float(ledger.windows["window_ns"].mean())}
    out.update({c: float(v) for c, v in s.groupby("category", sort=False)["mean_ns"].sum().items()})
    out.update({sc: float(v) for sc, v in zip(s["subcategory"], s["mean_ns"]) if sc not in out})
    if events is not None and len(events):
        k = events[(events["kind"] == "kernel") & (events["iteration"] >= 0)]
        dur = (k["end_ns"] - k["start_ns"]).groupby(k["name"]).mean()
        out.update({f"kernel:{name}": float(v) for name, v in dur.items()})
        after_wait = _records_after_wait(events)
        if after_wait is not None:
            out[RECORDS_AFTER_WAIT] = after_wait
        out.update(_records_per_cta(events))
    return out


def _records_per_cta(events: pd.DataFrame) -> dict[str, float]:
    """``records:<kernel>:<phase>`` (ns): per instrumented kernel and phase, the mean over the
    (launch, CTA) pairs that recorded the phase of the CTA's total time in it; and
    ``records:<kernel>:<phase>:max``, the mean over launches of the longest such CTA (the one a
    kernel's critical path waits for)."""
    r = events[(events["kind"] == "record") & (events["iteration"] >= 0)]
    if r.empty or "cta" not in r:
        return {}
    per = (r["end_ns"] - r["start_ns"]).groupby([r["name"], r["phase"], r["rank"], r["repetition"], r["iteration"],
                                                 r["cta"]]).sum()
    out = {f"records:{k}:{ph}": float(v) for (k, ph), v in per.groupby(level=[0, 1]).mean().items()}
    longest = per.groupby(level=[0, 1, 2, 3, 4]).max().groupby(level=[0, 1]).mean()
    out.update({f"records:{k}:{ph}:max": float(v) for (k, ph), v in longest.items()})
    return out


def _records_after_wait(events: pd.DataFrame) -> float | None:
    """``RECORDS_AFTER_WAIT`` (ns) from a bundle's in-kernel records, None without flag waits."""
    r = events[(events["kind"] == "record") & (events["iteration"] >= 0)]
    if r.empty or "cta" not in r:
        return None
    key = ["rank", "repetition", "iteration", "cta"]
    first_wait = r[r["phase"] == "flag_wait"].groupby(key)["start_ns"].min().rename("wait_start")
    if first_wait.empty:
        return None
    r = r.join(first_wait, on=key, how="inner")
    last_end = r[r["start_ns"] >= r["wait_start"]].groupby(key)["end_ns"].max()
    return float((last_end - first_wait.loc[last_end.index]).mean())


def other_gpu_caveat(hw: Any, meta: Mapping[str, Any]) -> str | None:
    """One line when the hardware spec ``hw`` (a file given by the user) describes another GPU than
    the one the bundle ``meta`` ran on; None when they match or the bundle does not say."""
    from taxmodel.hardware.specs import find_preset, normalized_name

    device = (meta.get("hardware") or {}).get("name") if isinstance(meta.get("hardware"), Mapping) else None
    if not device:
        return None
    names = {normalized_name(n) for n in (hw.name, *hw.aliases)}
    if normalized_name(str(device)) in names:
        return None
    mine = find_preset(str(device))
    theirs = find_preset(hw.name.replace(" (calibrated)", "")) or next(
        (p for p in map(find_preset, hw.aliases) if p is not None), None)
    if mine is not None and theirs is not None and mine.name == theirs.name:
        return None
    return (f"hardware {hw.name} describes another GPU than the bundles' {device}: its numbers are used as given "
            "(calibrate on the GPU that ran them for predictions of that GPU)")


def load_case(path: Path, search: tuple[Path, ...] = (), hardware: Any = None) -> Case | str:
    """A Case for the bundle at ``path``, or the reason it cannot be validated. ``hardware``: a
    name or file to use instead of the spec the bundle's GPU resolves to."""
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.trace.bundle import load_bundle

    bundle = load_bundle(path)
    meta = bundle.meta
    wl, var, shape = meta.get("workload"), meta.get("variant"), meta.get("shape") or {}
    capture = meta.get("capture") or {}
    if wl not in MODELS:
        return f"{path}: workload {wl!r} has no analytic model"
    if emulated_gpu(meta):
        return f"{path}: CPU-emulated capture (times say nothing about GPUs)"
    if capture.get("inject"):
        return f"{path}: injected taxes ({capture.get('inject')}) are not part of the model"
    if not shape:
        return f"{path}: meta has no shape"
    try:
        hw, note = resolve_model_hardware(hardware, meta, search=search)
    except InputError as exc:
        return f"{path}: {exc}"
    caveat = other_gpu_caveat(hw, meta) if hardware is not None else None
    ledger = compute_ledger(bundle, hw, lenient=True)
    st = CaptureSettings.from_meta(meta, instrumented=bool((bundle.events["kind"] == "record").any()))
    return Case(path, wl, str(var), {k: int(v) for k, v in shape.items() if _intlike(v)}, int(bundle.world_size),
                meta.get("cost"), hw, note, _measured(ledger, bundle.events), instrumented=st.instrumented,
                graph_launch=bool(st.graph_launch), transport=st.transport, align=st.align, gate_hold_s=st.gate_hold_s,
                kernel_revision=st.kernel_revision, locality=ledger.locality, caveats=[caveat] if caveat else [])


def _intlike(v: Any) -> bool:
    try:
        int(v)
        return True
    except (TypeError, ValueError):
        return False


def _params_for(case: Case, fitted: Mapping[str, float], borrowed_from: str | None = None) -> ModelParams:
    """The model's parameters for one bundle: its hardware, how it was captured, and ``fitted``
    (fitted on the GPU ``borrowed_from`` when that is another one)."""
    return model_params(case.hardware, case.settings, dict(fitted), borrowed_from=borrowed_from)[0]


def predict_case(case: Case, fitted: Mapping[str, float], borrowed_from: str | None = None) -> Prediction:
    """The analytic prediction for one measured bundle: its workload, shape, world size, hardware
    and capture settings, with ``fitted`` parameter values over the defaults (borrowed from the GPU
    ``borrowed_from`` when given)."""
    return predict(case.workload, case.variant, case.shape, case.world_size, case.hardware,
                   _params_for(case, fitted, borrowed_from), cost=case.cost)
