"""The analytic model with what `taxmodel calibrate` measured on a GPU's own kernels (issue 33): the
mechanisms it uses them in, worked out by hand, and hardware files that are wrong for the job (of
another GPU, without the new fields, from an older taxmodel, with fields that do not read) used with
a one-line caveat, never a traceback."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.model import calibration as calfit
from taxmodel.model import validate as val
from taxmodel.model.analytic import ag_gemm, model_params, predict
from taxmodel.model.analytic.collective_model import CollectiveModel
from taxmodel.model.analytic.costs import arrival_waves_time, gemm_time
from taxmodel.model.analytic.fitted import FITTED_FILE, choose_fitted, fitted_sets
from taxmodel.model.analytic.params import ModelParams, calibrated_mechanisms, not_borrowed
from taxmodel.model.analytic.topology import topology
from taxmodel.hardware.specs import HardwareSpec, load_hardware

from model_bundles import H200, model_bundle

SHAPE = {"batch": 16, "kv_len": 1024, "q_heads": 32, "kv_heads": 4, "head_dim": 128}


def test_the_tile_gemms_speed_is_interpolated_in_log_m_and_held_beyond_the_measured_ms():
    p = ModelParams(triton_gemm_speed_by_m=((1024, 0.95), (8192, 0.80)))
    assert p.triton_gemm_speed(512) == 0.95 and p.triton_gemm_speed(16384) == 0.80
    assert p.triton_gemm_speed(2048) == pytest.approx(0.95 - 0.05)  # a third of the way in log2 M
    assert ModelParams().triton_gemm_speed(1024) is None


def test_a_triton_gemm_takes_the_vendor_gemms_time_over_the_measured_speed_at_its_m():
    p = replace(ModelParams.from_hardware(H200), triton_gemm_speed_by_m=((1024, 0.5), (8192, 0.5)))
    vendor = gemm_time(4096, 8192, 8192, "bf16", H200, p, kind="vendor")
    triton = gemm_time(4096, 8192, 8192, "bf16", H200, p, kind="triton")
    assert triton - p.kernel_overhead_s == pytest.approx((vendor - p.kernel_overhead_s) / 0.5)


def test_the_gemms_first_wave_waits_for_the_copys_first_round():
    """256 tiles on 132 programs (two waves of 90 us), 64 own: the first wave's remote tiles need the
    single round of the copy (60 us), so the GEMM ends 60 us + the flag after its two waves' work."""
    end = arrival_waves_time(182e-6, 2e-6, 256, 132, 64, 1, 60e-6, 1e-6)
    assert end == pytest.approx(2e-6 + 60e-6 + 1e-6 + 180e-6)
    # the own slab covering the first wave and rounds arriving early: nothing to wait for
    assert arrival_waves_time(1600e-6, 2e-6, 2048, 132, 512, 6, 60e-6, 1e-6) == pytest.approx(1600e-6)


def test_the_closed_form_is_the_programs_chains_simulated_tile_by_tile():
    """Each program's tiles one after another, a remote one starting no earlier than its round +
    the flag: the slowest program's end, simulated directly, on random grids."""
    import random

    rng = random.Random(7)
    for _ in range(200):
        slots, tiles = rng.randint(1, 40), rng.randint(1, 300)
        own, rounds = rng.randint(0, tiles), rng.randint(1, 9)
        gemm, t0, round_s, flag = rng.uniform(1e-4, 1e-3), 2e-6, rng.uniform(1e-6, 2e-4), 1e-6
        waves = -(-tiles // slots)
        per_tile = (gemm - t0) / waves
        end = 0.0
        for p in range(min(slots, tiles)):
            t = 0.0
            for i in range(p, tiles, slots):
                if i >= own:
                    t = max(t, -(-(i - own + 1) * rounds // (tiles - own)) * round_s + flag)
                t += per_tile
            end = max(end, t)
        want = gemm if own >= tiles else max(gemm, t0 + end)
        assert arrival_waves_time(gemm, t0, tiles, slots, own, rounds, round_s, flag) == pytest.approx(want)


def test_only_the_programs_whose_first_tile_is_remote_wait_for_the_round():
    """2 ranks at M=1024: 128 own tiles of 256 on 132 programs. Programs 128-131 wait 61 us for one
    tile each (151 us); the others reach their remote second tile after 90 us, when it has landed:
    the GEMM ends with its own two waves (a global-wave model would add the 61 us)."""
    assert arrival_waves_time(182e-6, 2e-6, 256, 132, 128, 1, 60e-6, 1e-6) == pytest.approx(182e-6)
    # a round slower than a tile: the programs' second (remote) tiles wait for it
    end = arrival_waves_time(182e-6, 2e-6, 256, 132, 128, 1, 120e-6, 1e-6)
    assert end == pytest.approx(2e-6 + 121e-6 + 90e-6)


def test_the_gemms_last_programs_start_when_the_copy_that_holds_their_sms_ends():
    """2 ranks at M=1024 (256 tiles, 128 own, 132 programs of two 90 us tiles at most), the copy's 16
    programs placed first: GEMM programs 116-131 wait for the copy to end (60 us); 116-123 then have
    two tiles (own + remote, the rows landed): the GEMM ends 60 us later than with every SM free."""
    free = arrival_waves_time(182e-6, 2e-6, 256, 132, 128, 1, 60e-6, 1e-6)
    late = arrival_waves_time(182e-6, 2e-6, 256, 132, 128, 1, 60e-6, 1e-6, late_programs=16, late_start_s=60e-6)
    assert free == pytest.approx(182e-6)
    assert late == pytest.approx(2e-6 + 60e-6 + 180e-6)
    # late programs with one tile (the grid's last 4, 260 tiles on 132): hidden while start + a tile
    # stays within the others' two tiles, else one tile after their start
    assert arrival_waves_time(182e-6, 2e-6, 260, 132, 260, 0, 0.0, 0.0, late_programs=4,
                              late_start_s=80e-6) == pytest.approx(182e-6)
    assert arrival_waves_time(182e-6, 2e-6, 260, 132, 260, 0, 0.0, 0.0, late_programs=4,
                              late_start_s=150e-6) == pytest.approx(2e-6 + 150e-6 + 90e-6)


def test_the_closed_form_with_late_programs_is_the_chains_simulated_tile_by_tile():
    import random

    rng = random.Random(11)
    for _ in range(200):
        slots, tiles = rng.randint(1, 40), rng.randint(1, 300)
        grid = min(slots, tiles)
        own, rounds, late = rng.randint(0, tiles), rng.randint(1, 9), rng.randint(0, grid)
        gemm, t0, round_s, flag = rng.uniform(1e-4, 1e-3), 2e-6, rng.uniform(1e-6, 2e-4), 1e-6
        start = rng.uniform(0, 3e-4)
        per_tile = (gemm - t0) / -(-tiles // slots)
        end = 0.0
        for p in range(grid):
            t = start if p >= grid - late else 0.0
            for i in range(p, tiles, slots):
                if i >= own:
                    t = max(t, -(-(i - own + 1) * rounds // (tiles - own)) * round_s + flag)
                t += per_tile
            end = max(end, t)
        got = arrival_waves_time(gemm, t0, tiles, slots, own, rounds, round_s, flag, late_programs=late,
                                 late_start_s=start)
        assert got == pytest.approx(max(gemm, t0 + end))


def test_which_kernel_reaches_the_sms_first_depends_on_how_the_step_starts():
    assert ag_gemm.copy_first_share(replace(ModelParams(), start_alignment="host")) == 1.0
    assert ag_gemm.copy_first_share(replace(ModelParams(), start_alignment="device")) == 0.5
    assert ag_gemm.copy_first_share(replace(ModelParams(), start_alignment="back-to-back")) == 0.5
    # 16 copy programs on 132 SMs: the last 16 of a 132-program grid wait; a 40-program grid fits beside them
    assert ag_gemm.late_programs(256, H200, 16) == 16
    assert ag_gemm.late_programs(40, H200, 16) == 0
    assert ag_gemm.late_programs(256, H200, 300) == 132


def test_the_step_waits_for_the_slowest_ranks_order():
    """Each rank draws its order on its own; the step ends with the slowest rank, so at W ranks the
    faster time is had only when every rank drew it: 1/2^W of steps under a race."""
    assert ag_gemm.expected_slowest(240.0, 190.0, 0.5, 1) == pytest.approx(215.0)
    assert ag_gemm.expected_slowest(240.0, 190.0, 0.5, 2) == pytest.approx(0.75 * 240 + 0.25 * 190)
    assert ag_gemm.expected_slowest(240.0, 190.0, 0.5, 4) == pytest.approx(240 - 50 / 16)
    assert ag_gemm.expected_slowest(240.0, 190.0, 1.0, 4) == pytest.approx(240.0)
    # a copy first that is the faster order (M=1024 on 4 ranks: the GEMM waits for the round anyway)
    assert ag_gemm.expected_slowest(230.0, 240.0, 0.5, 2) == pytest.approx(0.25 * 230 + 0.75 * 240)


@pytest.mark.parametrize("align,share", [("host", 1.0), ("back-to-back", 0.5)])
def test_the_fused_gemm_is_the_expected_slowest_of_the_two_orders(align, share):
    p = replace(ModelParams.from_hardware(H200), ag_transport="sm", copy_program_bytes_per_s=8.5e9,
                gemm_share_loss=0.2, start_alignment=align)
    coll = CollectiveModel.from_hardware(H200, topology(H200, 2, p), p)
    plans, det, notes = ag_gemm.plans("pull", {"M": 1024, "N": 8192, "K": 8192}, 2, H200, p, coll)
    alone = gemm_time(1024, 8192, 8192, "bf16", H200, p, kind="triton")
    round_s = 128 * 2048 * 2 / 8.5e9
    # the copy first: the GEMM's last 16 programs start after the copy's one round, then two tiles, no share loss
    assert det["copy_first"] == pytest.approx(p.kernel_overhead_s + round_s + (alone - p.kernel_overhead_s))
    assert det["gemm_first"] == pytest.approx(det["triton_gemm"]) and det["triton_gemm"] > alone
    assert det["pipeline"] == pytest.approx(ag_gemm.expected_slowest(det["copy_first"], det["gemm_first"], share, 2))
    assert "last 16 programs wait for the copy to end" in notes[-1]


@pytest.mark.parametrize("m,items,rounds", [(1024, 24, 1), (8192, 192, 6)])
def test_the_copy_kernel_beside_the_gemm_moves_its_items_in_rounds_at_one_programs_rate(m, items, rounds):
    p = replace(ModelParams.from_hardware(H200), ag_transport="sm", copy_program_bytes_per_s=8.5e9)
    coll = CollectiveModel.from_hardware(H200, topology(H200, 4, p), p)
    plans, det, notes = ag_gemm.plans("pull", {"M": m, "N": 8192, "K": 8192}, 4, H200, p, coll)
    item = 128 * 2048 * 2
    assert det["transfer"] == pytest.approx(max(rounds * item / 8.5e9, 3 * m // 4 * 8192 * 2 / H200.link_bytes_per_s)
                                            + p.kernel_overhead_s)
    assert f"{items} items of 128x2048 in {rounds} round(s)" in notes[-1]
    assert plans[0][0].name == "copy_blocks_kernel" and plans[0][1].sync


def _calibrated_h100(tmp_path, **fields) -> str:
    meas = {"hbm": {"bytes_per_s": 3.0e12}, "gemm": {"bf16": {"flops_per_s": 7.2e14}},
            "peer_copy": [{"bytes_per_s": 2.5e11}]}
    spec = {**calfit.fit(meas, "NVIDIA H100 80GB HBM3", 132, 4), **fields}
    path = tmp_path / "h100-calibrated.json"
    path.write_text(json.dumps(spec))
    return str(path)


def test_a_file_without_the_new_fields_borrows_them_and_the_prediction_says_from_which_gpu(tmp_path):
    hw = load_hardware(_calibrated_h100(tmp_path))
    lender = next(iter(fitted_sets(FITTED_FILE)))
    pred = predict("flash_decode", "fused", SHAPE, 4, hw, model_params(hw)[0])
    lines = [a for a in pred.assumptions if a.startswith("borrowed from another GPU")]
    assert len(lines) == 1 and f"from {lender}" in lines[0] and "ll_merge_step_s" in lines[0]
    # what this GPU's calibration measured is its own: the fit of another GPU does not replace it
    own = load_hardware(_calibrated_h100(tmp_path, ll_merge_step_s=0.9e-6))
    p = predict("flash_decode", "fused", SHAPE, 4, own, model_params(own)[0]).params
    assert p.ll_merge_step_s == 0.9e-6 and p.sources["ll_merge_step_s"].startswith("hardware extra")
    assert "ll_merge_step_s" not in p.borrowed()


def test_fields_that_do_not_read_are_ignored_with_one_caveat_not_a_traceback(tmp_path):
    hw = load_hardware(_calibrated_h100(tmp_path, copy_program_bytes_per_s="fast", triton_gemm_speed_by_m=[[1024]],
                                        ll_merge_step_s=-1.0))
    pred = predict("ag_gemm", "pull", {"M": 1024, "N": 8192, "K": 8192}, 4, hw, model_params(hw)[0])
    (line,) = [a for a in pred.assumptions if "ignored field(s)" in a]
    for name in ("copy_program_bytes_per_s", "triton_gemm_speed_by_m", "ll_merge_step_s"):
        assert name in line
    # an ignored field is as if missing: the default, or another GPU's fit where there is one (said so)
    assert pred.params.triton_gemm_speed_by_m == ()
    assert pred.params.sources["copy_program_bytes_per_s"] in ("default",) or \
        "copy_program_bytes_per_s" in pred.params.borrowed()


def test_a_file_from_an_older_taxmodel_is_used_with_its_caveat(tmp_path):
    """A calibrated file as taxmodel wrote them before issue 33: no kernel fields, fields since renamed."""
    old = {"name": "H100 SXM (calibrated)", "vendor": "nvidia", "source": "calibrated", "num_sms": 132,
           "peak_flops": {"bf16": 7.1e14}, "hbm_bytes_per_s": 3.0e12, "link_bytes_per_s": 3.3e11,
           "combine_step_us": 0.9, "collectives": {"world_size": 4, "timing": {}}}
    path = tmp_path / "old-calibrated.json"
    path.write_text(json.dumps(old))
    r = CliRunner().invoke(cli, ["predict", "gemm_rs", "-n", "4", "--hardware", str(path), "--preset", "m1024"])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert "borrowed from another GPU" in r.output


def test_validate_with_a_hardware_file_of_another_gpu_says_so_in_one_line(tmp_path):
    model_bundle(tmp_path / "b" / "bsp", "bsp", {"M": 4096, "N": 8192, "K": 8192, "tp": 0}, 2)
    h100 = _calibrated_h100(tmp_path)
    v = val.validate(tmp_path / "b", fitted_from=FITTED_FILE, hardware=h100)
    caveats = [n for n in v.notes if "describes another GPU" in n]
    assert caveats == ["hardware H100 SXM (calibrated) describes another GPU than the bundles' NVIDIA H200: its "
                       "numbers are used as given (calibrate on the GPU that ran them for predictions of that GPU)"]
    assert v.cases[0].hardware.name == "H100 SXM (calibrated)"
    r = CliRunner().invoke(cli, ["validate", str(tmp_path / "b"), "--fitted-from", str(FITTED_FILE),
                                 "--hardware", h100])
    assert r.exit_code in (0, 1) and "Traceback" not in r.output and "describes another GPU" in r.output, r.output
    same = val.validate(tmp_path / "b", fitted_from=FITTED_FILE, hardware="h200")
    assert not [n for n in same.notes if "describes another GPU" in n]


def test_a_calibrated_mechanism_is_neither_borrowed_nor_fitted_and_its_stand_ins_stay_out():
    sets = {"H200 SXM (calibrated)": {"triton_gemm_efficiency": 0.8, "rs_gemm_efficiency": 0.85, "ll_merge_step_s": 1e-6}}
    hw = HardwareSpec(name="X (calibrated)", vendor="nvidia", source="calibrated", peak_flops={"bf16": 1e15},
                      hbm_bytes_per_s=3e12, link_bytes_per_s=3e11, extra={"triton_gemm_speed_by_m": [[1024, 0.9]]})
    assert calibrated_mechanisms(hw) == {"triton_gemm_speed_by_m", "triton_gemm_efficiency"}
    values, lender = choose_fitted(sets, hw.name, calibrated_mechanisms(hw), not_borrowed(hw))
    assert (values, lender) == ({"ll_merge_step_s": 1e-6}, "H200 SXM (calibrated)")
    # this GPU's own fit of its GEMM+RS kernel still counts (it is more specific than the GEMM alone)
    own, lender = choose_fitted({**sets, hw.name: {"rs_gemm_efficiency": 0.9}}, hw.name, calibrated_mechanisms(hw))
    assert (own, lender) == ({"rs_gemm_efficiency": 0.9}, None)
    from taxmodel.model import fitting
    from taxmodel.model.cases import Case

    case = Case(path=None, workload="ag_gemm", variant="pull", shape={"M": 8192, "N": 8192, "K": 8192, "tp": 0},
                world_size=4, cost=None, hardware=hw, hardware_note="", measured={"latency": 1.0})
    assert "triton_gemm_efficiency" not in {r.param for r in fitting._rules_of(case)}


def test_a_parameter_fitted_from_rows_entered_by_hand_says_so(tmp_path):
    """Rows typed in from measurements made outside `taxmodel calibrate` (their raw dict names its
    source) make the parameter they feed say so; the others read as calibrated. The shipped H200
    file's tile_gemm rows were once such rows; since 2026-11-28 calibrate measured them on an H200."""
    from taxmodel.hardware.specs import find_preset

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # beside the calibrate tests
    from shipped_calibration import SHIPPED

    shipped = ModelParams.from_hardware(find_preset("h200-calibrated"))
    assert shipped.sources["triton_gemm_speed_by_m"] == "hardware extra (calibrated)"
    spec = json.loads(SHIPPED.read_text())
    spec["measured"]["raw"]["tile_gemm"]["source"] = "typed in from a notebook on one H200"
    refit = calfit.fit(spec["measured"]["raw"], "NVIDIA H200", spec["num_sms"], 4, vendor="nvidia")
    path = tmp_path / "h200-hand-calibrated.json"
    path.write_text(json.dumps({**refit, "measured": spec["measured"]}))
    p = ModelParams.from_hardware(load_hardware(str(path)))
    assert "entered by hand: typed in from a notebook" in p.sources["triton_gemm_speed_by_m"]
    assert p.sources["combine_step_s"].startswith("hardware extra (")
    assert "entered by hand" not in p.sources["combine_step_s"]
    assert "Not measured by `taxmodel calibrate`: measured.raw.tile_gemm" in refit["notes"]


def test_the_fused_local_combine_takes_the_calibrated_line_and_without_it_the_combine_kernels_step():
    """With the fused_combine step's fields the pair's last worker's local combine is steps x step,
    plus at one rank the line's fixed part (the one-rank epilogue, so no merge step follows it
    there; on W ranks push, waits and merges are modelled instead); without them, steps x
    ``combine_step_s`` and the merge step as before; slice combiners (another tile per step) keep
    ``combine_step_s``."""
    from taxmodel.kernels.flash_decode.split_kv import plan_splits
    from taxmodel.kernels.flash_decode.workload import split_config

    # the shipped H200 file without its fused_combine fields (measured since)
    hw = replace(H200, extra={k: v for k, v in H200.extra.items()
                              if not k.startswith(("fused_local_combine", "fused_fold"))})
    base = ModelParams.from_hardware(hw, combine_step_s=0.9e-6, ll_merge_step_s=1.4e-6)
    cal = ModelParams.from_hardware(hw, **_given(base), fused_local_combine_step_s=0.6e-6,
                                    fused_local_combine_fixed_s=2.2e-6)
    for batch, kv in ((1, 16384), (16, 1024)):
        shape = {**SHAPE, "batch": batch, "kv_len": kv}
        steps = -(-plan_splits(batch, 4, kv, hw.num_sms, split_config(shape, "cuda")).num_splits // 4)
        for world in (1, 4):
            old = predict("flash_decode", "fused", shape, world, hw, base)
            new = predict("flash_decode", "fused", shape, world, hw, cal)
            assert old.details["local_combine"] == pytest.approx(steps * 0.9e-6)
            fixed = 2.2e-6 if world == 1 else 0.0
            assert new.details["local_combine"] == pytest.approx(fixed + steps * 0.6e-6)
            assert new.details["fused_work"] - old.details["fused_work"] == pytest.approx(
                fixed + steps * 0.6e-6 - steps * 0.9e-6)
            # the merge of the ranks' partials: unchanged on 4 ranks; at one rank the measured tail holds it
            assert new.details["combine"] == (0.0 if world == 1 else old.details["combine"])
            assert any("calibrated fused_combine step" in a for a in new.assumptions)
            assert any("no fused_combine calibration" in a for a in old.assumptions)
    spread = {**SHAPE, "batch": 1, "kv_len": 16384, "fused_slices": 4}
    assert predict("flash_decode", "fused", spread, 4, hw, cal).details["local_combine"] == pytest.approx(
        predict("flash_decode", "fused", spread, 4, hw, base).details["local_combine"])
    assert cal.sources["fused_local_combine_step_s"] == "given"
    # from a hardware file: its value, sourced as calibrated; a file without it: the default (None), said so
    with_fields = replace(hw, extra={**dict(hw.extra), "fused_local_combine_step_s": 0.6e-6,
                                     "fused_local_combine_fixed_s": 2.2e-6})
    p = ModelParams.from_hardware(with_fields)
    assert p.fused_local_combine_step_s == pytest.approx(0.6e-6) and "calibrated" in p.sources["fused_local_combine_step_s"]
    assert "fused_local_combine_step_s" in calibrated_mechanisms(with_fields)
    q = ModelParams.from_hardware(hw)
    assert q.fused_local_combine_step_s is None and q.sources["fused_local_combine_step_s"] == "default"


def test_on_several_ranks_the_fold_takes_its_own_step_and_at_one_rank_the_measured_line():
    """``fused_fold_step_s`` (the fused_combine line's slope through its L2-resident rows) is the
    fold's step on W ranks; at one rank the line as measured (its fixed part and step) stays, since
    the calibration timed that very kernel; without the fold step W ranks take the line's step."""
    from taxmodel.kernels.flash_decode.split_kv import plan_splits
    from taxmodel.kernels.flash_decode.workload import split_config

    hw = replace(H200, extra={k: v for k, v in H200.extra.items()
                              if not k.startswith(("fused_local_combine", "fused_fold"))})
    line = dict(fused_local_combine_step_s=0.82e-6, fused_local_combine_fixed_s=3.8e-6)
    without = ModelParams.from_hardware(hw, **line)
    with_fold = ModelParams.from_hardware(hw, **line, fused_fold_step_s=0.7e-6)
    shape = {**SHAPE, "batch": 1, "kv_len": 16384}
    steps = -(-plan_splits(1, 4, 16384, hw.num_sms, split_config(shape, "cuda")).num_splits // 4)
    one = predict("flash_decode", "fused", shape, 1, hw, with_fold)
    assert one.details["local_combine"] == pytest.approx(3.8e-6 + steps * 0.82e-6)
    assert one.details["local_combine"] == pytest.approx(
        predict("flash_decode", "fused", shape, 1, hw, without).details["local_combine"])
    for world in (2, 4):
        old = predict("flash_decode", "fused", shape, world, hw, without)
        new = predict("flash_decode", "fused", shape, world, hw, with_fold)
        assert old.details["local_combine"] == pytest.approx(steps * 0.82e-6)
        assert new.details["local_combine"] == pytest.approx(steps * 0.7e-6)
        assert new.window_ns == pytest.approx(old.window_ns - steps * 0.12e3, rel=1e-6)
        assert any("L2-resident rows" in a for a in new.assumptions)
        assert not any("L2-resident rows" in a for a in old.assumptions)
    from_file = ModelParams.from_hardware(replace(hw, extra={**dict(hw.extra), **line, "fused_fold_step_s": 0.7e-6}))
    assert from_file.fused_fold_step_s == pytest.approx(0.7e-6) and "calibrated" in from_file.sources["fused_fold_step_s"]


def _given(p: ModelParams) -> dict:
    return {k: getattr(p, k) for k, src in p.sources.items() if src == "given"}


# --- the copy kernel's push-mode rate (copy_program_push_bytes_per_s) ---------------------------------

def _ag_plans(p: ModelParams, variant: str, m: int = 1024, world: int = 2):
    coll = CollectiveModel.from_hardware(H200, topology(H200, world, p), p)
    return ag_gemm.plans(variant, {"M": m, "N": 8192, "K": 8192}, world, H200, p, coll)


def test_the_push_variant_moves_its_rounds_at_the_push_rate_and_pull_keeps_the_pull_rate():
    p = replace(ModelParams.from_hardware(H200), ag_transport="sm", copy_program_bytes_per_s=8.9e9,
                copy_program_push_bytes_per_s=15.9e9)
    item = 128 * 2048 * 2
    _, pull, pull_notes = _ag_plans(p, "pull")
    _, push, push_notes = _ag_plans(p, "push")
    # M=1024 on 2 ranks: 16 items on 16 programs, one round (the link time is shorter)
    assert pull["transfer"] == pytest.approx(item / 8.9e9 + p.kernel_overhead_s)
    assert push["transfer"] == pytest.approx(item / 15.9e9 + p.kernel_overhead_s)
    assert push["copy_first"] < pull["copy_first"] and push["pipeline"] <= pull["pipeline"]
    assert any("15.9 GB/s per program" in n and "copy_program_push_bytes_per_s" in n for n in push_notes)
    assert not any("no push-mode copy rate" in n for n in pull_notes + push_notes)
    # pull does not change with the push rate
    without = replace(p, copy_program_push_bytes_per_s=0.0)
    assert _ag_plans(without, "pull")[1] == pull


def test_without_a_push_rate_push_takes_the_pull_rate_exactly_and_the_prediction_says_so(tmp_path):
    from taxmodel.trace.capture_meta import CaptureSettings

    p = replace(ModelParams.from_hardware(H200), ag_transport="sm", copy_program_bytes_per_s=8.9e9)
    assert p.copy_program_push_bytes_per_s == 0.0 and p.sources["copy_program_push_bytes_per_s"] == "default"
    plans, det, notes = _ag_plans(p, "push")
    same = replace(p, copy_program_push_bytes_per_s=8.9e9)
    assert _ag_plans(same, "push")[1] == det  # the same numbers as a push rate equal to the pull rate
    (line,) = [n for n in notes if "no push-mode copy rate" in n]
    assert "copy_program_push_bytes_per_s" in line and "pull-mode rate" in line
    assert not any("no push-mode copy rate" in n for n in _ag_plans(p, "pull")[2])
    # neither rate known: the bandwidth model for both, no caveat
    bare = replace(p, copy_program_bytes_per_s=0.0)
    assert not any("no push-mode copy rate" in n for n in _ag_plans(bare, "push")[2])
    # from hardware files: one without the field (an older calibration) predicts with the caveat, no
    # traceback; one with it takes it, sourced as calibrated; one whose field does not read ignores it
    settings = CaptureSettings(transport="sm", align="back-to-back")
    shape = {"M": 1024, "N": 8192, "K": 8192}
    for fields, caveat in (({"copy_program_bytes_per_s": 8.9e9}, True),
                           ({"copy_program_bytes_per_s": 8.9e9, "copy_program_push_bytes_per_s": 15.9e9}, False),
                           ({"copy_program_bytes_per_s": 8.9e9, "copy_program_push_bytes_per_s": "fast"}, True)):
        hw = load_hardware(_calibrated_h100(tmp_path, **fields))
        params = model_params(hw, settings)[0]
        pred = predict("ag_gemm", "push", shape, 2, hw, params)
        assert any("no push-mode copy rate" in a for a in pred.assumptions) == caveat
        if not caveat:
            assert params.copy_program_push_bytes_per_s == 15.9e9
            assert params.sources["copy_program_push_bytes_per_s"].startswith("hardware extra")
            assert "copy_program_push_bytes_per_s" in calibrated_mechanisms(hw)
        else:
            assert pred.details["transfer"] == pytest.approx(
                predict("ag_gemm", "pull", shape, 2, hw, params).details["transfer"])
