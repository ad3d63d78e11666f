"""Invariants of the analytic model and its building blocks (exact values where known)."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taxmodel.api import predict as api_predict
from taxmodel.errors import InputError
from taxmodel.model.analytic import parse_range, predict, resolve_model_hardware
from taxmodel.model.analytic.collective_model import CollectiveModel
from taxmodel.model.analytic.costs import (
    gemm_time,
    pipeline_time,
    push_wave_time,
    stream_time,
    wave_inflation,
)
from taxmodel.model.analytic.params import ModelParams
from taxmodel.model.analytic.timeline import (
    KernelPlan,
    as_graph_launch,
    release_offsets,
    simulate,
    start_offsets,
)
from taxmodel.model.analytic.topology import topology
from taxmodel.hardware.specs import find_preset

H200 = find_preset("H200 SXM")  # the datasheet preset (a calibrated H200 file also ships)
AG = {"M": 4096, "N": 8192, "K": 8192, "tp": 0}
FD = {"batch": 1, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 4096}
CASES = [("ag_gemm", v, AG) for v in ("bsp", "pull", "push", "torch_fused")] + [("flash_decode", v, FD) for v in ("bsp", "fused")]


@pytest.mark.parametrize("workload,variant,shape", CASES)
def test_parts_sum_to_the_predicted_window(workload, variant, shape):
    p = predict(workload, variant, shape, 4, H200)
    s = p.summary()
    assert list(s.columns) == ["category", "subcategory", "mean_ns", "pct"]
    assert s["mean_ns"].sum() == pytest.approx(p.window_ns, abs=1e-6)
    assert s["pct"].sum() == pytest.approx(100.0)
    assert (s["mean_ns"] >= 0).all()
    assert p.window_ns > 0 and p.assumptions


@settings(max_examples=8, deadline=None)
@given(world=st.sampled_from([2, 4, 8]), m=st.sampled_from([1024, 4096, 16384]), variant=st.sampled_from(["bsp", "pull", "push"]))
def test_ag_gemm_latency_grows_with_m(world, m, variant):
    a = predict("ag_gemm", variant, {**AG, "M": m}, world, H200).window_ns
    b = predict("ag_gemm", variant, {**AG, "M": 2 * m}, world, H200).window_ns
    assert b > a


@pytest.mark.parametrize("variant", ["bsp", "fused"])
def test_flash_decode_latency_grows_with_kv_len(variant):
    # non-decreasing: at small sizes the host's launches, not the kernels, set the pace (bsp)
    w = [predict("flash_decode", variant, {**FD, "kv_len": n}, 4, H200).window_ns for n in (4096, 16384, 65536, 262144)]
    assert all(x <= y + 1e-6 for x, y in zip(w, w[1:])) and w[-1] > 2 * w[0]


@pytest.mark.parametrize("workload,variant,shape", [("ag_gemm", "bsp", AG), ("ag_gemm", "pull", AG), ("ag_gemm", "push", AG),
                                                    ("flash_decode", "bsp", FD), ("flash_decode", "fused", FD)])
def test_world_size_one_has_no_communication(workload, variant, shape):
    t = predict(workload, variant, shape, 1, H200).taxes_ns()
    assert t["bsp_tax"] == 0
    assert t["skew_wait"] == 0 and t["exposed_comm"] == 0 and t["barrier_idle"] == 0


def test_bsp_tax_grows_with_world_size_for_fixed_work_per_rank():
    taxes = [predict("ag_gemm", "bsp", {**AG, "M": 1024 * w}, w, H200).taxes_ns()["bsp_tax"] for w in (2, 4, 8, 16, 72)]
    assert all(x < y for x, y in zip(taxes, taxes[1:])), taxes
    fd = [predict("flash_decode", "bsp", FD, w, H200).taxes_ns()["bsp_tax"] for w in (2, 4, 8)]
    assert fd[0] < fd[1] < fd[2]


def test_fine_grained_needs_one_domain_and_mi300x_domain_is_8():
    with pytest.raises(InputError, match="domains"):
        predict("ag_gemm", "pull", AG, 16, find_preset("mi300x"))
    p = predict("ag_gemm", "bsp", {**AG, "M": 16384}, 16, find_preset("mi300x"))
    assert any("scale-out network" in a for a in p.assumptions)
    predict("ag_gemm", "pull", {**AG, "M": 72 * 128}, 72, find_preset("b200"))  # NVL72: one domain


def test_unknown_variant_and_workload():
    with pytest.raises(InputError, match="no variant"):
        predict("ag_gemm", "nope", AG, 2, H200)
    with pytest.raises(InputError, match="no analytic model"):
        predict("nope", "bsp", AG, 2, H200)


# --- building blocks ----------------------------------------------------------------------------

def test_wave_inflation_exact():
    # 8192x8192 with 256x128 tiles: 32*64 = 2048 tiles on 132 SMs -> 16 waves of 132 = 2112 slots
    assert wave_inflation(8192, 8192, (256, 128), 132) == pytest.approx(2112 / 2048)
    # one partial tile: 100x100 in a 128x128 tile, one SM
    assert wave_inflation(100, 100, (128, 128), 1) == pytest.approx(128 * 128 / 10000)


def test_gemm_time_calibrated_rate_is_reproduced_on_the_calibration_shape():
    spec = _calibrated_spec()
    params = ModelParams.from_hardware(spec)
    t = gemm_time(8192, 8192, 8192, "bf16", spec, params)
    assert t == pytest.approx(2 * 8192 ** 3 / spec.flops_per_s("bf16") + params.kernel_overhead_s, rel=1e-12)
    tt = gemm_time(8192, 8192, 8192, "bf16", spec, params, kind="triton")
    assert tt > t


def test_start_offsets_are_exponential_order_statistics():
    offs = start_offsets(4, 12.0)
    assert offs == pytest.approx([0.0, 12 / 3, 12 / 3 + 12 / 2, 12 / 3 + 12 / 2 + 12 / 1])
    # the spread is scale * H_{W-1}
    assert offs[-1] == pytest.approx(12 * (1 + 1 / 2 + 1 / 3))


def test_collective_alpha_beta_without_curve_is_the_ring_formula():
    params = ModelParams.from_hardware(H200)
    topo = topology(H200, 4, params)
    coll = CollectiveModel.from_hardware(H200, topo, params)
    b = 16 << 20
    expect = 3 * H200.link_latency_s + 3 * b / H200.link_bytes_per_s + params.collective_base_s
    assert coll.time("all_gather", b, 4) == pytest.approx(expect)
    assert coll.time("all_gather", b, 1) == 0.0


def test_pipeline_time_fill_and_drain():
    # compute-bound: the pipeline hides the transfer
    assert pipeline_time(100.0, 10, 50.0, 1.0) == 100.0
    # link-bound: fill + all transfers + the last chunk's compute
    assert pipeline_time(10.0, 10, 50.0, 1.0) == pytest.approx(1.0 + 50.0 + 1.0)


def test_parse_range():
    assert parse_range("M=1024:8192") == ("M", [1024, 2048, 4096, 8192])
    assert parse_range("M=1000:3000:1000") == ("M", [1000, 2000, 3000])
    assert parse_range("kv_len=1,5") == ("kv_len", [1, 5])
    with pytest.raises(InputError):
        parse_range("M=8:1")


# --- calibrate's output format -------------------------------------------------------------------

def _fake_measurements(world: int = 4) -> dict:
    coll = []
    for op, scale in (("allgather", 1.0), ("allreduce", 2.0), ("reduce_scatter", 1.0)):
        for b in (1 << 13, 1 << 16, 1 << 19, 1 << 22, 1 << 25, 1 << 27):
            coll.append({"op": op, "bytes_per_rank": b, "ms": scale * (0.012 + (world - 1) * b / 300e9 * 1e3)})
    return {
        "hbm": {"bytes": 1 << 31, "ms": 1.0, "bytes_per_s": 4.3e12},
        "gemm": {"bf16": {"flops_per_s": 780e12}, "fp16": {"flops_per_s": 790e12}, "fp32": {"flops_per_s": 50e12}},
        "launch": {"host_launch_torch_s": 9e-6, "host_launch_triton_s": 16e-6, "graph_per_kernel_s": 1.2e-6,
                   "kernel_gap_s": 2.5e-6, "launch_latency_s": 5e-6},
        "collectives": coll,
        "peer_copy": [{"bytes_per_s": 140e9}, {"bytes_per_s": 150e9}],
        "peer": {"load_bytes_per_s": 320e9, "load_latency_s": 1.2e-6, "store_bytes_per_s": 350e9,
                 "store_bytes_per_s_per_sm": 20e9},
        "flag": {"roundtrip_s": 3.3e-6},
        "barrier": {"barrier_skew_s": 7e-6},
    }


def _calibrated_spec(tmp_path=None):
    from taxmodel.model.calibration import fit
    from taxmodel.hardware.specs import HardwareSpec

    d = fit(_fake_measurements(), "NVIDIA H200", 132, 4, vendor="nvidia")
    return HardwareSpec.from_dict(json.loads(json.dumps(d)))


def test_calibrate_fit_round_trip(tmp_path):
    from taxmodel.model.calibration import fit
    from taxmodel.hardware.specs import load_hardware

    d = fit(_fake_measurements(), "NVIDIA H200", 132, 4, vendor="nvidia")
    path = tmp_path / "h200-calibrated.json"
    path.write_text(json.dumps(d))
    spec = load_hardware(path)
    assert spec.source == "calibrated" and spec.name == "H200 SXM (calibrated)" and "h200" in spec.aliases
    assert spec.flops_per_s("bf16") == 780e12 and spec.hbm_bytes_per_s == 4.3e12
    b = 1 << 27
    assert spec.link_bytes_per_s == pytest.approx(3 * b / ((0.012 + 3 * b / 300e9 * 1e3) * 1e-3))
    assert spec.host_launch_s == 16e-6 and spec.kernel_gap_s == 2.5e-6 and spec.flag_roundtrip_s == 3.3e-6
    params = ModelParams.from_hardware(spec)
    assert params.peer_load_bytes_per_s == 320e9 and params.barrier_skew_s == 7e-6
    assert params.host_launch_torch_s == 9e-6 and params.peer_store_bytes_per_s_per_sm == 20e9
    assert params.sources["barrier_skew_s"].startswith("hardware extra")
    # the collective curve is used as measured at its own world size, exactly at its points
    coll = CollectiveModel.from_hardware(spec, topology(spec, 4, params), params)
    assert coll.time("allgather", 1 << 22, 4) == pytest.approx((0.012 + 3 * (1 << 22) / 300e9 * 1e3) * 1e-3)
    # and its alpha-beta fit recovers the synthetic alpha and beta for another world size
    alpha, beta = coll.alpha_beta("allgather")
    assert alpha == pytest.approx(0.012e-3 / 3, rel=1e-6) and beta == pytest.approx(300e9, rel=1e-6)
    assert coll.time("allgather", 1 << 22, 8) == pytest.approx(7 * alpha + 7 * (1 << 22) / beta)
    # a prediction with it says so
    p = predict("ag_gemm", "bsp", AG, 8, spec)
    assert any("calibrated curve at 4 ranks" in a for a in p.assumptions)


def test_calibrated_file_is_preferred_over_the_preset(tmp_path):
    from taxmodel.model.calibration import fit

    spec, note = resolve_model_hardware("H200 SXM")
    assert spec.source == "datasheet" and "datasheet" in note
    spec, note = resolve_model_hardware("h200")  # a key names one spec exactly: the datasheet preset
    assert spec.source == "datasheet" and spec.key == "h200" and "as named" in note
    spec, note = resolve_model_hardware("h200-calibrated")  # the shipped H200 calibration
    assert spec.source == "calibrated" and "calibrated" in note
    (tmp_path / "h200-calibrated.json").write_text(json.dumps(fit(_fake_measurements(), "NVIDIA H200", 132, 4)))
    spec, note = resolve_model_hardware("NVIDIA H200", search=(tmp_path,))  # a device name: its calibration
    assert spec.source == "calibrated" and "in preference" in note
    spec, _ = resolve_model_hardware(None, {"hardware": {"name": "NVIDIA H200"}}, search=(tmp_path,))
    assert spec.source == "calibrated"
    spec, _ = resolve_model_hardware("mi300x", search=(tmp_path,))
    assert spec.source == "datasheet"


def test_a_measured_graph_gap_lands_in_the_hardware_file_and_the_params():
    from taxmodel.model.analytic.params import RAW_FEEDS
    from taxmodel.model.calibration import fit
    from taxmodel.hardware.specs import HardwareSpec

    meas = _fake_measurements()
    meas["launch"]["graph_kernel_gap_s"] = 0.3e-6
    d = fit(meas, "NVIDIA H200", 132, 4, vendor="nvidia")
    spec = HardwareSpec.from_dict(json.loads(json.dumps(d)))
    assert d["graph_kernel_gap_s"] == 0.3e-6 and spec.graph_kernel_gap_s == 0.3e-6
    assert "graph_kernel_gap_s" not in spec.extra and "graph_kernel_gap_s" in RAW_FEEDS["launch"]
    graph = ModelParams.from_hardware(spec, graph_launch=True)
    assert graph.graph_kernel_gap_s == 0.3e-6 and graph.sources["graph_kernel_gap_s"] == "hardware (calibrated)"
    assert graph.queued_gap_s == 0.3e-6  # in a graph: the graph gap
    assert ModelParams.from_hardware(spec).queued_gap_s == spec.kernel_gap_s == 2.5e-6  # eager: as before
    with pytest.raises(InputError, match="graph_kernel_gap_s"):
        HardwareSpec.from_dict({**d, "graph_kernel_gap_s": "fast"})


def test_a_file_without_the_graph_gap_loads_as_before():
    """Every calibration written before the graph gap was measured: the field is 0 (not measured),
    and graph launches keep kernel_gap_s between their kernels."""
    from taxmodel.model.calibration import fit
    from taxmodel.hardware.specs import HardwareSpec

    d = fit(_fake_measurements(), "NVIDIA H200", 132, 4, vendor="nvidia")
    assert "graph_kernel_gap_s" not in d
    shipped = find_preset("h200-calibrated").to_dict()
    assert shipped.pop("graph_kernel_gap_s") > 0  # measured on a 4x H200 since
    for spec in (HardwareSpec.from_dict(d), HardwareSpec.from_dict(shipped)):
        assert spec.graph_kernel_gap_s == 0.0
        params = ModelParams.from_hardware(spec, graph_launch=True)
        assert params.graph_kernel_gap_s == 0.0 and params.sources["graph_kernel_gap_s"] == "default"
        assert params.queued_gap_s == params.kernel_gap_s == spec.kernel_gap_s
    measured = ModelParams.from_hardware(find_preset("h200-calibrated"), graph_launch=True)
    assert 0 < measured.queued_gap_s == measured.graph_kernel_gap_s < measured.kernel_gap_s


def test_calibrate_without_gpu_says_what_to_do(monkeypatch, tmp_path):
    import torch

    from taxmodel.errors import UnavailableError
    from taxmodel.runtime.calibrate import run_calibration

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UnavailableError, match="datasheet presets"):
        run_calibration(tmp_path / "hw.json")


def test_instrumented_fused_waits_become_flag_wait():
    ragged = {**FD, "kv_len_step": 4096}
    plain = predict("flash_decode", "fused", ragged, 4, H200).taxes_ns()
    # the records' own cost set to 0 here: this checks how the same timeline is split
    inst = predict("flash_decode", "fused", ragged, 4, H200,
                   ModelParams.from_hardware(H200, instrumented=True, record_overhead_s=0.0)).taxes_ns()
    assert plain["flag_wait"] == 0 and inst["flag_wait"] > 0
    assert inst["window"] == pytest.approx(plain["window"])
    assert not math.isnan(inst["compute_inefficiency"])


def test_a_graph_launch_has_one_host_launch_and_no_host_starved_gaps():
    """bsp flash decode is four launches: eagerly the host's launch costs show as launch tax; as one
    CUDA graph per iteration every kernel after the first is queued (kernel_gap only)."""
    shape = {"batch": 1, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 1024}
    hw = find_preset("h200-calibrated")
    eager = predict("flash_decode", "bsp", shape, 4, hw, ModelParams.from_hardware(hw)).taxes_ns()
    graph = predict("flash_decode", "bsp", shape, 4, hw, ModelParams.from_hardware(hw, graph_launch=True)).taxes_ns()
    assert graph["host_starved"] == 0.0 and graph["launch_latency"] == 0.0
    queued = ModelParams.from_hardware(hw, graph_launch=True).queued_gap_s  # the measured graph gap
    assert queued == hw.graph_kernel_gap_s > 0
    assert graph["kernel_gap"] == pytest.approx(3 * queued * 1e9, rel=1e-6)  # three queued gaps per rank
    assert eager["launch_tax"] > graph["launch_tax"]
    assert graph["window"] < eager["window"]


def test_a_device_gate_releases_the_last_rank_first_and_the_others_one_flag_latency_later():
    p = ModelParams(flag_roundtrip_s=3e-6, barrier_skew_s=12.0, start_alignment="device")
    assert release_offsets(4, p) == [0.0, 1.5e-6, 1.5e-6, 1.5e-6]
    assert release_offsets(4, ModelParams(barrier_skew_s=12.0)) == start_offsets(4, 12.0)
    with pytest.raises(ValueError, match="start_alignment"):
        release_offsets(2, ModelParams(start_alignment="sideways"))


def test_a_gated_graph_iteration_starts_at_the_release_with_no_launch_cost_in_the_window():
    """Behind the gate the graph launch was enqueued during the hold: each rank's first kernel starts
    one queued gap after its release, the ranks within one flag latency, so the skew the ledger
    sees is that latency, far below the host barrier's."""
    shape = {"batch": 1, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 1024}
    hw = find_preset("h200-calibrated")
    host = ModelParams.from_hardware(hw, graph_launch=True, barrier_skew_s=20e-6)
    gated = ModelParams.from_hardware(hw, graph_launch=True, barrier_skew_s=20e-6, start_alignment="device",
                                        gate_hold_s=30e-6)
    plans = [[KernelPlan("k", "compute", 5e-6, host_s=hw.host_launch_s)] for _ in range(4)]
    rows = simulate(as_graph_launch(plans, gated), gated).rows
    starts = sorted(r["start"] for r in rows)
    assert starts == pytest.approx([gated.kernel_gap_s] + [gated.flag_roundtrip_s / 2 + gated.kernel_gap_s] * 3)
    for wl, var in (("flash_decode", "bsp"), ("flash_decode", "fused")):
        a = predict(wl, var, shape, 4, hw, host).taxes_ns()
        b = predict(wl, var, shape, 4, hw, gated).taxes_ns()
        assert b["window"] < a["window"]
        assert b["launch_tax"] <= a["launch_tax"] + 1e-6


def _kernel_gaps_ns(hw, graph_launch: bool) -> list[int]:
    """Start less the previous kernel's end, per kernel after the first, of one predicted iteration
    of bsp flash decode (three kernels) on one GPU."""
    p = api_predict("flash_decode", "bsp", {**FD, "batch": 16, "kv_len": 1024}, world_size=1, hardware=hw,
                    fitted={}, graph_launch=graph_launch)
    e = p.timeline.events
    k = e[(e["kind"] == "kernel") & (e["iteration"] == 0)].sort_values("start_ns")
    return (k["start_ns"].to_numpy()[1:] - k["end_ns"].to_numpy()[:-1]).tolist()


def test_a_graph_launch_queues_its_kernels_the_measured_graph_gap_apart():
    base = replace(find_preset("h200-calibrated"), graph_kernel_gap_s=0.0)  # as before it was measured
    gap_ns = round(base.kernel_gap_s * 1e9)
    measured = replace(base, graph_kernel_gap_s=0.3e-6)
    assert _kernel_gaps_ns(measured, graph_launch=True) == [300, 300]
    assert _kernel_gaps_ns(measured, graph_launch=False) == [gap_ns, gap_ns]  # eager: kernel_gap_s
    assert _kernel_gaps_ns(base, graph_launch=True) == [gap_ns, gap_ns]  # not measured: kernel_gap_s
    notes = api_predict("flash_decode", "bsp", FD, world_size=1, hardware=measured, fitted={}, graph_launch=True).assumptions
    assert any("0.30 us between the kernels of a CUDA graph" in a for a in notes if a.startswith("launch:"))
    notes = api_predict("flash_decode", "bsp", FD, world_size=1, hardware=base, fitted={}, graph_launch=True).assumptions
    assert any("graph_kernel_gap_s not measured" in a for a in notes if a.startswith("launch:"))


def test_in_a_graph_the_gate_is_followed_by_kernel_gap_and_a_cross_stream_wait_by_the_graph_gap():
    """The gate kernel is launched apart from the graph: the graph's first kernel starts kernel_gap_s
    after the release. Inside the graph a kernel behind its stream, or behind another stream's
    kernel (``after``), waits the graph gap."""
    params = ModelParams(kernel_gap_s=1e-6, graph_kernel_gap_s=0.25e-6, graph_launch=True, start_alignment="device",
                         gate_hold_s=30e-6)
    plans = [[KernelPlan("a", "compute", 5e-6, 0.0), KernelPlan("b", "compute", 5e-6, 0.0),
              KernelPlan("c", "copy", 1e-6, 0.0, stream=1, after=1)]]
    starts = [r["start"] for r in simulate(as_graph_launch(plans, params), params).rows]
    assert starts == pytest.approx([1e-6, 6.25e-6, 11.5e-6])
    eager = replace(params, graph_launch=False)
    assert [r["start"] for r in simulate(plans, eager).rows] == pytest.approx([1e-6, 7e-6, 13e-6])


def test_a_combine_with_few_programs_and_many_partials_is_a_chain_of_latency_bound_steps():
    """bsp local combine at batch 1: 4 programs of 8 rows fold the splits 4 at a time, so the kernel
    is overhead + ceil(S / 4) steps, far above streaming its ~1.4 MB; at batch 16 (6 splits,
    2 steps each) the same formula; the fused kernel's own local combine takes the same steps."""
    from taxmodel.kernels.flash_decode.split_kv import plan_splits
    from taxmodel.kernels.flash_decode.workload import kv_lengths, split_config

    shipped = find_preset("h200-calibrated")
    # without the fused kernel's own measured step (fused_combine), which the shipped file has since
    hw = replace(shipped, extra={k: v for k, v in shipped.extra.items() if not k.startswith("fused_local_combine")})
    p = ModelParams.from_hardware(hw, combine_step_s=0.9e-6)
    for batch in (1, 16):
        shape = {"batch": batch, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 16384}
        splits = plan_splits(batch, 4, kv_lengths(shape, 4)[0], hw.num_sms, split_config(shape, "cuda")).num_splits
        assert splits > (8 if batch == 1 else 4)  # several steps per program
        steps = -(-splits // 4)
        bsp = predict("flash_decode", "bsp", shape, 4, hw, p).details
        assert bsp["combine_local"] == pytest.approx(max(p.kernel_overhead_s + steps * 0.9e-6,
                                                         stream_time(batch * 32 * (splits + 1) * 129 * 4, hw, p)))
        assert predict("flash_decode", "fused", shape, 4, hw, p).details["local_combine"] == pytest.approx(steps * 0.9e-6)
    # spread: 4 slices of 2 rows fold 16 partials per step
    spread = {"batch": 1, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 16384, "fused_slices": 4}
    splits = plan_splits(1, 4, kv_lengths(spread, 4)[0], hw.num_sms, split_config(spread, "cuda")).num_splits
    assert predict("flash_decode", "fused", spread, 4, hw, p).details["local_combine"] == pytest.approx(
        -(-splits // 16) * 0.9e-6)


def _kw(p: ModelParams) -> dict:
    """The given (non-default) fields of ``p``, to build a variant of it."""
    return {k: getattr(p, k) for k, src in p.sources.items() if src == "given"}


def test_fused_flash_decode_pushes_from_one_cta_per_unit_and_merges_one_peer_per_step():
    """Each pushing CTA stores (W-1) x rows x (D+1) words into the peers (LL: 8 bytes per word) at
    one SM's peer-store rate, unless all the pushing CTAs together exceed the GPU's peer-store
    bandwidth; the ranks' partials are merged one peer per step (LL, own partial in registers),
    one step more with dedicated combiners, one step with the flags protocol (whose push ends with
    a serial release-exchange of every rank's flag, and whose combiner first waits on every rank's
    flag in turn); slice combiners first wait for their pair's ready word."""
    hw = find_preset("h200-calibrated")
    p = ModelParams.from_hardware(hw, peer_store_bytes_per_s=300e9, peer_store_bytes_per_s_per_sm=20e9,
                                    peer_load_latency_s=1e-6, combine_step_s=1e-6, ll_merge_step_s=1.3e-6)
    lat, step = 1e-6, 1.3e-6  # LL merges poll and merge one peer's words a step: ll_merge_step_s
    b1 = {"batch": 1, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 1024}
    for world in (2, 4):
        d = predict("flash_decode", "fused", b1, world, hw, p).details
        unit = (world - 1) * 8 * 129 * 8  # 4 head groups of 8 rows, one CTA each
        assert d["push"] == pytest.approx(unit / 20e9 + lat)  # 4 CTAs: the per-SM rate binds
        assert d["combine"] == pytest.approx((world - 1) * step)
    # batch 16 on 4 ranks: 64 CTAs push at once, together faster than 300 GB/s allows
    b16 = {**b1, "batch": 16}
    unit = 3 * 8 * 129 * 8
    assert predict("flash_decode", "fused", b16, 4, hw, p).details["push"] == pytest.approx(64 * unit / 300e9 + lat)
    # spread: 4 slices of 2 rows per head group, 16 CTAs
    spread = predict("flash_decode", "fused", {**b1, "fused_slices": 4}, 4, hw, p).details
    assert spread["push"] == pytest.approx(16 * 3 * 2 * 129 * 8 / 300e9 + lat)  # just over 16 x 6 KiB / 20 GB/s
    waited = predict("flash_decode", "fused", {**b1, "fused_slices": 4}, 4, hw,
                     ModelParams.from_hardware(hw, **{**_kw(p), "flag_wait_gpu_s": 2e-6})).details
    assert waited["fused_work"] - spread["fused_work"] == pytest.approx(2e-6 - p.flag_wait_gpu_s)
    # batch 16 spread: 256 slices, but only as many slice combiners push at once as the kernel has
    # (at most half the SMs: 66 on an H200)
    big = predict("flash_decode", "fused", {**b16, "fused_slices": 4}, 4, hw, p).details
    assert hw.num_sms == 132 and big["push"] == pytest.approx(66 * 3 * 2 * 129 * 8 / 300e9 + lat)
    assert predict("flash_decode", "fused", {**b1, "fused_combiners": 4}, 4, hw, p).details["combine"] == \
        pytest.approx(4 * step)  # a dedicated combiner reads its own rank's partial back too
    flags = predict("flash_decode", "fused", {**b1, "fused_protocol": 2}, 4, hw, p).details
    # fp32 values, no LL words, then one system-scope release-exchange per rank, one after another
    assert flags["push"] == pytest.approx(3 * 8 * 129 * 4 / 20e9 + lat + 4 * p.flag_roundtrip_s / 2)
    # flags: a wait on every rank's flag, one after another, then one combine step over the partials
    assert flags["combine"] == pytest.approx(4 * p.flag_wait_s + 1e-6)
    assert d["wait_merge"] == pytest.approx(d["flag"] + d["combine"])
    assert predict("flash_decode", "fused", b1, 1, hw, p).details["push"] == 0.0


def test_a_push_wave_is_bound_by_one_sm_or_by_the_shared_bandwidth():
    assert push_wave_time(1e6, 1, 20e9, 300e9, 1e-6) == pytest.approx(1e6 / 20e9 + 1e-6)
    assert push_wave_time(1e6, 100, 20e9, 300e9, 1e-6) == pytest.approx(100e6 / 300e9 + 1e-6)
    assert push_wave_time(0.0, 4, 20e9, 300e9, 1e-6) == 0.0


def test_the_hardware_note_replaces_the_plain_hardware_line_once():
    from taxmodel.model.analytic import with_hardware_note

    plain = ["hardware: H200 SXM (calibrated)", "topology: ..."]
    assert with_hardware_note(plain, "hardware: H200 SXM (calibrated), calibrated (file.json)") == [
        "hardware: H200 SXM (calibrated), calibrated (file.json)", "topology: ..."]
    scaled = ["hardware: H200 SXM (datasheet; datasheet peaks scaled by 0.80 for vendor GEMMs)", "topology: ..."]
    assert with_hardware_note(scaled, "hardware: H200 SXM datasheet preset") == [
        "hardware: H200 SXM datasheet preset; datasheet peaks scaled by 0.80 for vendor GEMMs", "topology: ..."]
    assert with_hardware_note(plain, None) == plain
    for key in ("h200-calibrated", "h200"):  # the choice is said once, a datasheet's scaled peaks with it
        p = predict("flash_decode", "bsp", {"batch": 1, "kv_len": 16384, "q_heads": 32, "kv_heads": 4, "head_dim": 128}, 2,
                    key)
        assert sum(a.startswith("hardware: ") for a in p.assumptions) == 1


def test_an_instrumented_fused_kernel_pays_its_records_own_cost():
    """Captures with in-kernel records are slower by what the records cost (record_overhead_s per
    instrumented fused kernel, measured against plain builds on the GPUs); plain captures and the
    bsp variant's kernels are not."""
    hw = find_preset("h200-calibrated")
    shape = {"batch": 1, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 1024}
    for variant, extra in (("fused", 1), ("bsp", 0)):
        plain = predict("flash_decode", variant, shape, 2, hw, ModelParams.from_hardware(hw)).window_ns
        inst = predict("flash_decode", variant, shape, 2, hw,
                       ModelParams.from_hardware(hw, instrumented=True, record_overhead_s=3e-6)).window_ns
        assert inst - plain == pytest.approx(extra * 3e3, abs=1.0), variant
