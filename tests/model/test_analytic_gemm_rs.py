"""The analytic model of GEMM + Reduce-Scatter: component times and timelines checked against
hand-computed values on a toy GPU with round numbers, monotonicity properties on the H200
presets, the CLI, and validation against a bundle made of the model's own timeline."""
from __future__ import annotations

import math

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from taxmodel.errors import InputError
from taxmodel.model.analytic import MODELS, gemm_rs, predict, variants
from taxmodel.model.analytic.collective_model import CollectiveModel
from taxmodel.model.analytic.costs import wave_inflation
from taxmodel.model.analytic.params import ModelParams
from taxmodel.model.analytic.timeline import (
    KernelPlan,
    simulate,
    start_offsets,
    timeline_events,
)
from taxmodel.model.analytic.topology import topology
from taxmodel.hardware.specs import HardwareSpec, find_preset

#: A calibrated toy GPU: 1 PFLOP/s bf16 (50 TFLOP/s fp32), 4 TB/s HBM, 400 GB/s link with 5 us latency, 200 GB/s of
#: peer stores, 250 GB/s P2P copies, 132 SMs; every other parameter the model's default.
TOY = HardwareSpec(name="toy", vendor="nvidia", source="calibrated", peak_flops={"bf16": 1e15, "fp32": 5e13},
                   hbm_bytes_per_s=4e12,
                   link_bytes_per_s=4e11, link_latency_s=5e-6, num_sms=132,
                   extra={"peer_store_bytes_per_s": 2e11, "p2p_copy_bytes_per_s": 2.5e11})
H200 = find_preset("H200 SXM")  # the datasheet preset
BIG = {"M": 8192, "N": 8192, "K": 8192}
T0 = 2e-6  # ModelParams.kernel_overhead_s
SLAB4 = 2048 * 8192 * 2  # one rank's rows of C at 4 ranks, bf16


def _plans(variant: str, shape: dict, world: int, hw: HardwareSpec = TOY, **overrides):
    params = ModelParams.from_hardware(hw, **overrides)
    coll = CollectiveModel.from_hardware(hw, topology(hw, world, params), params)
    plans, det, notes = gemm_rs.plans(variant, shape, world, hw, params, coll)
    return plans, det, notes, params


def _rows(plans, params, rank: int) -> list[dict]:
    return [r for r in simulate(plans, params).rows if r["rank"] == rank]


def test_registered_with_its_variants():
    assert MODELS["gemm_rs"] is gemm_rs
    assert variants("gemm_rs") == ("bsp", "fused", "torch_fused")


def test_bsp_component_times_and_timeline_by_hand():
    plans, det, _, params = _plans("bsp", BIG, 4)
    # 8192 x 8192 tiles quantize exactly as the calibration shape does: 2 M N K/W / R + t0
    gemm = 2 * 8192 * 8192 * 2048 / 1e15 + T0
    # no calibrated curve: ring alpha-beta, 3 steps of 5 us and 3 slabs at 400 GB/s, plus 8 us per call
    rs = 3 * 5e-6 + 3 * SLAB4 / 4e11 + 8e-6
    assert det == pytest.approx({"gemm": gemm, "reduce_scatter": rs}, rel=1e-12)
    assert [p.name for p in plans[0]] == [gemm_rs.VENDOR_GEMM, gemm_rs.NCCL_RS]
    # The last rank to leave the barrier sets the collective's start; everyone ends together.
    offs = start_offsets(4, params.barrier_skew_s)
    hv, lat, gap = params.host_launch_torch_s, params.launch_latency_s, params.kernel_gap_s
    end = offs[-1] + hv + lat + gemm + gap + rs
    for r in range(4):
        g, coll = _rows(plans, params, r)
        assert g["start"] == pytest.approx(offs[r] + hv + lat) and g["end"] == pytest.approx(g["start"] + gemm)
        assert coll["start"] == pytest.approx(g["end"] + gap)
        assert coll["end"] == pytest.approx(end, rel=1e-12)


def test_bsp_on_one_rank_copies_instead_of_the_collective():
    plans, det, _, _ = _plans("bsp", BIG, 1)
    assert [p.role for p in plans[0]] == ["compute", "copy"]
    assert det["copy"] == pytest.approx(2 * 8192 * 8192 * 2 / 4e12 + T0)


def test_fused_link_bound_component_times_by_hand():
    _, det, _, _ = _plans("fused", BIG, 4, kernel_revision=5)  # every peer's tile first (revisions 1-5)
    gemm = 2 * 8192 * 8192 * 2048 / (0.9 * 1e15) + T0  # Triton at 0.9 of the vendor rate, same tile count
    push = 3 * SLAB4 / 2e11  # three slabs out at the peer-store bandwidth
    work = gemm - T0
    # 4 x 16 x 32 = 2048 tiles of 128 x 256 in 16 waves on 132 SMs; the first 1536 go to peers
    finish = T0 + max(work / 16 + push, work * 3 / 4 + push / 1536)
    assert finish == pytest.approx(T0 + work / 16 + push)  # link-bound: 503 us of pushes, 300 us of GEMM
    lat = 1.5e-6  # ModelParams.peer_load_latency_s
    assert det["triton_gemm"] == pytest.approx(gemm, rel=1e-12)
    assert det["push"] == pytest.approx(push, rel=1e-12)
    # a program's pushes (store_push records): 1536 peer tiles of 64 KiB in 11 waves of 132 and one
    # of 84, each wave sharing the 200 GB/s
    tile = 3 * SLAB4 / 1536
    wave = lambda k: max(tile / 25e9, k * tile / 2e11) + lat  # noqa: E731 - 25 GB/s: default per-SM store rate
    comm = 11 * wave(132) + 84 * wave(84) / 132
    assert det["push_per_program"] == pytest.approx(comm, rel=1e-12)
    # the programs do not wait for their pushes; 512 own tiles come last on 132 programs, so the
    # closing release waits for nothing in flight but its own latency; the link sets the end:
    # 505 us of pushes after the first wave, more than the GEMM's 300 us
    assert det["last_push"] == pytest.approx(lat)
    assert det["gemm_kernel"] == pytest.approx(max(gemm + lat, finish + lat), rel=1e-12)
    assert det["gemm_kernel"] == pytest.approx(finish + lat, rel=1e-12)
    # 4 slots in, the slab out; first a wait on each of the tile's 4 flags, one after another
    assert det["reduce"] == pytest.approx(5 * SLAB4 / (4e12 * 0.8) + T0 + 4 * ModelParams().flag_wait_s, rel=1e-12)
    assert det["flag"] == pytest.approx(ModelParams().flag_roundtrip_s / 2)


def test_spread_order_component_times_by_hand():
    """Revision 6: rounds of one block of every peer and an own block a round behind. The last peer
    tile comes before the last own block (32 of 2048 tiles); each wave has 99 of its 132 programs
    pushing; 100 programs end on a peer tile and wait for that wave's stores."""
    _, det, notes, params = _plans("fused", BIG, 4)
    assert params.rs_spread and "spread order" in notes[-1]
    gemm = 2 * 8192 * 8192 * 2048 / (0.9 * 1e15) + T0
    push = 3 * SLAB4 / 2e11
    work = gemm - T0
    assert gemm_rs.peers_done_share(4, 16, True) == pytest.approx(1 - 1 / 64)
    finish = T0 + max(work / 16 + push, work * (1 - 1 / 64) + push / 1536)
    lat = 1.5e-6
    tile = 3 * SLAB4 / 1536
    wave = lambda k: max(tile / 25e9, k * tile / 2e11) + lat  # noqa: E731
    assert det["push_per_program"] == pytest.approx(1536 / 132 * wave(99), rel=1e-12)
    assert det["last_push"] == pytest.approx(wave(132 - 32), rel=1e-12)
    assert det["gemm_kernel"] == pytest.approx(max(gemm + wave(100), finish + lat), rel=1e-12)
    # spread pushes with fewer programs at once than peers first: less per program
    _, first, _, _ = _plans("fused", BIG, 4, kernel_revision=5)
    assert det["push_per_program"] < first["push_per_program"]
    # one block a slab: the own block is the only tail
    assert gemm_rs.peers_done_share(4, 1, True) == pytest.approx(3 / 4) == gemm_rs.peers_done_share(4, 1, False)


def test_fused_compute_bound_hides_the_pushes_in_the_gemm():
    _, det, _, _ = _plans("fused", BIG, 4, TOY, peer_store_bytes_per_s=4e12, kernel_revision=5)  # fast peer stores
    assert det["push"] == pytest.approx(3 * SLAB4 / 4e12)
    # the pushes leave while the programs compute their next tiles; the kernel lasts its GEMM plus
    # the closing release (the own tiles come last: no push in flight to wait for)
    assert det["gemm_kernel"] == pytest.approx(det["triton_gemm"] + ModelParams().peer_load_latency_s)
    assert det["push_per_program"] < 0.2 * det["triton_gemm"]


def test_programs_ending_on_a_peer_tile_wait_for_a_wave_of_pushes():
    """Fewer own tiles than programs (M=1024 on 2 ranks: 128 own tiles, 132 programs): 4 programs'
    last tiles are peers', and their release waits for that wave's stores."""
    shape = {"M": 1024, "N": 8192, "K": 8192}
    _, det, _, params = _plans("fused", shape, 2, kernel_revision=5)
    tile = 512 * 8192 * 2 / 128  # one peer tile: a 128 x 256 bf16 block (the slab over the 128 peer tiles)
    lat = params.peer_load_latency_s
    expect = max(tile / 25e9, 4 * tile / 2e11) + lat
    assert det["last_push"] == pytest.approx(expect, rel=1e-12)
    assert det["gemm_kernel"] >= det["triton_gemm"] + expect - 1e-15


def test_a_kernel_time_measured_whole_takes_no_extra_wave_of_pushes():
    """Where the GEMM kernel's time is calibrate's rs_gemm measurement (the kernel's traced duration,
    its last pushes and release included), nothing is added for the programs ending on a peer tile
    (M=1024 on 2 ranks, as above); a time built from rates keeps that wave (the test above)."""
    shape = {"M": 1024, "N": 8192, "K": 8192}
    for measured in (dict(rs_push_s_per_byte_by_m=((1024, 2.9e-12),)), dict(rs_gemm_speed_by_m=((1024, 0.78),))):
        _, det, notes, _ = _plans("fused", shape, 2, **measured)
        assert det["last_push"] == 0.0
        assert det["gemm_kernel"] == pytest.approx(max(det["triton_gemm"], det["push_done"]), rel=1e-12)
        assert "holds its last pushes and its release" in notes[-1]
    _, rates, rate_notes, _ = _plans("fused", shape, 2)
    assert rates["last_push"] > 0 and "holds its last pushes" not in rate_notes[-1]
    # kernel revision 1 (a release per pushed tile) keeps its per-tile push time whatever measured the GEMM
    _, old, _, _ = _plans("fused", shape, 2, kernel_revision=1, rs_push_s_per_byte_by_m=((1024, 2.9e-12),))
    assert old["last_push"] == pytest.approx(old["push_per_program"])


def test_push_finish_formula():
    # 10 tiles on 4 SMs: 3 waves; 7 of them (W=4: 3/4 of 10, floored) go to peers
    assert gemm_rs.push_finish(1.0 + 0.1, 4, 10, 4, 0.7, 0.1) == pytest.approx(0.1 + max(1 / 3 + 0.7, 0.75 + 0.1))
    assert gemm_rs.push_finish(1.0 + 0.1, 4, 10, 4, 0.01, 0.1) == pytest.approx(0.1 + 0.75 + 0.01 / 7)
    assert gemm_rs.push_finish(1.0, 1, 10, 4, 0.5, 0.1) == 0.0  # one rank pushes nothing


def test_fused_reduction_waits_for_the_last_ranks_pushes():
    # ranks released 300 us x (1, 1/2, 1/3) apart: more than the 306 us between the last push
    # landing and the GEMM's end, so the first ranks' reductions wait for the last rank's pushes
    plans, det, _, params = _plans("fused", BIG, 4, barrier_skew_s=300e-6)
    offs = start_offsets(4, params.barrier_skew_s)
    ht, lat, gap = params.host_launch_triton_s, params.launch_latency_s, params.kernel_gap_s
    for r in range(4):
        gemm, red = _rows(plans, params, r)
        assert gemm["start"] == pytest.approx(offs[r] + ht + lat)
        assert gemm["end"] == pytest.approx(gemm["start"] + det["gemm_kernel"])
        assert red["start"] == pytest.approx(gemm["end"] + gap)
        # the last rank's last push landed push_done after its GEMM started, i.e. (gemm_kernel -
        # push_done) before its GEMM ended: wait for it (its start - ours later), plus half a flag
        # round trip, less the gap
        expect_wait = max(0.0, offs[-1] - offs[r] + det["push_done"] - det["gemm_kernel"] + det["flag"] - gap)
        assert red["wait"] == pytest.approx(expect_wait, abs=1e-12)
        assert red["end"] == pytest.approx(red["start"] + expect_wait + det["reduce"])
    assert _rows(plans, params, 0)[1]["wait"] > 0  # the first rank out waits for the last one
    assert _rows(plans, params, 3)[1]["wait"] == 0.0  # the last rank's pushes landed before its GEMM ended


def test_torch_fused_structure_and_overlap():
    plans, det, _, params = _plans("torch_fused", BIG, 4)
    chunk = 2 * 2048 * 8192 * 2048 / 1e15 * wave_inflation(2048, 8192, (256, 128), 132) \
        / wave_inflation(8192, 8192, (256, 128), 132) + T0
    assert det["gemm_chunk"] == pytest.approx(chunk, rel=1e-12)
    assert det["copy_chunk"] == pytest.approx(SLAB4 / 2.5e11 + T0, rel=1e-12)
    assert det["sum"] == pytest.approx(5 * SLAB4 / 4e12 + T0, rel=1e-12)
    names = [p.name for p in plans[0]]
    assert len(names) == 1 + 4 * 3 + 3  # barrier, 3 x (GEMM, barrier, pull, barrier), own GEMM, barrier, sum
    assert names.count(gemm_rs.VENDOR_GEMM) == 4 and names.count(gemm_rs.PEER_COPY) == 3
    rows = _rows(plans, params, 0)
    gemms = [r for r in rows if r["name"] == gemm_rs.VENDOR_GEMM]
    copies = [r for r in rows if r["name"] == gemm_rs.PEER_COPY]
    for a, b in zip(gemms, gemms[1:]):  # the GEMMs run back to back, never waiting on the pulls
        assert b["start"] == pytest.approx(a["end"] + params.kernel_gap_s)
    for g, cp in zip(gemms, copies):  # each pull after its chunk's GEMM, overlapping the next chunk
        assert cp["start"] > g["end"] and cp["stream"] == 1
    assert copies[0]["start"] < gemms[1]["end"]
    final_bar, total = rows[-2], rows[-1]
    assert final_bar["start"] >= copies[-1]["end"] + 2 * params.kernel_gap_s  # the main stream waited
    assert total["start"] == pytest.approx(final_bar["end"] + params.kernel_gap_s)


def test_simulate_rejects_an_after_that_is_not_earlier():
    params = ModelParams()
    bad = [[KernelPlan("a", "compute", 1e-6, 1e-6), KernelPlan("b", "comm", 1e-6, 1e-6, stream=1, after=1)]]
    with pytest.raises(ValueError, match="not an earlier one"):
        simulate(bad, params)


@pytest.mark.parametrize("variant", ["bsp", "fused", "torch_fused"])
def test_parts_sum_to_the_predicted_window(variant):
    p = predict("gemm_rs", variant, BIG, 4, H200)
    s = p.summary()
    assert s["mean_ns"].sum() == pytest.approx(p.window_ns, abs=1e-6)
    assert (s["mean_ns"] >= 0).all() and p.window_ns > 0
    assert any(variant in a for a in p.assumptions)


@settings(max_examples=10, deadline=None)
@given(world=st.sampled_from([2, 4, 8]), m=st.sampled_from([1024, 4096, 16384]),
       variant=st.sampled_from(["bsp", "fused", "torch_fused"]), key=st.sampled_from(["M", "K"]))
def test_latency_grows_with_m_and_k(world, m, variant, key):
    shape = {"M": m, "N": 8192, "K": 8192}
    a = predict("gemm_rs", variant, shape, world, H200).window_ns
    b = predict("gemm_rs", variant, {**shape, key: 2 * shape[key]}, world, H200).window_ns
    assert b > a


def test_bsp_tax_grows_with_world_size_for_fixed_work_per_rank():
    taxes = [predict("gemm_rs", "bsp", {"M": 1024 * w, "N": 8192, "K": 2048 * w}, w, H200).taxes_ns()["bsp_tax"]
             for w in (2, 4, 8, 16)]
    assert all(x < y for x, y in zip(taxes, taxes[1:])), taxes


def test_fused_beats_bsp_when_the_pushes_hide_behind_the_gemm():
    """At 4 ranks with fast peer stores the pushes cost each program little and the reduce-scatter
    is gone: fused is faster than bsp (on the datasheet H200 it is not at M=8192: docs/model.md)."""
    fast = ModelParams.from_hardware(TOY, peer_store_bytes_per_s=4e12, peer_store_bytes_per_s_per_sm=1e11)
    for m in (4096, 8192):
        shape = {"M": m, "N": 8192, "K": 8192}
        fused = predict("gemm_rs", "fused", shape, 4, TOY, fast)
        assert fused.details["push_per_program"] < 0.2 * fused.details["triton_gemm"]
        assert fused.window_ns < predict("gemm_rs", "bsp", shape, 4, TOY, fast).window_ns


@pytest.mark.parametrize("variant", ["bsp", "fused"])
def test_world_size_one_has_no_communication(variant):
    t = predict("gemm_rs", variant, BIG, 1, H200).taxes_ns()
    assert t["bsp_tax"] == 0 and t["skew_wait"] == 0 and t["exposed_comm"] == 0


def test_instrumented_fused_waits_become_flag_wait():
    shape = {"M": 1024, "N": 8192, "K": 8192}  # link-bound at 8 ranks: the reductions wait on the last pushes
    plain = predict("gemm_rs", "fused", shape, 8, H200).taxes_ns()
    # the records' own cost set to 0 here: this checks how the same timeline is split
    inst = predict("gemm_rs", "fused", shape, 8, H200,
                   ModelParams.from_hardware(H200, instrumented=True, record_overhead_s=0.0)).taxes_ns()
    assert plain["flag_wait"] == 0 and inst["flag_wait"] > 0
    assert inst["window"] == pytest.approx(plain["window"])


def test_push_phase_per_program_by_hand():
    """Peer tiles in waves of `programs` that push together: each wave at the slower of one SM's
    rate and the shared bandwidth, plus the release; a partial wave averaged over all programs."""
    tile = 65536.0
    # 2 ranks, 256 tiles: 128 peer tiles, all in one partial wave of 128 of 132 programs, link-bound
    got = gemm_rs.push_phase_per_cta(2, 256, 132, 128 * tile, 2e10, 3.5e11, 1e-6)
    assert got == pytest.approx(128 * (128 * tile / 3.5e11 + 1e-6) / 132)
    # 1024 peer tiles: 7 full waves of 132 and a partial one of 100
    full, part = 132 * tile / 3.5e11 + 1e-6, 100 * tile / 3.5e11 + 1e-6
    assert gemm_rs.push_phase_per_cta(2, 2048, 132, 1024 * tile, 2e10, 3.5e11, 1e-6) == pytest.approx(
        7 * full + 100 * part / 132)
    # few programs: one SM's rate bounds each push, not the shared bandwidth
    assert gemm_rs.push_phase_per_cta(2, 8, 4, 4 * tile, 2e10, 3.5e11, 0.0) == pytest.approx(tile / 2e10)
    assert gemm_rs.push_phase_per_cta(1, 8, 4, 4 * tile, 2e10, 3.5e11, 0.0) == 0.0


def test_instrumented_fused_pushes_become_exposed_communication():
    """With records, the GEMM's per-program push time is a store_push record: the ledger's exposed
    communication equals it, and the window does not change (the records' own cost set to 0)."""
    shape = {"M": 8192, "N": 8192, "K": 8192}
    params = ModelParams.from_hardware(TOY, instrumented=True, record_overhead_s=0.0)
    _, det, _, _ = _plans("fused", shape, 2)
    assert det["push_per_program"] > 0
    inst = predict("gemm_rs", "fused", shape, 2, TOY, params).taxes_ns()
    plain = predict("gemm_rs", "fused", shape, 2, TOY).taxes_ns()
    assert inst["exposed_comm"] == pytest.approx(det["push_per_program"] * 1e9, abs=2)
    assert plain["exposed_comm"] == 0 and inst["window"] == pytest.approx(plain["window"])


def test_the_fused_gemm_takes_its_own_fitted_efficiency_when_there_is_one():
    """rs_gemm_efficiency (fitted on the gemm_rs GEMM kernel) replaces triton_gemm_efficiency for
    that kernel only; None keeps the shared one."""
    _, shared, notes, _ = _plans("fused", BIG, 4, triton_gemm_efficiency=0.8)
    _, own, notes_own, _ = _plans("fused", BIG, 4, triton_gemm_efficiency=0.8, rs_gemm_efficiency=0.96)
    work = lambda d: d["triton_gemm"] - T0  # noqa: E731
    assert work(own) == pytest.approx(work(shared) * 0.8 / 0.96, rel=1e-9)
    assert "rs_gemm_efficiency" in notes_own[-1] and "rs_gemm_efficiency" not in notes[-1]
    from taxmodel.model.analytic import ag_gemm

    def ag_details(**over) -> dict:
        params = ModelParams.from_hardware(TOY, **over)
        coll = CollectiveModel.from_hardware(TOY, topology(TOY, 4, params), params)
        return ag_gemm.plans("pull", {"M": 8192, "N": 8192, "K": 8192}, 4, TOY, params, coll)[1]

    ag, ag_ref = ag_details(rs_gemm_efficiency=0.5), ag_details()
    assert ag == ag_ref  # the AG+GEMM kernels keep the shared efficiency


def test_shape_errors_name_the_fix():
    with pytest.raises(InputError, match="M=100 must be a multiple of the world size 8"):
        predict("gemm_rs", "bsp", {"M": 100, "N": 64, "K": 64}, 8, H200)
    with pytest.raises(InputError, match="more than one rank"):
        predict("gemm_rs", "torch_fused", BIG, 1, H200)
    with pytest.raises(InputError, match="no variant 'pull'"):
        predict("gemm_rs", "pull", BIG, 2, H200)
    with pytest.raises(InputError, match="domains"):
        predict("gemm_rs", "fused", {"M": 8192, "N": 8192, "K": 8192}, 16, find_preset("mi300x"))


def test_fp32_shapes_move_twice_the_bytes():
    _, bf16, _, _ = _plans("fused", BIG, 4)
    _, fp32, _, _ = _plans("fused", {**BIG, "dtype": 32}, 4)
    assert fp32["push"] == pytest.approx(2 * bf16["push"])
    assert fp32["triton_gemm"] == pytest.approx(2 * 8192 * 8192 * 2048 / (0.9 * 5e13) + T0, rel=1e-12)


def test_cli_predict_gemm_rs():
    from taxmodel.cli import cli

    res = CliRunner().invoke(cli, ["predict", "gemm_rs", "--variant", "fused", "--world-size", "8", "--hardware", "h200-calibrated"])
    assert res.exit_code == 0, res.output
    assert "gemm_rs/fused" in res.output and "M=8192,N=8192,K=8192" in res.output


def test_validate_recovers_the_models_own_timeline_exactly(tmp_path):
    from taxmodel.model import validate as val
    from taxmodel.trace.bundle import make_meta, write_bundle

    hw = find_preset("h200-calibrated")
    for variant, world in (("bsp", 4), ("fused", 2), ("torch_fused", 4)):
        shape = {"M": 4096, "N": 4096, "K": 4096}
        plans, _, _, params = _plans(variant, shape, world, hw)
        # the model's own DRAM bytes as the bundle's counters: its locality is measured as the prediction's is
        events = timeline_events(simulate(plans, params), iterations=3, counters=True)
        meta = make_meta(source="capture", workload="gemm_rs", variant=variant, shape=shape, world_size=world,
                         ranks=list(range(world)), hardware={"name": "NVIDIA H200"},
                         clock_offsets_ns={str(r): 0 for r in range(world)},
                         capture={"clock_offsets_source": "measured"}, cost=gemm_rs.cost(shape, world, variant))
        write_bundle(tmp_path / variant, events, meta)
    v = val.validate(tmp_path, fit=False)
    assert sorted(case.variant for case in v.cases) == ["bsp", "fused", "torch_fused"] and not v.skipped
    assert v.table["error_us"].abs().max() < 0.01
    assert v.table["validated"].all() and set(v.table["basis"]) == {"measured"}
    assert not math.isnan(v.table["measured_us"].sum())


def test_a_measured_rs_gemm_speed_sets_the_kernels_gemm_before_any_fitted_efficiency():
    """rs_gemm_speed_by_m (the calibrate step's kernel against the vendor GEMM on this machine) wins
    over rs_gemm_efficiency (a fit) and the tile GEMM's speed: the vendor time over the speed at M."""
    _, vendor, _, _ = _plans("bsp", BIG, 4)
    _, det, notes, _ = _plans("fused", BIG, 4, rs_gemm_efficiency=0.5, triton_gemm_speed_by_m=((8192, 1.0),),
                              rs_gemm_speed_by_m=((1024, 0.8), (16384, 0.9)))
    speed = 0.8 + 0.1 * (13 - 10) / (14 - 10)  # log2 M = 13 between the points at 10 and 14
    assert det["triton_gemm"] - T0 == pytest.approx((vendor["gemm"] - T0) / speed, rel=1e-9)
    assert "rs_gemm_speed_by_m" in notes[-1]


def test_a_measured_push_cost_scales_with_the_bytes_each_world_size_pushes():
    """rs_push_s_per_byte_by_m: the vendor GEMM on the shard plus the cost per pushed byte times the
    (W-1)/W of the M x N partial product a rank pushes; it wins over a speed measured at one world
    size, and at one rank (nothing pushed) the kernel takes the vendor GEMM's time."""
    cost = 1.5e-12
    m, n, elt = BIG["M"], BIG["N"], 2
    for world in (1, 2, 4, 8):
        _, vendor, _, _ = _plans("bsp", BIG, world)
        _, det, notes, _ = _plans("fused", BIG, world, rs_gemm_speed_by_m=((8192, 0.5),),
                                  rs_push_s_per_byte_by_m=((1024, cost), (16384, cost)))
        assert det["triton_gemm"] == pytest.approx(vendor["gemm"] + m * n * elt * (world - 1) / world * cost, rel=1e-9)
        assert "rs_push_s_per_byte_by_m" in notes[-1]
