"""The fits of `taxmodel calibrate`'s microbenchmarks of the workloads' own kernels (issue 33): made-up
raw rows with known answers, worked out by hand here, independently of the model that uses them."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from taxmodel.errors import InputError

from taxmodel.model import calibration as calfit


def test_the_tile_gemms_speed_by_m_is_the_vendor_time_over_the_tile_time_sorted_by_m():
    rows = [{"m": 8192, "tile_s": 2.0e-3, "vendor_s": 1.6e-3}, {"m": 1024, "tile_s": 200e-6, "vendor_s": 190e-6},
            {"m": 4096, "tile_s": "fast", "vendor_s": 1.0}, {"m": 2048}]  # the last two are not measurements
    assert calfit.gemm_speed_by_m({"rows": rows}) == [[1024.0, 0.95], [8192.0, 0.8]]
    assert calfit.gemm_speed_by_m(None) is None and calfit.gemm_speed_by_m({"rows": "x"}) is None


def test_the_copy_programs_rate_counts_rounds_of_items_and_the_gemms_loss_is_a_share_of_the_copy():
    # M=1024 on 4 ranks: 24 items of 128 x 2048 bf16 (512 KiB) on 24 programs: one round in 62 us
    one = {"items": 24, "programs": 24, "item_bytes": 524288, "copy_shared_s": 62e-6, "gemm_alone_s": 180e-6,
           "gemm_shared_s": 186.2e-6}
    # M=8192: 192 items on 32 programs, six rounds in 366 us
    six = {"items": 192, "programs": 32, "item_bytes": 524288, "copy_shared_s": 366e-6, "gemm_alone_s": 1.6e-3,
           "gemm_shared_s": 1.6e-3}
    fit = calfit.copy_share_fit({"rows": [one, six]})
    rates = sorted([524288 / 62e-6, 6 * 524288 / 366e-6])
    assert fit["copy_program_bytes_per_s"] == pytest.approx(sum(rates) / 2)  # the median of two
    assert fit["gemm_share_loss"] == pytest.approx(round((6.2e-6 / 62e-6 + 0.0) / 2, 4))
    assert calfit.copy_share_fit({"rows": [{"items": 0}]}) == {} and calfit.copy_share_fit(None) == {}


def test_the_split_kv_line_comes_back_from_points_on_it():
    """Points made on t = 2.5 us + bytes / (1.1 x HBM): the fit returns that efficiency and fixed cost."""
    hbm, eff, fixed = 4.0e12, 1.1, 2.5e-6
    hq, hkv, d = 32, 4, 128
    rows = []
    for b, kv, s in ((1, 1024, 16), (1, 16384, 86), (16, 1024, 6), (16, 65536, 6), (1, 262144, 98)):
        nbytes = 2 * b * hkv * kv * d * 2 + b * hq * s * (d + 1) * 4
        rows.append({"batch": b, "kv_len": kv, "splits": s, "split_s": fixed + nbytes / (eff * hbm)})
    fit = calfit.split_kv_fit({"q_heads": hq, "kv_heads": hkv, "head_dim": d, "rows": rows}, hbm)
    assert fit["triton_stream_efficiency"] == pytest.approx(eff, abs=1e-4)
    assert fit["split_kv_fixed_s"] == pytest.approx(fixed, rel=1e-6)
    assert calfit.split_kv_fit({"q_heads": hq, "kv_heads": hkv, "head_dim": d, "rows": rows[:1]}, hbm) == {}
    assert calfit.split_kv_fit({"rows": rows}, hbm) == {}  # no heads: not the combine step's rows


def test_rows_that_fit_the_l2_give_their_own_line_and_the_streamed_rows_the_hbm_line():
    """Points on two lines, as one H100 showed them: up to 0.75 of a 50 MB L2 at 5 TB/s + 2.5 us
    (the K/V stays in the L2 between calls), from 1.5 of it at 1.0 x HBM + 5 us; one point in the
    band between is in neither fit."""
    hbm, l2 = 3.0e12, 50 << 20
    hq, hkv, d = 32, 4, 128
    rows = []
    for b, kv, s in ((1, 1024, 16), (1, 4096, 64), (1, 16384, 86), (16, 1024, 6), (1, 32768, 90),
                     (1, 65536, 94), (16, 4096, 6), (16, 16384, 6), (1, 262144, 98)):
        n = 2 * b * hkv * kv * d * 2 + b * hq * s * (d + 1) * 4
        t = 2.5e-6 + n / 5e12 if n <= 0.75 * l2 else (5e-6 + n / hbm if n >= 1.5 * l2 else 1.0)
        rows.append({"batch": b, "kv_len": kv, "splits": s, "split_s": t})
    fit = calfit.split_kv_fit({"q_heads": hq, "kv_heads": hkv, "head_dim": d, "rows": rows}, hbm, l2)
    assert fit["split_kv_resident_bytes_per_s"] == pytest.approx(5e12, rel=1e-6)
    assert fit["split_kv_resident_fixed_s"] == pytest.approx(2.5e-6, rel=1e-6)
    assert fit["triton_stream_efficiency"] == pytest.approx(1.0, abs=1e-4)
    assert fit["split_kv_fixed_s"] == pytest.approx(5e-6, rel=1e-6)
    # without the L2's size: one line through every row, as before
    assert "split_kv_resident_bytes_per_s" not in calfit.split_kv_fit(
        {"q_heads": hq, "kv_heads": hkv, "head_dim": d, "rows": [r for r in rows if r["split_s"] < 1]}, hbm)


def test_the_split_kv_time_follows_the_resident_line_then_the_hbm_line_continuously():
    from dataclasses import replace

    from taxmodel.model.analytic.costs import split_kv_time
    from taxmodel.model.analytic.params import ModelParams
    from taxmodel.hardware.specs import HardwareSpec

    hw = HardwareSpec(name="toy", vendor="nvidia", source="calibrated", peak_flops={"bf16": 1e15}, hbm_bytes_per_s=3e12,
                      link_bytes_per_s=4e11, num_sms=132, l2_bytes=50 << 20)
    p = replace(ModelParams(), triton_stream_efficiency=1.0, split_kv_fixed_s=5e-6, split_kv_resident_bytes_per_s=5e12,
                split_kv_resident_fixed_s=2.5e-6)
    l2 = 50 << 20
    assert split_kv_time(10e6, hw, p) == pytest.approx(2.5e-6 + 10e6 / 5e12)
    assert split_kv_time(2 * l2, hw, p) == pytest.approx(5e-6 + 2 * l2 / 3e12)
    lo, hi = 0.75 * l2, 1.5 * l2
    mid = split_kv_time((lo + hi) / 2, hw, p)
    assert mid == pytest.approx((split_kv_time(lo, hw, p) + split_kv_time(hi, hw, p)) / 2)
    # not calibrated: the HBM line everywhere
    assert split_kv_time(10e6, hw, replace(p, split_kv_resident_bytes_per_s=0.0)) == pytest.approx(5e-6 + 10e6 / 3e12)


def test_refit_rewrites_a_files_numbers_from_its_raw_rows_and_logs_it(tmp_path):
    import json

    from shipped_calibration import shipped_four_ranks

    shipped = shipped_four_ranks()
    src = tmp_path / "cal.json"
    src.write_text(json.dumps(shipped))
    out = calfit.refit_file(str(src), str(tmp_path / "new.json"))
    new = json.loads(open(out).read())
    assert new["measured"]["updates"][-1]["refit"] is True and new["measured"]["updates"][-1]["steps"] == []
    assert new["name"] == shipped["name"] and new["aliases"] == shipped["aliases"]
    assert new["measured"]["raw"] == shipped["measured"]["raw"]
    assert "split_kv_resident_bytes_per_s" in new  # the shipped H200 rows span both sides of its L2
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="not a hardware file"):
        calfit.refit_file(str(tmp_path / "bad.json"), str(tmp_path / "x.json"))
    assert not (tmp_path / "x.json").exists()


def test_ll_pushes_are_the_peer_bytes_per_push_over_the_time_a_push_adds():
    m = {"programs": 64, "rows": 8, "head_dim": 128, "world": 4, "reps": [4, 36], "push_s": [10e-6, 74e-6]}
    per_push = 64e-6 / 32
    assert calfit.ll_push_rate(m) == pytest.approx(64 * 3 * 8 * 129 * 8 / per_push)
    assert calfit.ll_push_rate({**m, "world": 1}) is None  # one GPU: nothing goes to a peer
    assert calfit.ll_push_rate({**m, "push_s": [10e-6, 9e-6]}) is None  # noise: no rate


def test_an_ll_merge_step_is_what_one_more_source_adds():
    assert calfit.ll_merge_step({"sources": [2, 34], "merge_s": [5e-6, 37e-6]}) == pytest.approx(1e-6)
    assert calfit.ll_merge_step({"sources": [2], "merge_s": [5e-6]}) is None


def test_a_reduction_programs_rate_is_charged_as_the_model_charges_it():
    """(W + 1) tiles of bytes over the kernel less its fixed cost and W waits on set flags."""
    row = {"world": 4, "block_m": 128, "block_n": 256, "element_bytes": 2, "reduce_s": 14.0e-6}
    rate = calfit.reduce_rate({"rows": [row]}, flag_wait_s=0.5e-6, kernel_overhead_s=2e-6)
    assert rate == pytest.approx(5 * 128 * 256 * 2 / (14e-6 - 2e-6 - 4 * 0.5e-6))
    assert calfit.reduce_rate({"rows": [{**row, "reduce_s": 1e-6}]}, 0.5e-6) is None  # shorter than its fixed cost


def test_the_push_cost_is_the_time_beyond_the_vendor_gemm_per_byte_pushed_and_never_negative():
    """(rs_s - vendor_s) over (W-1)/W of M x N elements of element_bytes (2 where a row has none);
    a row of one rank pushed nothing and gives no point; a kernel faster than the vendor GEMM costs 0."""
    rows = [{"m": 1024, "n": 8192, "world": 4, "rs_s": 7.6e-5, "vendor_s": 4.6e-5},
            {"m": 8192, "n": 8192, "world": 2, "element_bytes": 4, "rs_s": 9e-4, "vendor_s": 8e-4},
            {"m": 4096, "n": 8192, "world": 4, "rs_s": 1e-4, "vendor_s": 2e-4},
            {"m": 2048, "n": 8192, "world": 1, "rs_s": 2e-4, "vendor_s": 1e-4}]
    pts = calfit.rs_push_cost_by_m({"rows": rows})
    assert [p[0] for p in pts] == [1024.0, 4096.0, 8192.0]
    assert pts[0][1] == pytest.approx(3.0e-5 / (1024 * 8192 * 2 * 3 / 4), rel=1e-3)
    assert pts[1][1] == 0.0
    assert pts[2][1] == pytest.approx(1e-4 / (8192 * 8192 * 4 / 2), rel=1e-3)
    assert calfit.rs_push_cost_by_m({"rows": rows[3:]}) is None
    assert calfit.rs_push_cost_by_m({"rows": rows, "peers": calfit.ONE_GPU_PEERS}) is None  # no link crossed


def test_fit_writes_every_measured_mechanism_under_its_model_parameter_name():
    from taxmodel.model.analytic.params import CALIBRATED_MECHANISMS, ModelParams

    meas = {"hbm": {"bytes_per_s": 3e12}, "gemm": {"bf16": {"flops_per_s": 7e14}}, "peer_copy": [{"bytes_per_s": 3e11}],
            "tile_gemm": {"rows": [{"m": 1024, "tile_s": 2e-4, "vendor_s": 1.9e-4}]},
            "rs_gemm": {"rows": [{"m": 8192, "rs_s": 8e-4, "vendor_s": 7.2e-4, "order": "spread"},
                                 {"m": 1024, "rs_s": 1e-4, "vendor_s": 8e-5, "order": "spread"},
                                 {"m": 1024, "rs_s": 1e-4, "vendor_s": 7e-5}]},  # no order: peers first
            "copy_share": {"rows": [{"items": 24, "programs": 24, "item_bytes": 524288, "copy_shared_s": 6e-5}]},
            "ll_merge": {"sources": [2, 34], "merge_s": [5e-6, 37e-6]},
            "reduce": {"rows": [{"world": 4, "block_m": 128, "block_n": 256, "element_bytes": 2, "reduce_s": 14e-6}]}}
    spec = calfit.fit(meas, "NVIDIA H100 80GB HBM3", 132, 1)
    assert spec["triton_gemm_speed_by_m"] == [[1024.0, 0.95]]
    assert spec["rs_gemm_speed_by_m"] == [[1024.0, 0.8], [8192.0, 0.9]]
    assert spec["rs_gemm_speed_by_m_peers_first"] == [[1024.0, 0.7]]  # each tile order fitted from its own rows
    assert spec["copy_program_bytes_per_s"] == pytest.approx(524288 / 6e-5)
    assert spec["ll_merge_step_s"] == pytest.approx(1e-6) and "ll_push_bytes_per_s" not in spec  # one rank
    assert math.isfinite(spec["reduce_program_bytes_per_s"])
    assert set(CALIBRATED_MECHANISMS) <= set(ModelParams.__dataclass_fields__)


def test_an_update_with_one_kernel_step_adds_its_parameter_and_changes_nothing_else():
    from shipped_calibration import shipped_four_ranks

    shipped = shipped_four_ranks()
    rows = [{"m": 1024, "n": 8192, "k": 8192, "tile_s": 1.9e-4, "vendor_s": 1.8e-4}]
    new = calfit.update_spec(shipped, {"tile_gemm": {"rows": rows}}, ("tile_gemm",), device_name="NVIDIA H200",
                             num_sms=132, world=4)
    assert new["triton_gemm_speed_by_m"] == [[1024.0, round(1.8 / 1.9, 4)]]
    # the step's rows replace the earlier ones whole: without a narrow row no narrow-tile factor is left
    assert "narrow_tile_gemm_factor" not in new
    for key, value in shipped.items():
        if key not in ("measured", "notes", "aliases", "triton_gemm_speed_by_m", "narrow_tile_gemm_factor"):
            assert new[key] == value, key
    assert "tile_gemm" in calfit.parse_steps("tile_gemm,reduce") and "ll" in calfit.STEP_KEYS


def test_one_gpu_calibrates_with_the_datasheets_link_and_says_so():
    meas = {"hbm": {"bytes_per_s": 3e12}, "gemm": {"bf16": {"flops_per_s": 7e14}}}
    spec = calfit.fit(meas, "NVIDIA H100 80GB HBM3", 132, 1)
    from taxmodel.hardware.specs import find_preset

    assert spec["link_bytes_per_s"] == find_preset("h100").link_bytes_per_s and "One GPU: link_bytes_per_s" in spec["notes"]
    with pytest.raises(ValueError, match="no link measurement"):
        calfit.fit(meas, "NVIDIA H100 80GB HBM3", 132, 2)  # two GPUs must measure theirs


def test_raw_rows_entered_by_hand_are_named_in_the_notes_with_the_fields_they_feed():
    """A raw step that names its own ``source`` was not measured by this calibration: the file's
    "measured by `taxmodel calibrate`" must not claim it; a measured step is not named."""
    meas = {"hbm": {"bytes_per_s": 3e12}, "gemm": {"bf16": {"flops_per_s": 7e14}}, "peer_copy": [{"bytes_per_s": 3e11}],
            "tile_gemm": {"rows": [{"m": 1024, "tile_s": 2e-4, "vendor_s": 1.9e-4}], "source": "my notes, by hand"},
            "copy_share": {"rows": [{"items": 24, "programs": 24, "item_bytes": 524288, "copy_shared_s": 6e-5}]}}
    notes = calfit.fit(meas, "NVIDIA H100 80GB HBM3", 132, 1)["notes"]
    assert ("Not measured by `taxmodel calibrate`: measured.raw.tile_gemm (feeds triton_gemm_speed_by_m, narrow_tile_gemm_factor): "
            "my notes, by hand.") in notes
    assert "copy_share" not in notes
    measured_only = {k: v for k, v in meas.items() if k != "tile_gemm"}
    assert "Not measured" not in calfit.fit(measured_only, "NVIDIA H100 80GB HBM3", 132, 1)["notes"]
    # every raw key a step writes says which fields it feeds (a new step adds its own)
    raw_keys = {k for keys in calfit.STEP_KEYS.values() for k in keys} - {"collectives_graph", "collectives_graph_note"}
    assert raw_keys <= set(calfit.RAW_FEEDS)


def test_the_shipped_calibration_is_its_raw_numbers_fitted_and_says_what_was_entered_by_hand():
    """Every field of the shipped H200 file (its notes included) is what ``fit`` makes of the raw
    numbers it keeps: no fitted number was edited by hand. Its tile GEMM rows, once typed in from
    DEVICE_NOTES' one-H200 measurements, were measured by `calibrate --only tile_gemm` on an H200
    (the update log keeps both): nothing in the file is claimed as measured that was not."""
    import json

    from shipped_calibration import SHIPPED

    shipped = json.loads(SHIPPED.read_text())
    m = shipped["measured"]
    refit = calfit.fit(m["raw"], "NVIDIA H200", shipped["num_sms"], int(m["world_size"]), vendor=shipped["vendor"])
    assert {k: v for k, v in shipped.items() if k != "measured"} == refit
    assert "Not measured by `taxmodel calibrate`" not in shipped["notes"]
    assert "source" not in m["raw"]["tile_gemm"]
    tile_updates = [u for u in m["updates"] if u.get("steps") == ["tile_gemm"]]
    assert "by hand" in tile_updates[0].get("note", "") and tile_updates[-1].get("device") == "NVIDIA H200"


# --- the fused flash decode's in-kernel local combine (fused_combine step) ---------------------------


def _fused_rows(fixed: float, step: float, shapes=((1, 512, 2, 4), (1, 2048, 8, 4), (1, 8192, 16, 4),
                                                      (1, 131072, 25, 4), (8, 2048, 3, 32), (16, 512, 2, 64))) -> dict:
    """Rows as ``calibrate_fused.measure`` writes them, on tail = fixed + steps x step (split 9 us)."""
    rows = [{"batch": b, "kv_len": kv, "splits": 4 * s, "pairs": p, "rows": 8, "steps": s, "kernels": 20,
             "split_s": 9e-6, "fused_s": 9e-6 + fixed + s * step, "tail_s": fixed + s * step}
            for b, kv, s, p in shapes]
    return {"q_heads": 32, "kv_heads": 4, "head_dim": 128, "world_size": 1, "rows": rows, "skipped": []}


def test_the_fused_local_combine_line_comes_back_from_tails_on_it():
    fit = calfit.fused_combine_fit(_fused_rows(2.2e-6, 0.6e-6))
    assert fit["fused_local_combine_step_s"] == pytest.approx(0.6e-6, rel=1e-9)
    assert fit["fused_local_combine_fixed_s"] == pytest.approx(2.2e-6, rel=1e-9)
    # weighted by 1/tail^2: a noisy long tail moves the short tails' fixed cost little
    noisy = _fused_rows(2.2e-6, 0.6e-6)
    noisy["rows"][3] = {**noisy["rows"][3], "tail_s": noisy["rows"][3]["tail_s"] * 1.2}
    assert calfit.fused_combine_fit(noisy)["fused_local_combine_fixed_s"] == pytest.approx(2.2e-6, rel=0.15)
    # a negative intercept is clamped to 0; one step count, no rows or the interpreter's equal times give nothing
    assert calfit.fused_combine_fit(_fused_rows(-0.5e-6, 1e-6))["fused_local_combine_fixed_s"] == 0.0
    one = _fused_rows(2e-6, 1e-6, shapes=((1, 512, 2, 4), (16, 512, 2, 64)))
    assert calfit.fused_combine_fit(one) == {} and calfit.fused_combine_fit(None) == {}
    flat = _fused_rows(2e-6, 1e-6)
    for r in flat["rows"]:
        r["tail_s"] = 0.0
    assert calfit.fused_combine_fit(flat) == {}


def test_the_fold_step_is_the_slope_through_the_l2_resident_rows_only():
    """Rows on tail = 4 us + steps x 0.7 us where the split work fits the L2; past it (KV 32K and 128K
    at batch 1: 67 and 268 MB of K/V) the tails lie 5 and 12 us above the line, as on one H200. The
    line through every row is pulled steeper; the fold's step is the resident rows' slope."""
    shapes = ((1, 512, 2, 4), (1, 2048, 8, 4), (1, 8192, 16, 4), (1, 32768, 22, 4), (1, 131072, 25, 4),
              (8, 2048, 3, 32), (16, 512, 1, 64))
    m = _fused_rows(4e-6, 0.7e-6, shapes=shapes)
    for r in m["rows"]:
        r["tail_s"] += {32768: 5e-6, 131072: 12e-6}.get(r["kv_len"], 0.0) if r["batch"] == 1 else 0.0
    l2 = 50 * 2 ** 20
    fit = calfit.fused_combine_fit(m, l2)
    assert fit["fused_fold_step_s"] == pytest.approx(0.7e-6, rel=1e-9)
    assert fit["fused_local_combine_step_s"] > 0.75e-6  # the one-rank line keeps every row
    assert {k: v for k, v in fit.items() if k != "fused_fold_step_s"} == calfit.fused_combine_fit(m)
    # no L2 size, no head counts, or fewer than 2 resident step counts: no fold step
    assert "fused_fold_step_s" not in calfit.fused_combine_fit(m)
    headless = {k: v for k, v in m.items() if k != "q_heads"}
    assert "fused_fold_step_s" not in calfit.fused_combine_fit(headless, l2)
    assert "fused_fold_step_s" not in calfit.fused_combine_fit(m, 4 * 2 ** 20)  # only b1-kv512 fits


def test_a_fused_combine_update_adds_its_two_fields_and_changes_nothing_else(tmp_path):
    import json

    from shipped_calibration import shipped_four_ranks

    from taxmodel.model.analytic.params import ModelParams, calibrated_mechanisms
    from taxmodel.hardware.specs import HardwareSpec, load_hardware

    shipped = shipped_four_ranks()
    # as the file was before its fused_combine step ran (2026-11-28)
    for key in ("fused_local_combine_step_s", "fused_local_combine_fixed_s", "fused_fold_step_s"):
        shipped.pop(key, None)
    shipped["measured"]["raw"].pop("fused_combine")
    assert "fused_combine" in calfit.parse_steps("fused_combine") and "fused_combine" not in calfit.MULTI_RANK_STEPS
    new = calfit.update_spec(shipped, {"fused_combine": _fused_rows(2.2e-6, 0.6e-6)}, ("fused_combine",),
                             device_name="NVIDIA H200", num_sms=132, world=4)
    assert new["fused_local_combine_step_s"] == pytest.approx(0.6e-6)
    assert new["fused_local_combine_fixed_s"] == pytest.approx(2.2e-6)
    fed = ("measured", "notes", "aliases", "fused_local_combine_step_s", "fused_local_combine_fixed_s",
           "fused_fold_step_s")
    for key, value in shipped.items():
        if key not in fed:  # a refit may differ in a float's last bit (summation order)
            assert new[key] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), key
    assert new["measured"]["raw"]["fused_combine"]["rows"][0]["tail_s"] > 0  # the raw rows are kept
    p = ModelParams.from_hardware(HardwareSpec.from_dict(new))
    assert p.fused_local_combine_step_s == pytest.approx(0.6e-6) and "calibrated" in p.sources["fused_local_combine_step_s"]
    assert "fused_local_combine_step_s" in calibrated_mechanisms(HardwareSpec.from_dict(new))
    # a refit from the raw rows gives the same numbers back (and a file without the rows, none)
    src = tmp_path / "cal.json"
    src.write_text(json.dumps(new))
    out = calfit.refit_file(str(src), str(tmp_path / "refit.json"))
    again = json.loads(open(out).read())
    assert again["fused_local_combine_step_s"] == pytest.approx(new["fused_local_combine_step_s"])
    assert again["fused_local_combine_fixed_s"] == pytest.approx(new["fused_local_combine_fixed_s"])
    assert load_hardware(out).source == "calibrated"
    assert "fused_local_combine_step_s" not in shipped and "fused_combine" not in shipped["measured"]["raw"]


# --- the copy kernel in push mode (copy_share's push rows) -------------------------------------------

def _copy_row(mode, items, programs, copy_s, gemm_alone_s=180e-6, gemm_shared_s=180e-6):
    row = {"items": items, "programs": programs, "item_bytes": 524288, "copy_shared_s": copy_s,
           "gemm_alone_s": gemm_alone_s, "gemm_shared_s": gemm_shared_s}
    return {**row, "mode": mode} if mode else row


def test_the_push_rows_fit_their_own_rate_and_leave_the_pull_fit_as_it_was():
    """2x H200-like rows: M=1024 one round of 16 items, M=8192 four rounds of 128 items on 32 programs;
    push at 33 / 240 us, pull at 51.5 / 273 us. The pull rate and the GEMM's loss come from the pull
    rows alone (as from a file of pull rows without a mode), the push rate from the push rows."""
    pull = [_copy_row("pull", 16, 16, 51.5e-6, 174e-6, 178.5e-6), _copy_row("pull", 128, 32, 273e-6, 1.38e-3, 1.45e-3)]
    push = [_copy_row("push", 16, 16, 33e-6, 174e-6, 200e-6), _copy_row("push", 128, 32, 240e-6, 1.38e-3, 1.6e-3)]
    fit = calfit.copy_share_fit({"rows": pull + push})
    assert fit["copy_program_push_bytes_per_s"] == pytest.approx((524288 / 33e-6 + 4 * 524288 / 240e-6) / 2)
    old = calfit.copy_share_fit({"rows": [{k: v for k, v in r.items() if k != "mode"} for r in pull]})
    assert "copy_program_push_bytes_per_s" not in old
    assert {k: fit[k] for k in old} == old  # the push rows change neither the pull rate nor the loss
    assert old["copy_program_bytes_per_s"] == pytest.approx((524288 / 51.5e-6 + 4 * 524288 / 273e-6) / 2)
    # push rows only (an update that measured push alone): the push rate, nothing else
    assert set(calfit.copy_share_fit({"rows": push})) == {"copy_program_push_bytes_per_s"}
    # rows of an unknown mode feed nothing; push rows that are not measurements feed nothing
    assert calfit.copy_share_fit({"rows": [_copy_row("scatter", 16, 16, 3e-5), _copy_row("push", 0, 16, 3e-5)]}) == {}


def test_the_fit_writes_the_push_rate_into_the_hardware_file_only_where_push_rows_were_measured():
    from taxmodel.model.analytic.params import CALIBRATED_MECHANISMS, RAW_FEEDS

    base = {"hbm": {"bytes_per_s": 3e12}, "gemm": {"bf16": {"flops_per_s": 7e14}}, "peer_copy": [{"bytes_per_s": 3e11}]}
    rows = [_copy_row(None, 24, 24, 6e-5), _copy_row("push", 24, 24, 4e-5)]
    spec = calfit.fit({**base, "copy_share": {"rows": rows}}, "NVIDIA H100 80GB HBM3", 132, 1)
    assert spec["copy_program_bytes_per_s"] == pytest.approx(524288 / 6e-5)
    assert spec["copy_program_push_bytes_per_s"] == pytest.approx(524288 / 4e-5)
    old = calfit.fit({**base, "copy_share": {"rows": rows[:1]}}, "NVIDIA H100 80GB HBM3", 132, 1)
    assert "copy_program_push_bytes_per_s" not in old
    assert "copy_program_push_bytes_per_s" in RAW_FEEDS["copy_share"] and "copy_program_push_bytes_per_s" in CALIBRATED_MECHANISMS


def test_an_rs_gemm_update_keeps_the_rows_of_the_tile_order_it_did_not_measure():
    old = {"rows": [{"m": 1024, "rs_s": 1e-4, "vendor_s": 7e-5}, {"m": 8192, "rs_s": 9e-4, "vendor_s": 7e-4}]}
    new = {"rows": [{"m": 1024, "rs_s": 9e-5, "vendor_s": 7e-5, "order": "spread"}], "peers": "four ranks"}
    merged = calfit._keep_other_orders(old, new)
    assert merged["peers"] == "four ranks"
    assert [r.get("order") for r in merged["rows"]] == [None, None, "spread"]
    # a second run of the same order replaces that order's rows, never the other's
    again = calfit._keep_other_orders(merged, {"rows": [{"m": 4096, "rs_s": 3e-4, "vendor_s": 2e-4, "order": "spread"}]})
    assert [(r.get("order"), r["m"]) for r in again["rows"]] == [(None, 1024), (None, 8192), ("spread", 4096)]
    assert calfit._keep_other_orders(None, new) is new


def test_a_hardware_file_from_before_the_tile_order_tag_reads_as_peers_first(tmp_path):
    """Its rs_gemm numbers measured the peers-first kernel: bundles of revision 6 on (spread) do
    not get them; those of revisions 1-5 do."""
    import json

    from taxmodel.hardware.specs import load_hardware
    from taxmodel.model.analytic.params import ModelParams

    spec = json.loads((Path(__file__).resolve().parents[2] / "taxmodel/data/hardware/h200-calibrated.json").read_text())
    for r in spec["measured"]["raw"]["rs_gemm"]["rows"]:
        r.pop("order", None)
    spec.pop("rs_gemm_speed_by_m_peers_first", None)
    spec.pop("rs_push_s_per_byte_by_m_peers_first", None)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(spec))
    hw = load_hardware(path)
    new = ModelParams.from_hardware(hw)
    assert new.rs_push_cost(8192) is None and new.rs_gemm_speed(8192) is None  # revision 6: not this kernel's
    old = replace(new, kernel_revision=5)
    assert old.rs_push_cost(8192) == pytest.approx(spec["rs_push_s_per_byte_by_m"][-1][1])
    assert old.rs_measured_keys() == ("rs_push_s_per_byte_by_m_peers_first", "rs_gemm_speed_by_m_peers_first")
