"""Fitting the analytic model's free parameters on a documented subset of measured bundles.

Each ``FitRule`` names one parameter, the bundles that can tell it (its in-sample subset: e.g. the
fine-grained AG+GEMM cases at the largest M of each (N, K, layout, world size) group) and the
quantity it is fitted on (the iteration's latency, a kernel's own duration, or an in-kernel
records' phase). ``mark_in_sample`` flags each rule's subset, ``fit_params`` bisects each
in-sample case for the value that makes the prediction equal the measurement and keeps the
median. Nothing is tuned per case; every validated row says whether it was in a subset.
"""
from __future__ import annotations

from dataclasses import dataclass

from taxmodel.kernels.names import (COPY_BLOCKS_KERNEL, FLASH_DECODE_FUSED, FLASH_DECODE_SPLIT, GEMM_RS_KERNEL,
                                    RS_REDUCE_KERNEL)
from taxmodel.model.analytic.params import calibrated_mechanisms
from taxmodel.model.cases import RECORDS_AFTER_WAIT, Case, predict_case
from taxmodel.trace.capture_meta import GATED_ALIGNMENTS


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
                and (not self.device_aligned or case.align in GATED_ALIGNMENTS))


FIT_RULES = (
    FitRule("triton_gemm_efficiency", "ag_gemm", ("pull", "push"), ("N", "K", "tp"), "M", 0.3, 1.3,
            "ag_gemm pull/push bundles at the largest M of their (N, K, tp, world size) group fit the Triton GEMM "
            "efficiency"),
    FitRule("triton_stream_efficiency", "flash_decode", ("bsp",), ("batch", "q_heads", "kv_heads", "head_dim"), "kv_len",
            0.3, 1.5, "flash_decode bsp bundles at the longest KV of their (batch, heads, world size) group fit the "
            "streaming efficiency of the Triton decode kernels (relative to the calibrated HBM copy bandwidth) on the "
            "split-KV kernel's own duration, which rank skew does not inflate",
            target=f"kernel:{FLASH_DECODE_SPLIT}", detail="split_kv"),
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
            target=f"kernel:{GEMM_RS_KERNEL}", detail="gemm_kernel"),
    FitRule("ll_push_bytes_per_s", "flash_decode", ("fused",), ("batch", "q_heads", "kv_heads", "head_dim"), "kv_len",
            20e9, 2000e9, "flash_decode fused bundles with in-kernel records (LL words, the pair's last worker pushing; "
            "device-gated captures) at the shortest KV of their (batch, heads, world size) group, where every pair "
            "pushes at once, fit the GPU's bandwidth for LL pushes on the longest push (a launch's longest "
            "store_push records; only where the pushes are bandwidth-bound, not one SM's store rate)",
            target=f"records:{FLASH_DECODE_FUSED}:store_push:max", detail="push", pick="min", device_aligned=True,
            only=(("fused_slices", 0), ("fused_combiners", 0), ("fused_protocol", 0))),
    FitRule("reduce_program_bytes_per_s", "gemm_rs", ("fused",), ("N", "K"), "M", 3e9, 300e9,
            "gemm_rs fused bundles with in-kernel records at the smallest M of their (N, K, world size) group (the "
            "fewest reduction programs) fit one reduction program's rate on its combine records (a program's sum of "
            "its tile's W slots)",
            target=f"records:{RS_REDUCE_KERNEL}:combine", detail="reduce_program", pick="min"),
    FitRule("copy_program_bytes_per_s", "ag_gemm", ("pull", "push"), ("N", "K", "tp"), "M", 1e9, 200e9,
            "ag_gemm pull/push bundles with the Triton copy kernel (the sm transport) at the largest M of their (N, K, "
            "tp, world size) group fit the rate of one copy program beside the GEMM on the copy kernel's own duration",
            target=f"kernel:{COPY_BLOCKS_KERNEL}", detail="transfer"),
)
IN_SAMPLE_RULE = "; ".join(r.text for r in FIT_RULES) + (" (each: the median of the per-case values that make the "
                                                          "predicted latency, or the named quantity's prediction (a "
                                                          "kernel's duration, the records' wait and merge, a phase's "
                                                          "records), "
                                                          "equal the measured one; only CUDA-graph "
                                                          "captures when the subset has any, since eager captures carry "
                                                          "the profiler's host cost)")


def _rules_of(case: Case) -> list[FitRule]:
    """The rules whose subset ``case`` can be in: not those of a parameter its GPU's calibration
    measured (``params.calibrated_mechanisms``: a measurement is not replaced by a fit)."""
    measured = calibrated_mechanisms(case.hardware)
    return [r for r in FIT_RULES if r.applies(case) and r.param not in measured]


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


def fit_params(cases: list[Case]) -> dict[str, dict[str, float]]:
    """Per GPU (hardware name), each FIT_RULES parameter from its in-sample cases on that GPU
    (bisection per case on the predicted latency; the median of the per-case values). A parameter
    is left out when no in-sample case's latency it can explain (e.g. a link-bound pull)."""
    out: dict[str, dict[str, float]] = {}
    for hw in sorted({c.hardware.name for c in cases}):
        out[hw] = _fit_one([c for c in cases if c.hardware.name == hw])
    return out


def _fit_one(cases: list[Case]) -> dict[str, float]:
    """``fit_params`` on the cases of one GPU."""
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
