"""Check the analytic model against real bundles: predicted vs measured latency and taxes.

For every bundle under a directory (``profiles/`` by default) whose meta names a modeled workload,
variant, shape and world size, the model predicts the ledger from the bundle's own declared cost
and hardware (the calibrated spec when one ships, else the datasheet preset: the same spec for
the measured ledger, so "useful" means the same on both sides), and the table lists the error per
(workload, variant, shape, world size) and quantity. Targets (the issue's): latency within 15% for
every case, each tax within 25% or 20 us.

Fitting is honest: ``fit_params`` fits the one free parameter that bundles can tell (the Triton
GEMM efficiency) on a documented subset (``IN_SAMPLE``: fine-grained AG+GEMM cases at the
largest M of each (N, K, layout, world size) group); every row says whether it was in that
subset. Nothing is tuned per case.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from taxmodel.errors import InputError, TaxmodelError
from taxmodel.fsutil import atomic_write
from taxmodel.model.analytic import MODELS, model_params, predict, resolve_model_hardware
from taxmodel.model.analytic.params import ModelParams
from taxmodel.model.analytic.fitted import FITTED_FILE, fitted_for, load_fitted  # noqa: F401  (validate's public names)
from taxmodel.model.categories import TAXES
from taxmodel.trace.capture_meta import CaptureSettings

LATENCY_TOLERANCE = 0.15
TAX_TOLERANCE = 0.25
TAX_ABS_US = 20.0
QUANTITIES = ("latency",) + TAXES
#: ``Case.measured`` key: mean over the CTAs that wait on a flag of the time from their first
#: ``flag_wait`` record's start to their last record's end (bundles with in-kernel records).
RECORDS_AFTER_WAIT = "records:after_wait"
MARK_START, MARK_END = "<!-- validation:start -->", "<!-- validation:end -->"
@dataclass(frozen=True)
class FitRule:
    """One fitted model parameter: which bundles fit it (the in-sample subset) and its range."""

    param: str
    workload: str
    variants: tuple[str, ...]
    group_keys: tuple[str, ...]  # shape keys that define a group (plus world size and hardware)
    top_key: str  # in each group, the bundles with the largest (``pick``) value of this key are in-sample
    low: float
    high: float
    text: str
    # Fit on one measured quantity instead of the iteration's latency (None: the latency): a key of
    # ``Case.measured`` (``kernel:<name>``, a kernel's own device time; ``records:after_wait``, the
    # in-kernel records' wait-and-merge) and the prediction detail that models it (seconds). Cases
    # without that quantity are not in the subset.
    target: str | None = None
    detail: str | None = None
    # Which bundles of a group are in-sample: the largest ``top_key`` ("max") or the smallest ("min").
    pick: str = "max"
    # Shape keys the subset must have these values for (missing keys count as 0).
    only: tuple[tuple[str, int], ...] = ()
    # Only captures whose ranks a device gate started together (``profile --align device``): for
    # quantities that rank skew would inflate.
    device_aligned: bool = False

    def applies(self, case: "Case") -> bool:
        return (case.workload == self.workload and case.variant in self.variants
                and all(int(case.shape.get(k, 0)) == v for k, v in self.only)
                and (self.target is None or self.target in case.measured)
                and (not self.device_aligned or case.align == "device"))


FIT_RULES = (
    FitRule("triton_gemm_efficiency", "ag_gemm", ("pull", "push"), ("N", "K", "tp"), "M", 0.3, 1.3,
            "ag_gemm pull/push bundles at the largest M of their (N, K, tp, world size) group fit the Triton GEMM "
            "efficiency"),
    FitRule("triton_stream_efficiency", "flash_decode", ("bsp",), ("batch", "q_heads", "kv_heads", "head_dim"), "kv_len",
            0.3, 1.5, "flash_decode bsp bundles at the longest KV of their (batch, heads, world size) group fit the "
            "streaming efficiency of the Triton decode kernels (relative to the calibrated HBM copy bandwidth) on the "
            "split-KV kernel's own duration, which rank skew does not inflate",
            target="kernel:flash_decode_split_kv", detail="split_kv"),
    FitRule("ll_merge_step_s", "flash_decode", ("fused",), ("batch", "q_heads", "kv_heads", "head_dim"), "kv_len",
            0.1e-6, 5e-6, "flash_decode fused bundles with in-kernel records (LL words, the pair's last worker "
            "merging; device-gated captures) at the shortest KV of their (batch, heads, world size) group fit the "
            "step of merging one rank's partial on the records' wait and merge (a merging CTA's first flag wait to "
            "its last record)",
            target=RECORDS_AFTER_WAIT, detail="wait_merge", pick="min", device_aligned=True,
            only=(("fused_slices", 0), ("fused_combiners", 0), ("fused_protocol", 0))),
    FitRule("rs_gemm_efficiency", "gemm_rs", ("fused",), ("N", "K"), "M", 0.3, 1.3,
            "gemm_rs fused bundles at the largest M of their (N, K, world size) group fit the Triton GEMM efficiency "
            "of its GEMM kernel on that kernel's own duration (its pushes included as modeled)",
            target="kernel:gemm_rs_kernel", detail="gemm_kernel"),
    FitRule("ll_push_bytes_per_s", "flash_decode", ("fused",), ("batch", "q_heads", "kv_heads", "head_dim"), "kv_len",
            20e9, 2000e9, "flash_decode fused bundles with in-kernel records (LL words, the pair's last worker pushing; "
            "device-gated captures) at the shortest KV of their (batch, heads, world size) group, where every pair "
            "pushes at once, fit the GPU's bandwidth for LL pushes on the longest push (a launch's longest "
            "store_push records; only where the pushes are bandwidth-bound, not one SM's store rate)",
            target="records:flash_decode_fused:store_push:max", detail="push", pick="min", device_aligned=True,
            only=(("fused_slices", 0), ("fused_combiners", 0), ("fused_protocol", 0))),
    FitRule("reduce_program_bytes_per_s", "gemm_rs", ("fused",), ("N", "K"), "M", 3e9, 300e9,
            "gemm_rs fused bundles with in-kernel records at the smallest M of their (N, K, world size) group (the "
            "fewest reduction programs) fit one reduction program's rate on its combine records (a program's sum of "
            "its tile's W slots)",
            target="records:rs_reduce_kernel:combine", detail="reduce_program", pick="min"),
)
IN_SAMPLE_RULE = "; ".join(r.text for r in FIT_RULES) + (" (each: the median of the per-case values that make the "
                                                          "predicted latency, or the named quantity's prediction (a "
                                                          "kernel's duration, the records' wait and merge, a phase's "
                                                          "records), "
                                                          "equal the measured one; only CUDA-graph "
                                                          "captures when the subset has any, since eager captures carry "
                                                          "the profiler's host cost)")


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

    @property
    def in_sample(self) -> bool:
        return bool(self.fits)
    graph_launch: bool = False  # captured with `taxmodel profile --graph` (one graph launch per iteration)
    transport: str | None = None  # AG+GEMM fine-grained transport the bundle ran with, when recorded
    align: str = "host"  # how traced steps started (meta capture.align; `taxmodel profile --align`)
    gate_hold_s: float | None = None  # the device gate's hold (capture.gate_hold_us), when aligned on the device

    @property
    def settings(self) -> CaptureSettings:
        """How the bundle was captured, as the model reads it (bundles from before the transport was
        recorded ran the default, the copy engines)."""
        return CaptureSettings(instrumented=self.instrumented, graph_launch=self.graph_launch, transport=self.transport,
                               align=self.align, gate_hold_s=self.gate_hold_s)

    @property
    def shape_label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.shape.items()))

    @property
    def launches(self) -> str:
        """How the bundle's iterations were launched: graph or eager, ``+gate`` when the device gate
        aligned the ranks' starts."""
        return ("graph" if self.graph_launch else "eager") + ("+gate" if self.align == "device" else "")

    @property
    def label(self) -> str:
        return f"{self.workload}/{self.variant} {self.shape_label} W={self.world_size}"


@dataclass
class Validation:
    cases: list[Case]
    table: pd.DataFrame  # one row per (case, quantity)
    skipped: list[str]
    fitted: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(len(self.table)) and bool(self.table["ok"].all())


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


def load_case(path: Path, search: tuple[Path, ...] = ()) -> Case | str:
    """A Case for the bundle at ``path``, or the reason it cannot be validated."""
    from taxmodel.model.ledger import compute_ledger
    from taxmodel.trace.bundle import load_bundle

    bundle = load_bundle(path)
    meta = bundle.meta
    wl, var, shape = meta.get("workload"), meta.get("variant"), meta.get("shape") or {}
    capture = meta.get("capture") or {}
    if wl not in MODELS:
        return f"{path}: workload {wl!r} has no analytic model"
    if capture.get("emulated_gpu") or (meta.get("hardware") or {}).get("emulated"):
        return f"{path}: CPU-emulated capture (times say nothing about GPUs)"
    if capture.get("inject"):
        return f"{path}: injected taxes ({capture.get('inject')}) are not part of the model"
    if not shape:
        return f"{path}: meta has no shape"
    try:
        hw, note = resolve_model_hardware(None, meta, search=search)
    except InputError as exc:
        return f"{path}: {exc}"
    ledger = compute_ledger(bundle, hw, lenient=True)
    st = CaptureSettings.from_meta(meta, instrumented=bool((bundle.events["kind"] == "record").any()))
    return Case(path, wl, str(var), {k: int(v) for k, v in shape.items() if _intlike(v)}, int(bundle.world_size),
                meta.get("cost"), hw, note, _measured(ledger, bundle.events), instrumented=st.instrumented,
                graph_launch=bool(st.graph_launch), transport=st.transport, align=st.align, gate_hold_s=st.gate_hold_s)


def _intlike(v: Any) -> bool:
    try:
        int(v)
        return True
    except (TypeError, ValueError):
        return False


def find_cases(root: str | os.PathLike) -> tuple[list[Case], list[str]]:
    from taxmodel.trace.bundle import find_bundles

    root = Path(root)
    if not root.exists():
        raise InputError(f"{root}: no such directory; pass the directory that holds the profile bundles")
    cases, skipped = [], []
    for p in find_bundles(root):
        try:
            got = load_case(p, search=(root,))
        except TaxmodelError as exc:
            got = f"{p}: {exc}"
        (skipped.append(got) if isinstance(got, str) else cases.append(got))
    return cases, skipped


# --- fitting ---------------------------------------------------------------------------------------

def _rules_of(case: Case) -> list[FitRule]:
    return [r for r in FIT_RULES if r.applies(case)]


def mark_in_sample(cases: list[Case]) -> None:
    """Apply FIT_RULES: flag each rule's fitting subset."""
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        for rule in _rules_of(c):
            key = (rule.param, c.variant, *(c.shape.get(k, 0) for k in rule.group_keys), c.world_size,
                   c.hardware.name, c.graph_launch)
            groups.setdefault(key, []).append(c)
    for key, group in groups.items():
        rule = next(r for r in FIT_RULES if r.param == key[0])
        top = (min if rule.pick == "min" else max)(c.shape.get(rule.top_key, 0) for c in group)
        for c in group:
            if c.shape.get(rule.top_key, 0) == top:
                c.fits.add(rule.param)


def _params_for(case: Case, fitted: Mapping[str, float]) -> ModelParams:
    """The model's parameters for one bundle: its hardware, how it was captured, and ``fitted``."""
    return model_params(case.hardware, case.settings, dict(fitted))[0]


def predict_case(case: Case, fitted: Mapping[str, float]):
    """The analytic prediction for one measured bundle: its workload, shape, world size, hardware
    and capture settings, with ``fitted`` parameter values over the defaults."""
    return predict(case.workload, case.variant, case.shape, case.world_size, case.hardware,
                   _params_for(case, fitted), cost=case.cost)


def fit_params(cases: list[Case]) -> dict[str, float]:
    """Each FIT_RULES parameter from its in-sample cases (bisection per case on the predicted
    latency; the median of the per-case values). A parameter is left out when no in-sample case's
    latency it can explain (e.g. a link-bound pull)."""
    fitted: dict[str, float] = {}
    for rule in FIT_RULES:
        values = []
        subset = [c for c in cases if rule.param in c.fits]
        if any(c.graph_launch for c in subset):  # host-free captures, when there are any, fit the GPU-side rate
            subset = [c for c in subset if c.graph_launch]
        for case in subset:
            if rule.target is not None:
                target = case.measured[rule.target]
                f = lambda e: predict_case(case, {rule.param: e}).details[rule.detail] * 1e9 - target  # noqa: E731
            else:
                target = case.measured["latency"]
                f = lambda e: predict_case(case, {rule.param: e}).window_ns - target  # noqa: E731
            lo, hi = rule.low, rule.high
            f_lo, f_hi = f(lo), f(hi)
            if f_lo * f_hi > 0:  # same side at both ends: the parameter cannot explain this case
                continue
            rising = f_hi > f_lo  # a rate (efficiency) shortens the time, a step time lengthens it
            for _ in range(18):
                mid = 0.5 * (lo + hi)
                if (f(mid) > 0) != rising:
                    lo = mid
                else:
                    hi = mid
            values.append(0.5 * (lo + hi))
        if values:
            values.sort()
            mid = len(values) // 2
            median = values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])
            fitted[rule.param] = float(f"{median:.3g}")  # 3 significant digits (parameters in s are ~1e-6)
    return fitted


# --- the table -------------------------------------------------------------------------------------

def compare(case: Case, fitted: Mapping[str, float]) -> list[dict[str, Any]]:
    pred = predict_case(case, fitted).taxes_ns()
    pred["latency"] = pred["window"]
    rows = []
    for q in QUANTITIES:
        m, p = case.measured.get(q, 0.0), pred.get(q, 0.0)
        err_us = (p - m) / 1e3
        rel = (p - m) / m if m > 0 else (0.0 if p == 0 else math.inf)
        ok = abs(rel) <= LATENCY_TOLERANCE if q == "latency" else (abs(rel) <= TAX_TOLERANCE or abs(err_us) <= TAX_ABS_US)
        rows.append({"workload": case.workload, "variant": case.variant,
                     "shape": case.shape_label, "world_size": case.world_size,
                     "hardware": f"{case.hardware.name} ({case.hardware.source})", "quantity": q,
                     "measured_us": m / 1e3, "predicted_us": p / 1e3, "error_us": err_us, "error_pct": rel * 100.0,
                     "ok": bool(ok), "sample": "in" if case.in_sample else "out", "bundle": case.path.name,
                     "launches": case.launches})
    return rows


def validate(root: str | os.PathLike = "profiles", *, fit: bool = True,
             fitted_from: str | os.PathLike | None = None) -> Validation:
    """Predict every modeled bundle under ``root`` and compare (see the module docstring).

    ``fitted_from``: fit nothing and use the parameters of that file (``write_fitted``'s format)
    on the bundles of the hardware it was fitted on, so every bundle is predicted out of sample: the
    test of bundles captured after the fit (a new world size, new shapes)."""
    cases, skipped = find_cases(root)
    if fitted_from is not None:
        fitted, fitted_hardware = load_fitted(fitted_from)
        rows = [r for c in cases for r in compare(c, fitted if c.hardware.name in fitted_hardware else {})]
    else:
        if fit:
            mark_in_sample(cases)
        fitted = fit_params(cases) if fit else {}
        rows = [r for c in cases for r in compare(c, fitted)]
    table = pd.DataFrame(rows, columns=["workload", "variant", "shape", "world_size", "hardware", "quantity",
                                        "measured_us", "predicted_us", "error_us", "error_pct", "ok", "sample", "bundle",
                                        "launches"])
    if fitted_from is not None:
        notes = [f"fitted nothing: parameters from {Path(fitted_from).name} on the hardware it was fitted on "
                 f"({', '.join(fitted_hardware) or 'none'}): " + (", ".join(f"{k} = {v:.3g}" for k, v in fitted.items())
                                                                  or "defaults") + "; every bundle is out of sample"]
        return Validation(cases, table, skipped, fitted, notes)
    notes = [f"fitting subset: {IN_SAMPLE_RULE}"]
    if fitted:
        notes.append("fitted: " + ", ".join(f"{k} = {v:.3g}" for k, v in fitted.items()))
    elif fit:
        notes.append("fitted: nothing (no in-sample case whose latency the fitted parameter explains); defaults used")
    return Validation(cases, table, skipped, fitted, notes)


def fitted_document(v: Validation) -> dict[str, Any]:
    """The fitted parameters as ``taxmodel predict`` reads them: the values, the hardware of the
    in-sample bundles they were fitted on (predict applies them only to that hardware), and how."""
    hardware = sorted({c.hardware.name for c in v.cases if c.in_sample})
    return {"fitted": dict(sorted(v.fitted.items())), "hardware": hardware,
            "how": f"taxmodel validate on {len(v.cases)} bundles under profiles/: {IN_SAMPLE_RULE}"}


def write_fitted(path: str | os.PathLike, v: Validation) -> Path:
    """Write ``fitted_document(v)`` to ``path`` (JSON; replaced atomically)."""
    import json

    return atomic_write(path, json.dumps(fitted_document(v), indent=2, sort_keys=True) + "\n", what="fitted parameters")


def markdown_table(v: Validation) -> str:
    """The validation as Markdown (deterministic: what benchmarks/results/model_validation.md holds between the markers)."""
    lines = []
    if v.table.empty:
        lines.append("No measured bundles to validate against yet.")
    else:
        lines.append("| workload/variant | shape | W | launches | quantity | measured us | predicted us | error | within target | fit |")
        lines.append("|---|---|---:|---|---|---:|---:|---:|---|---|")
        for r in v.table.itertuples(index=False):
            err = f"{r.error_pct:+.1f}%" if math.isfinite(r.error_pct) else "n/a"
            lines.append(f"| {r.workload}/{r.variant} | {r.shape} | {r.world_size} | {r.launches} | {r.quantity} | "
                         f"{r.measured_us:.1f} | {r.predicted_us:.1f} | {err} ({r.error_us:+.1f} us) | "
                         f"{'yes' if r.ok else '**no**'} | {'in-sample' if r.sample == 'in' else 'out-of-sample'} |")
        n_ok = int(v.table["ok"].sum())
        lines.append("")
        lines.append(f"{n_ok} of {len(v.table)} comparisons within target (latency 15%; each tax 25% or 20 us).")
        for mode, g in v.table.groupby("launches", sort=True):
            lat = g[g["quantity"] == "latency"]
            lines.append(f"- {mode} launches: {int(g['ok'].sum())} of {len(g)} comparisons, latency {int(lat['ok'].sum())} "
                         f"of {len(lat)}; by workload/variant (latency within target / cases): " + ", ".join(
                             f"{wv} {int(x['ok'].sum())}/{len(x)}" for wv, x in
                             lat.assign(wv=lat["workload"] + "/" + lat["variant"]).groupby("wv", sort=True)))
    lines.append("")
    lines.extend(f"- {n}" for n in v.notes)
    hws = sorted({c.hardware_note for c in v.cases})
    lines.extend(f"- {h}" for h in hws)
    return "\n".join(lines) + "\n"


def update_docs(doc: str | os.PathLike, v: Validation) -> Path:
    """Replace the text between the validation markers of ``doc`` with the current table."""
    doc = Path(doc)
    text = doc.read_text()
    pat = re.compile(re.escape(MARK_START) + r".*?" + re.escape(MARK_END), re.S)
    if not pat.search(text):
        raise InputError(f"{doc}: no '{MARK_START}' ... '{MARK_END}' markers to put the table between")
    new = pat.sub(lambda _: f"{MARK_START}\n{markdown_table(v)}{MARK_END}", text)
    return atomic_write(doc, new, what="validation table")


def docs_table(doc: str | os.PathLike) -> str:
    """The text between the markers of ``doc`` (what ``update_docs`` last wrote)."""
    text = Path(doc).read_text()
    m = re.search(re.escape(MARK_START) + r"\n(.*?)" + re.escape(MARK_END), text, re.S)
    if not m:
        raise InputError(f"{doc}: no validation markers")
    return m.group(1)
