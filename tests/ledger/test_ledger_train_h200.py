"""The per-kernel ledger on a real training step nobody tuned for taxmodel (profiles/h200x1-train:
an 8-layer bf16 decoder with AdamW on one H200, torch.profiler with record_shapes and with_flops)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from taxmodel.hardware.specs import find_preset
from taxmodel.ledger.kernel_costs import kernel_floors
from taxmodel.ledger.compute import compute_ledger
from taxmodel.trace import importers
from taxmodel.trace.bundle import Bundle, make_meta
from taxmodel.trace.schema import normalize_events
from taxmodel.trace.tensor_list_kernels import CHUNK

TRAIN = Path(__file__).resolve().parents[2] / "profiles" / "h200x1-train"


def _bundle(name):
    f = TRAIN / name
    if not f.exists():
        pytest.skip(f"{f} not present")
    events, meta, _ = importers.import_traces([f])
    return Bundle(normalize_events(events), make_meta(**meta))


def _ledger(name):
    return compute_ledger(_bundle(name))


def _model_parameters() -> tuple[int, int, int]:
    """(tensors, chunks of 65,536 elements, elements) of the parameters of the model that
    benchmarks/train_step.py trains (d 1024, 8 layers, vocabulary 32000, sequence 1024), from its
    module definitions: an account independent of the trace."""
    d, layers, vocab, seq = 1024, 8, 32000, 1024
    block = [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    shapes = [(vocab, d), (seq, d)] + block * layers + [(d,), (d,), (vocab, d)]
    numel = [math.prod(s) for s in shapes]
    return len(shapes), sum(-(-n // CHUNK) for n in numel), sum(numel)


@pytest.fixture(scope="module")
def eager_b8():
    return _ledger("trace_eager_b8.json.gz")


def test_every_kernel_has_a_floor_the_optimizers_from_its_launch_grid(eager_b8):
    led = eager_b8
    assert led.hardware.name.startswith("H200")  # from the trace's own deviceProperties
    k = led.kernels
    total = k["time_ns"].sum()
    foreach = k["op"].str.startswith("aten::_foreach")
    # torch 2.11 records AdamW's long tensor lists as empty: their kernels are floored from their launch grid
    assert (k.loc[foreach, "basis"] == "launch grid").all() and k.loc[foreach, "costed"].all()
    assert (k.loc[~foreach & k["costed"], "basis"] != "launch grid").all()
    assert k.loc[k["costed"] & (k["floor_ns"] > 0), "time_ns"].sum() / total >= 0.99
    assert any(c.startswith("floored from their launch grid:") for c in led.caveats)


@pytest.mark.parametrize("name", ["trace_eager_b1.json.gz", "trace_compile_b1.json.gz", "trace_compile_b8.json.gz"])
def test_useful_is_positive_on_95_percent_of_gpu_time(name):
    k = _ledger(name).kernels
    assert k.loc[k["useful_ns"] > 0, "time_ns"].sum() / k["time_ns"].sum() >= 0.95


def test_the_launch_grid_bound_against_the_models_own_parameters():
    """Every foreach call of AdamW runs over all 101 parameters: its launches' CTAs add up to the
    parameters' chunk count exactly, and the lower bound stays below their element count."""
    tensors, chunks, elements = _model_parameters()
    assert (tensors, chunks) == (101, 2618)
    b = _bundle("trace_eager_b8.json.gz")
    ev = b.events
    gpu = ev[ev["kind"].isin(["kernel", "memcpy", "memset"])]
    fl = kernel_floors(gpu, find_preset("h200-calibrated"))
    one = gpu[(gpu["iteration"] == gpu["iteration"].max()) & gpu["op"].str.startswith("aten::_foreach")]
    blocks = one["grid"].str.split(",").str[0].astype(int)
    per_op = blocks.groupby(one["op"]).sum()
    assert len(per_op) >= 6 and (per_op % chunks == 0).all() and (per_op > 0).all()
    calls = per_op // chunks
    floor_bytes = fl.loc[one.index, "floor_ns"] * find_preset("h200-calibrated").hbm_bytes_per_s / 1e9
    mul = one["name"].str.contains(r"BinaryOpScalarFunctor<c10::BFloat16, 1, 1, 0>, std::multiplies", regex=True)
    lb_elements = floor_bytes[mul].sum() / (2 * 2) / calls["aten::_foreach_mul_"]  # bf16, read + written
    assert 0.6 * elements <= lb_elements <= elements, (lb_elements, elements)
    assert (fl.loc[one.index, "basis"] == "launch grid").all()


def test_gemm_floors_against_the_calibrated_cublas_peak(eager_b8):
    k = eager_b8.kernels
    gemm = k[k["op"].isin(["aten::mm", "aten::addmm", "aten::linear", "aten::bmm"]) & k["costed"]]
    assert len(gemm) >= 3
    ratio = gemm["useful_ns"].sum() / gemm["time_ns"].sum()
    # batch 8, M = 8192: cuBLAS runs these near the peak the calibration measured with cuBLAS
    assert 0.6 <= ratio <= 1.0, ratio


def test_the_profilers_overhead_is_flagged_on_the_launch_tax(eager_b8):
    from taxmodel.report.headline import ledger_table

    assert any("may be inflated by the profiler" in c and "record_shapes" in c for c in eager_b8.caveats)
    assert eager_b8.launch_tax_inflated and eager_b8.to_dict()["launch_tax_inflated"] is True
    table = ledger_table(eager_b8)
    assert table.loc[table["category"] == "Launch-overhead tax", "part"].tolist() == ["total (profiler-inflated?)"]


def test_a_graph_replay_is_uncosted_and_says_so_but_its_tensor_list_kernels():
    led = _ledger("trace_graph_b1.json.gz")
    k = led.kernels
    graph = k["reason"].str.contains("CUDA graph replay")
    tensor_lists = k["name"].str.contains("multi_tensor_apply_kernel")
    assert (k.loc[tensor_lists, "basis"] == "launch grid").all()
    assert (k.loc[~tensor_lists & ~k["costed"], "reason"].str.contains("CUDA graph replay")).all()
    assert k.loc[graph | tensor_lists, "time_ns"].sum() / k["time_ns"].sum() > 0.99
    assert led.locality == "not measured"
    assert not led.launch_tax_inflated  # one graph launch per step: the profiler's host work is not on the GPU's path
