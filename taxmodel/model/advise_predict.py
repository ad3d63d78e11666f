"""The analytic model's word on a fusion candidate that matches a built-in fine-grained workload.

A collective with its GEMM or attention kernels is what the built-in workloads fuse:
``AG+GEMM`` is All-Gather+GEMM (fine-grained pull and push), ``GEMM+RS`` GEMM+Reduce-Scatter
(fused), ``attention+AG`` Flash Decode (fused). For such a candidate the model predicts, at the
trace's shape and world size and with the capture's launch settings, the bulk-synchronous
iteration and the best fine-grained variant's; the predicted saving is their difference, shown
beside the bound read off the ledger. Only what the two sides share cancels in it (the vendor
GEMM's rate where both run it, the collective's alpha-beta curve); the fine-grained side's own
terms (the Triton GEMM's efficiency, its transport, its flag waits) do not, and on the committed
4x H200 captures they are what the prediction misses by (benchmarks/results/advise_h200x4.md).

The shape comes from the bundle's meta when the bundle is the same workload (taxmodel's own
captures). Anyone else's trace does not name GEMM shapes: until per-kernel op shapes are known
(the launching op's input shapes), the prediction is left out and the candidate says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from taxmodel.errors import InputError
from taxmodel.model import analytic
from taxmodel.model.analytic import fitted
from taxmodel.trace.capture_meta import CaptureSettings

#: Candidate kind -> (modeled workload, its fine-grained variants).
WORKLOAD_OF_KIND: dict[str, tuple[str, tuple[str, ...]]] = {
    "AG+GEMM": ("ag_gemm", ("pull", "push")),
    "GEMM+RS": ("gemm_rs", ("fused",)),
    "attention+AG": ("flash_decode", ("fused",)),
}
REFERENCE = "bsp"


@dataclass(frozen=True)
class FusionPrediction:
    """``model``: "workload/variant" of the best fine-grained variant ("" when none);
    ``fused_us`` its predicted iteration, ``bsp_us`` the predicted bulk-synchronous iteration,
    ``saving_us`` their difference, ``saving_lo_us``/``saving_hi_us`` the range the model's own
    latency errors allow (``saving_range``; NaN where none is recorded); ``missing``: why there is no
    prediction ("" when there is)."""

    model: str = ""
    fused_us: float = math.nan
    bsp_us: float = math.nan
    saving_us: float = math.nan
    missing: str = ""
    saving_lo_us: float = math.nan
    saving_hi_us: float = math.nan
    #: the GPU whose error band gave the range, where this hardware has none of its own
    range_borrowed_from: str | None = None

    @property
    def sign_uncertain(self) -> bool:
        """Whether the error band leaves even the saving's sign open."""
        return bool(self.saving_lo_us < 0 < self.saving_hi_us)


NO_PREDICTION = FusionPrediction()


def model_shape(workload: str, meta: Mapping[str, Any]) -> dict[str, int] | None:
    """The shape the model needs, when the bundle says it (its own workload), else None."""
    shape = meta.get("shape") or {}
    if meta.get("workload") != workload or not shape:
        return None
    try:
        return {k: int(v) for k, v in shape.items()}
    except (TypeError, ValueError):
        return None


def for_candidate(kind: str, meta: Mapping[str, Any], ranks: int, hardware: Any = None) -> FusionPrediction:
    """The prediction for a candidate of ``kind`` in the bundle of ``meta`` whose ledger covers
    ``ranks`` ranks (the world size when the meta does not say it)."""
    if kind not in WORKLOAD_OF_KIND:
        return NO_PREDICTION
    workload, variants = WORKLOAD_OF_KIND[kind]
    shape = model_shape(workload, meta)
    if shape is None:
        return FusionPrediction(missing=f"shapes for the {workload} model (the trace does not name this {kind}'s "
                                        "shapes; per-kernel op shapes would)")
    world = int(meta.get("world_size") or ranks)
    try:
        return predict_fusion(workload, variants, shape, world, meta, hardware)
    except (InputError, KeyError, ValueError) as exc:  # a shape the model cannot take
        return FusionPrediction(missing=f"a {workload} prediction ({exc})")


def predict_fusion(workload: str, variants: tuple[str, ...], shape: Mapping[str, int], world: int,
                   meta: Mapping[str, Any], hardware: Any = None, use_fitted: bool = True) -> FusionPrediction:
    """Predicted bsp and best fine-grained iteration of ``workload`` at ``shape`` on ``world`` GPUs,
    on the hardware the model picks for the bundle (a calibrated spec when one ships), launched
    as the bundle was captured, with the parameters ``taxmodel validate`` fitted for that hardware
    (``use_fitted``; else the documented defaults and the calibration only)."""
    hw, _ = analytic.resolve_model_hardware(hardware, meta)
    settings = CaptureSettings.from_meta(meta)
    params, _ = analytic.model_params(hw, settings, None if use_fitted else {})
    cost = meta.get("cost") or None

    def window_us(variant: str) -> float:
        return analytic.predict(workload, variant, shape, world, hw, params, cost=cost).window_ns / 1e3

    bsp = window_us(REFERENCE)
    fused, best = min((window_us(v), v) for v in variants)
    lo, hi, lender = saving_range(workload, best, bsp, fused, hw.name, settings) if use_fitted \
        else (math.nan, math.nan, None)
    return FusionPrediction(f"{workload}/{best}", fused, bsp, bsp - fused, saving_lo_us=lo, saving_hi_us=hi,
                            range_borrowed_from=lender)


def saving_range(workload: str, variant: str, bsp_us: float, fused_us: float, hardware_name: str,
                 settings: CaptureSettings) -> tuple[float, float, str | None]:
    """The saving the measured latencies could show, given the model's latency error band for
    ``bsp`` and ``variant`` (``validate``'s out-of-sample CUDA-graph cases, 10th-90th percentile
    of predicted / measured - 1): a prediction ``p`` with error ``e`` measures ``p / (1 + e)``, so
    the saving lies between bsp at its lowest minus the fused at its highest and the reverse.
    NaN for an eager capture (the band comes from graph captures) or where no band is recorded. A
    GPU with no band of its own takes another's (``fitted.error_bands_for``), named third (else None)."""
    if not settings.graph_launch:
        return math.nan, math.nan, None
    bands, lender = fitted.error_bands_for(hardware_name)
    b, f = bands.get(f"{workload}/{REFERENCE}"), bands.get(f"{workload}/{variant}")
    if b is None or f is None:
        return math.nan, math.nan, None
    return bsp_us / (1 + b[1]) - fused_us / (1 + f[0]), bsp_us / (1 + b[0]) - fused_us / (1 + f[1]), lender
