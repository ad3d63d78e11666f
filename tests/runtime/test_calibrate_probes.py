"""`taxmodel calibrate`'s one-GPU probes without a GPU: the flash decode combine step
(``calibrate_combine``) and the wait on a set flag (``calibrate_sync``): what the fit makes of
their rows, what an update with them changes, and the flag probe's kernel under Triton's
interpreter (the timing itself needs a GPU)."""
from __future__ import annotations

import pytest
import torch

from taxmodel.model import calibration as calfit

from shipped_calibration import shipped_four_ranks

# --- the flash decode combine step -----------------------------------------------------------------


def _combine_rows(steps_and_us: list[tuple[int, float]]) -> dict:
    return {"rows": [{"batch": 1, "kv_len": 1024 * (i + 1), "splits": 4 * s, "rows": 8, "steps": s, "kernels": 20,
                      "split_s": 3e-6, "combine_s": us * 1e-6} for i, (s, us) in enumerate(steps_and_us)]}


def test_the_combine_step_is_the_median_over_the_grid_of_the_kernel_less_its_fixed_overhead_per_step():

    # (kernel - 2 us) / steps: 0.5, 0.9, 1.0 -> median 0.9 us
    meas = _combine_rows([(4, 4.0), (20, 20.0), (25, 27.0)])
    assert calfit.combine_step_seconds(meas, 2e-6) == pytest.approx(0.9e-6)
    assert calfit.combine_step_seconds({"rows": []}, 2e-6) is None and calfit.combine_step_seconds(None, 2e-6) is None
    # a kernel shorter than the fixed overhead counts as no step time, never as a negative one
    assert calfit.combine_step_seconds(_combine_rows([(1, 1.5)]), 2e-6) == 0.0


def test_a_combine_update_sets_the_models_step_and_changes_nothing_else():
    from taxmodel.model.analytic.params import ModelParams
    from taxmodel.hardware.specs import HardwareSpec

    shipped = shipped_four_ranks()
    assert "combine" in calfit.parse_steps("combine") and "combine" not in calfit.MULTI_RANK_STEPS
    new = calfit.update_spec(shipped, {"combine": _combine_rows([(4, 4.0), (20, 20.0), (25, 27.0)])}, ("combine",),
                          device_name="NVIDIA H200", num_sms=132, world=1)
    assert new["combine_step_s"] == pytest.approx(0.9e-6)
    # the combine step's rows feed the split-KV kernel's line too (issue 33); these rows have no
    # heads, so they give none, and the model falls back for it
    fed = ("measured", "combine_step_s", "notes", "aliases", "triton_stream_efficiency", "split_kv_fixed_s",
           "split_kv_resident_bytes_per_s", "split_kv_resident_fixed_s")
    for key, value in shipped.items():
        if key not in fed:
            assert new[key] == value, key
    assert "triton_stream_efficiency" not in new and "split_kv_resident_bytes_per_s" not in new
    p = ModelParams.from_hardware(HardwareSpec.from_dict(new))
    assert p.combine_step_s == pytest.approx(0.9e-6) and "calibrated" in p.sources["combine_step_s"]


# --- the wait on a set flag ------------------------------------------------------------------------


def test_a_sync_update_gives_the_model_both_flag_waits():
    from taxmodel.model.analytic.params import ModelParams
    from taxmodel.hardware.specs import HardwareSpec

    shipped = shipped_four_ranks()
    assert "sync" in calfit.parse_steps("sync") and "sync" not in calfit.MULTI_RANK_STEPS
    sync = {"waits": [16, 1040], "flag_wait_sys_s": 4.3e-7, "flag_wait_gpu_s": 4.4e-7}
    new = calfit.update_spec(shipped, {"sync": sync}, ("sync",), device_name="NVIDIA H200", num_sms=132, world=1)
    assert new["flag_wait_s"] == 4.3e-7 and new["flag_wait_gpu_s"] == 4.4e-7
    p = ModelParams.from_hardware(HardwareSpec.from_dict(new))
    assert (p.flag_wait_s, p.flag_wait_gpu_s) == (4.3e-7, 4.4e-7)
    raw = {k: v for k, v in shipped["measured"]["raw"].items() if k != "sync"}
    assert "flag_wait_s" not in calfit.fit(raw, "NVIDIA H200", 132, 4)  # not measured: no field (the model's default)


@pytest.mark.parametrize("gpu_scope", [False, True])
def test_the_flag_probe_waits_on_each_flag_and_a_missing_one_gives_up(gpu_scope):
    from taxmodel.kernels.device import sync

    from taxmodel.runtime import calibrate_sync

    flags = torch.ones(8, dtype=torch.int64)
    err = sync.new_error_buffer("cpu")
    out = torch.zeros(1, dtype=torch.int32)
    calibrate_sync._wait_set_flags_kernel[(1,)](flags, err, out, 5, 1000, GPU_SCOPE=gpu_scope, MODE=0)
    assert int(out) == 5 and int(err[0]) == 0
    flags[3] = 0
    calibrate_sync._wait_set_flags_kernel[(1,)](flags, err, out, 5, 1000, GPU_SCOPE=gpu_scope, MODE=0)
    assert int(out) == 4 and int(err[0]) == 1 and int(err[3]) == 3  # gave up on flag 3 and said which


# --- the launch step's gap between the kernels of a replayed graph ---------------------------------


def _replays(gaps_ns: list[int], replays: int = 2, kernel_ns: int = 1000, between_ns: int = 5000) -> "pd.DataFrame":
    """Trace events of ``replays`` replays of one graph (kernels ``gaps_ns`` apart; each replay's
    kernels carry its graph launch's correlation), an eager kernel between them, in shuffled order,
    on an epoch clock in ns (beyond float64's exact integers, as some traces' timestamps are)."""
    import pandas as pd

    rows, t = [], 1_700_000_000_000_000_000
    for rep in range(replays):
        corr = 10 * (rep + 1)
        rows.append({"kind": "launch", "name": "cudaGraphLaunch", "correlation": corr, "graph_id": -1,
                     "start_ns": t, "end_ns": t + 500})
        for gap in [0, *gaps_ns]:
            t += gap
            rows.append({"kind": "kernel", "name": "fill", "correlation": corr, "graph_id": corr,
                         "start_ns": t, "end_ns": t + kernel_ns})
            t += kernel_ns
        t += 100
        rows.append({"kind": "kernel", "name": "eager", "correlation": corr + 1, "graph_id": -1,
                     "start_ns": t, "end_ns": t + kernel_ns})
        t += kernel_ns + between_ns
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)


def test_the_graph_gap_is_the_median_inside_one_replay_without_the_gaps_between_replays():
    from taxmodel.runtime import calibrate as cal

    got = cal.graph_kernel_gap(_replays([300, 400, 300], replays=3))
    assert got == {"graph_kernel_gap_s": pytest.approx(300e-9, rel=1e-9), "graph_pairs": 9, "graph_replays": 3}
    assert cal.graph_kernel_gap(_replays([], replays=2))["graph_kernel_gap_s"] is None  # one kernel a replay


def test_consecutive_gaps_follow_start_order_within_each_group():
    from taxmodel.runtime import calibrate as cal

    k = _replays([300, 400])
    k = k[k["kind"] == "kernel"]
    flat = cal.consecutive_gaps_s(k)
    assert flat.isna().sum() == 1 and flat.dropna().min() == pytest.approx(100e-9, rel=1e-9)  # the eager kernel's
    grouped = cal.consecutive_gaps_s(k[k["graph_id"] >= 0], by="correlation").dropna()
    assert sorted(grouped * 1e9) == pytest.approx([300, 300, 400, 400], rel=1e-9)


def test_a_launch_update_adds_the_graph_gap_and_changes_nothing_else():
    from taxmodel.hardware.specs import HardwareSpec

    shipped = shipped_four_ranks()
    # as the file was before its launch step measured the graph gap (2026-11-28)
    shipped.pop("graph_kernel_gap_s")
    old_launch = {k: v for k, v in shipped["measured"]["raw"]["launch"].items()
                  if k not in ("graph_kernel_gap_s", "graph_pairs", "graph_replays")}
    shipped["measured"]["raw"]["launch"] = old_launch
    assert "graph_kernel_gap_s" not in calfit.update_spec(shipped, {}, (), device_name="NVIDIA H200", num_sms=132,
                                                             world=4)
    launch = {**old_launch, "graph_kernel_gap_s": 3e-7}
    new = calfit.update_spec(shipped, {"launch": launch}, ("launch",), device_name="NVIDIA H200", num_sms=132, world=4)
    assert new["graph_kernel_gap_s"] == 3e-7 and HardwareSpec.from_dict(new).graph_kernel_gap_s == 3e-7
    # a refit from the same raw rows may differ in the last bit of a float (summation order)
    def same(a, b) -> bool:
        return a == pytest.approx(b, rel=1e-12) if isinstance(b, float) else a == b

    assert {k for k in shipped if not same(new.get(k), shipped[k])} <= {"measured", "notes"}


def test_a_failing_profiler_probe_is_one_line_and_the_others_stay():
    from taxmodel.runtime import calibrate as cal

    def broken() -> dict:
        raise RuntimeError("CUPTI busy")

    out = {"graph_per_kernel_s": 1e-6}
    out.update(cal._optional(broken, "graph_profiler_error"))
    out.update(cal._optional(lambda: {"kernel_gap_s": 1e-6}, "profiler_error"))
    assert out == {"graph_per_kernel_s": 1e-6, "graph_profiler_error": "RuntimeError: CUPTI busy", "kernel_gap_s": 1e-6}


# --- one rank's steps and its file, without a GPU ---------------------------------------------------


def test_one_gpu_rank_runs_its_steps_in_order_and_writes_a_file_that_loads(tmp_path, monkeypatch):
    """``_measure`` and ``_write`` of a one-GPU calibration (the rank's code that only a GPU runs),
    with each measurement replaced by a recorded stand-in: every asked step runs once, in run
    order, a failing step is recorded and the others go on, and rank 0 writes a file that loads."""
    import json
    import sys
    import types

    import taxmodel.runtime
    from taxmodel.hardware.specs import load_hardware
    from taxmodel.runtime import calibrate as cal

    ran: list[str] = []

    def stand_in(name, value):
        def fn(*_a, **_k):
            ran.append(name)
            if isinstance(value, Exception):
                raise value
            return value
        return fn

    monkeypatch.setattr(cal, "hbm_bandwidth", stand_in("hbm", {"bytes": 1, "ms": 1.0, "bytes_per_s": 3e12}))
    monkeypatch.setattr(cal, "gemm_rate", stand_in("gemm", {"flops_per_s": 7e14}))
    monkeypatch.setattr(cal, "launch_costs", stand_in("launch", {"launch_latency_s": 2e-6, "kernel_gap_s": 1e-6}))
    monkeypatch.setattr(cal, "peer_copy_bandwidth", stand_in("p2p", []))
    for mod, fn, value in (("calibrate_combine", "measure", RuntimeError("no GPU")),
                           ("calibrate_sync", "measure", {"flag_wait_sys_s": 4e-7, "flag_wait_gpu_s": 4e-7}),
                           ("calibrate_gemm", "measure_tile_gemm",
                            {"rows": [{"m": 1024, "tile_s": 2e-4, "vendor_s": 1.9e-4}]})):
        fake = types.SimpleNamespace(**{fn: stand_in(mod, value)})
        monkeypatch.setitem(sys.modules, f"taxmodel.runtime.{mod}", fake)
        monkeypatch.setattr(taxmodel.runtime, mod, fake, raising=False)  # `from taxmodel.runtime import mod`
    steps = calfit.parse_steps("hbm,gemm,launch,p2p,combine,sync,tile_gemm")
    meas = cal._measure(steps, torch.device("cpu"), 0, 1, False, (8192,), None)
    assert ran == ["hbm", "gemm", "gemm", "gemm", "launch", "p2p", "calibrate_combine", "calibrate_sync",
                   "calibrate_gemm"]  # gemm: bf16, fp16, fp32
    assert meas["errors"] == {"combine": "RuntimeError: no GPU"} and meas["collectives"] == []
    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", multi_processor_count=132)
    out = tmp_path / "hw.json"
    cal._write(str(out), steps, meas, None, props=props, world=1, seconds=1.0)
    spec = json.loads(out.read_text())
    assert spec["measured"]["device"] == props.name and spec["triton_gemm_speed_by_m"] == [[1024.0, 0.95]]
    assert load_hardware(out).source == "calibrated"
