"""The per-kernel ledger on a real training step nobody tuned for taxmodel (profiles/h200x1-train:
an 8-layer bf16 decoder with AdamW on one H200, torch.profiler with record_shapes and with_flops)."""
from __future__ import annotations

from pathlib import Path

import pytest

from taxmodel.model.ledger import compute_ledger
from taxmodel.trace import importers
from taxmodel.trace.bundle import Bundle, make_meta
from taxmodel.trace.schema import normalize_events

TRAIN = Path(__file__).resolve().parents[2] / "profiles" / "h200x1-train"


def _ledger(name):
    f = TRAIN / name
    if not f.exists():
        pytest.skip(f"{f} not present")
    events, meta, _ = importers.import_traces([f])
    return compute_ledger(Bundle(normalize_events(events), make_meta(**meta)))


@pytest.fixture(scope="module")
def eager_b8():
    return _ledger("trace_eager_b8.json.gz")


def test_every_kernel_outside_the_optimizers_tensor_lists_has_a_floor(eager_b8):
    led = eager_b8
    assert led.hardware.name.startswith("H200")  # from the trace's own deviceProperties
    k = led.kernels
    total = k["time_ns"].sum()
    foreach = k["op"].str.startswith("aten::_foreach")
    # torch 2.11 records AdamW's long tensor lists as empty: those kernels say so, nothing else is uncosted
    assert (k.loc[foreach, "reason"].str.contains("tensor-list shapes not recorded")).all()
    outside = k[~foreach]
    assert outside.loc[outside["costed"] & (outside["floor_ns"] > 0), "time_ns"].sum() / outside["time_ns"].sum() >= 0.99
    assert k.loc[k["costed"], "time_ns"].sum() / total >= 0.85
    assert any(c.startswith("uncosted:") and "aten::_foreach" in c for c in led.caveats)


def test_gemm_floors_against_the_calibrated_cublas_peak(eager_b8):
    k = eager_b8.kernels
    gemm = k[k["op"].isin(["aten::mm", "aten::addmm", "aten::linear", "aten::bmm"]) & k["costed"]]
    assert len(gemm) >= 3
    ratio = gemm["useful_ns"].sum() / gemm["time_ns"].sum()
    # batch 8, M = 8192: cuBLAS runs these near the peak the calibration measured with cuBLAS
    assert 0.6 <= ratio <= 1.0, ratio


def test_the_profilers_overhead_is_flagged_on_the_launch_tax(eager_b8):
    assert any("may be inflated by the profiler" in c and "record_shapes" in c for c in eager_b8.caveats)


def test_a_graph_replay_is_uncosted_and_says_so():
    led = _ledger("trace_graph_b1.json.gz")
    k = led.kernels
    graph = k["reason"].str.contains("CUDA graph replay")
    assert k.loc[graph, "time_ns"].sum() / k["time_ns"].sum() > 0.99
    assert led.locality == "not measured"
