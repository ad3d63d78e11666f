"""validate: predictions vs bundles; the CLI on a CPU machine; the docs table stays current."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.model import fitting
from taxmodel.model import validate as val
from taxmodel.model.analytic import predict, resolve_model_hardware
from taxmodel.model.analytic.fitted import FITTED_FILE, fitted_for
from taxmodel.model.analytic.params import ModelParams
from taxmodel.model.case_store import find_cases
from taxmodel.model.cases import RECORDS_AFTER_WAIT, _records_per_cta, predict_case
from taxmodel.model.fitting import FIT_RULES, fit_params, mark_in_sample
from taxmodel.model.validation_markdown import MARK_END, MARK_START, docs_table, markdown_table, update_docs
from taxmodel.model.analytic.timeline import simulate, timeline_events
from taxmodel.trace.bundle import make_meta, write_bundle
from taxmodel.testing.synthetic import synthetic_bundle

import model_bundles
from model_bundles import AG, H200, model_bundle as _model_bundle


@pytest.fixture(autouse=True)
def h200_as_before_issue_33(monkeypatch, request):
    """These tests exercise the fitting of parameters (the Triton GEMM efficiency, the streaming
    efficiency) that the shipped H200 calibration now measures with its kernel microbenchmarks
    (issue 33), and a measured parameter is never fitted: they run with the calibrated H200 as it was
    before, without those fields (what a calibration that did not run those steps holds)."""
    from dataclasses import replace

    from taxmodel.hardware import specs as hardware
    from taxmodel.model.analytic.params import CALIBRATED_MECHANISMS

    if request.node.name == "test_docs_table_matches_the_committed_profiles":
        return  # the committed table is the shipped calibration's
    kernel_fields = set(CALIBRATED_MECHANISMS) - {"combine_step_s"}
    load = hardware.load_hardware

    def load_before(path):
        spec = load(path)
        if spec.name != H200.name:
            return spec
        return replace(spec, extra={k: v for k, v in spec.extra.items() if k not in kernel_fields})

    monkeypatch.setattr(hardware, "load_hardware", load_before)
    before = replace(H200, extra={k: v for k, v in H200.extra.items() if k not in kernel_fields})
    monkeypatch.setattr(model_bundles, "H200", before)
    monkeypatch.setitem(globals(), "H200", before)

ROOT = Path(__file__).resolve().parents[2]


def test_validate_recovers_the_models_own_timeline_exactly(tmp_path):
    _model_bundle(tmp_path / "bsp", "bsp", AG, 4)
    _model_bundle(tmp_path / "pull", "pull", AG, 2)
    v = val.validate(tmp_path, fit=False)
    assert len(v.cases) == 2 and not v.skipped
    assert set(v.table["quantity"]) == {"latency", "bsp_tax", "locality_tax", "launch_tax"}
    # without DRAM counters the measured locality is the declared-intermediate estimate: listed, not validated
    loc = v.table["quantity"] == "locality_tax"
    assert set(v.table.loc[loc, "basis"]) == {"estimated"} and not v.table.loc[loc, "validated"].any()
    assert v.table.loc[~loc, "validated"].all() and len(v.validated) == len(v.table) - int(loc.sum())
    assert v.validated["error_us"].abs().max() < 0.01
    assert v.passed


def _counted_model_bundle(path, variant, shape, world):
    """A bundle of the model's own timeline whose kernels carry the model's DRAM bytes as counters."""
    from taxmodel.model.analytic import ag_gemm
    from taxmodel.model.analytic.collective_model import CollectiveModel
    from taxmodel.model.analytic.topology import topology

    params = ModelParams.from_hardware(H200)
    coll = CollectiveModel.from_hardware(H200, topology(H200, world, params), params)
    plans, _, _ = ag_gemm.plans(variant, shape, world, H200, params, coll)
    events = timeline_events(simulate(plans, params), iterations=3, counters=True)
    meta = make_meta(source="capture", workload="ag_gemm", variant=variant, shape=shape, world_size=world,
                     ranks=list(range(world)), hardware={"name": "NVIDIA H200"},
                     clock_offsets_ns={str(r): 0 for r in range(world)}, capture={"clock_offsets_source": "measured"},
                     cost=ag_gemm.cost(shape, world, variant))
    return write_bundle(path, events, meta)


def test_locality_rows_with_counters_are_validated_and_can_fail(tmp_path):
    """With DRAM counters a locality row is a measurement: the model's own counted timeline is recovered
    exactly and counted; counters that say the GEMM read ten times as much (its traffic no longer
    hides under its compute) make it miss, and the run fails."""
    from taxmodel.trace.bundle import load_bundle

    path = _counted_model_bundle(tmp_path / "b" / "pull", "pull", {**AG, "M": 8192}, 2)
    v = val.validate(tmp_path / "b", fit=False)
    loc = v.table.set_index("quantity").loc["locality_tax"]
    assert loc["basis"] == "measured" and loc["validated"]
    assert v.table["error_us"].abs().max() < 0.01 and v.passed
    b = load_bundle(path)
    ev = b.events.copy()
    ev.loc[ev["dram_read_bytes"] > 0, "dram_read_bytes"] *= 10
    write_bundle(tmp_path / "c" / "pull", ev, b.meta)
    v2 = val.validate(tmp_path / "c", fit=False)
    loc2 = v2.table.set_index("quantity").loc["locality_tax"]
    assert loc2["validated"] and not loc2["ok"] and loc2["measured_us"] > 20.0
    assert not v2.passed
    text = markdown_table(v2)
    assert "**no**" in text and "not a validation" not in text


def test_validate_on_synthetic_bundles_compares_with_the_measured_ledger(tmp_path):
    from taxmodel.ledger.compute import compute_ledger

    case = synthetic_bundle(world_size=2, workload="ag_gemm", variant="bsp", shape=AG, skew_ns=30_000)
    write_bundle(tmp_path / "syn", case.bundle.events, case.bundle.meta)
    other = synthetic_bundle(world_size=2, workload="synthetic")
    write_bundle(tmp_path / "unmodeled", other.bundle.events, other.bundle.meta)
    v = val.validate(tmp_path, fit=False)
    assert len(v.cases) == 1 and any("no analytic model" in s for s in v.skipped)
    led = compute_ledger(case.bundle, v.cases[0].hardware, lenient=True)
    t = v.table.set_index("quantity")
    assert t.loc["latency", "measured_us"] == pytest.approx(led.windows["window_ns"].mean() / 1e3)
    skew = led.category_summary().set_index("category").loc["bsp_tax", "mean_ns"]
    assert t.loc["bsp_tax", "measured_us"] == pytest.approx(skew / 1e3)
    pred = predict("ag_gemm", "bsp", AG, 2, v.cases[0].hardware, cost=case.bundle.meta["cost"]).window_ns
    assert t.loc["latency", "predicted_us"] == pytest.approx(pred / 1e3)
    # a synthetic timeline is not an AG+GEMM: the latency target fails and says so
    assert not t.loc["latency", "ok"]
    assert "**no**" in markdown_table(v)


def test_fitting_subset_is_marked_and_reported(tmp_path):
    _model_bundle(tmp_path / "push8k", "push", {**AG, "M": 8192}, 2)
    _model_bundle(tmp_path / "push4k", "push", AG, 2)
    v = val.validate(tmp_path)
    sample = {c.shape["M"]: c.in_sample for c in v.cases}
    assert sample == {8192: True, 4096: False}
    assert set(v.table["sample"]) == {"in", "out"}
    # the fitted efficiency reproduces the default the model bundles were made with
    assert v.fitted["triton_gemm_efficiency"] == pytest.approx(ModelParams().triton_gemm_efficiency, abs=0.002)
    assert any("fitting subset" in n for n in v.notes)


def test_the_fitted_file_says_where_its_bundles_were_and_the_hardware_given(tmp_path, monkeypatch):
    """fitted.json's ``how`` names the directory validate read (it said "profiles/" whatever it
    was) and a --hardware that replaced each bundle's own; no absolute path of this machine."""
    root = tmp_path / "h200x8"
    _model_bundle(root / "push8k", "push", {**AG, "M": 8192}, 2)
    _model_bundle(root / "push4k", "push", AG, 2)
    how = val.fitted_document(val.validate(root))["how"]
    assert how.startswith("taxmodel validate on 2 bundles under h200x8/: ") and str(tmp_path) not in how
    monkeypatch.chdir(tmp_path)
    v = val.validate("h200x8", hardware="h200-calibrated")
    assert val.fitted_document(v)["how"].startswith(
        "taxmodel validate on 2 bundles under h200x8/, each measured and predicted with --hardware h200-calibrated: ")


def test_a_bundle_can_be_in_the_subsets_of_two_rules(tmp_path, monkeypatch):
    """Each rule keeps its own subset: a rule picking the smallest M and one picking the largest over
    the same bundles both fit (one rule's marks once overwrote the other's)."""
    from dataclasses import replace

    _model_bundle(tmp_path / "push8k", "push", {**AG, "M": 8192}, 2)
    _model_bundle(tmp_path / "push4k", "push", AG, 2)
    gemm = next(r for r in FIT_RULES if r.param == "triton_gemm_efficiency")
    small = replace(gemm, param="peer_store_bytes_per_s_per_sm", low=1e9, high=500e9, pick="min")
    monkeypatch.setattr(fitting, "FIT_RULES", (gemm, small))
    cases, _ = find_cases(tmp_path)
    mark_in_sample(cases)
    fits = {c.shape["M"]: c.fits for c in cases}
    assert fits == {8192: {"triton_gemm_efficiency"}, 4096: {"peer_store_bytes_per_s_per_sm"}}
    assert all(c.in_sample for c in cases)
    (fitted,) = fit_params(cases).values()  # one GPU: its fits
    assert fitted["triton_gemm_efficiency"] == pytest.approx(ModelParams().triton_gemm_efficiency, abs=0.002)


def test_stream_efficiency_is_fitted_on_the_split_kernel_not_the_skewed_window(tmp_path):
    """Rank skew stretches a profiled step but not the split-KV kernel: fitted on the kernel's own
    duration, the streaming efficiency comes back as the model made the bundle, skew or not."""
    from taxmodel.model.analytic import flash_decode
    from taxmodel.model.analytic.collective_model import CollectiveModel
    from taxmodel.model.analytic.topology import topology

    shape = {"batch": 1, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 65536}
    params = ModelParams.from_hardware(H200)
    coll = CollectiveModel.from_hardware(H200, topology(H200, 2, params), params)
    plans, _, _ = flash_decode.plans("bsp", shape, 2, H200, params, coll)
    events = timeline_events(simulate(plans, params), iterations=3)
    late = (events["rank"] == 1) & (events["kind"] == "kernel")
    events.loc[late, ["start_ns", "end_ns"]] += 200_000  # rank 1 starts every step 200 us late
    meta = make_meta(source="capture", workload="flash_decode", variant="bsp", shape=shape, world_size=2,
                     ranks=[0, 1], hardware={"name": "NVIDIA H200"}, clock_offsets_ns={"0": 0, "1": 0},
                     capture={"clock_offsets_source": "measured"}, cost=flash_decode.cost(shape, 2, "bsp"))
    write_bundle(tmp_path / "fd", events, meta)
    v = val.validate(tmp_path)
    (case,) = v.cases
    assert case.in_sample and case.measured["kernel:flash_decode_split_kv"] > 0
    assert case.measured["latency"] > 150_000  # the skew is in the window
    assert v.fitted["triton_stream_efficiency"] == pytest.approx(ModelParams().triton_stream_efficiency, abs=0.005)


def test_fitted_from_a_file_predicts_every_bundle_out_of_sample(tmp_path):
    """--fitted-from: nothing is fitted; the file's values apply to the hardware it names, so bundles
    captured after the fit (a new world size) are predicted as a user of `predict` would get them."""
    from taxmodel.errors import InputError

    made = ModelParams.from_hardware(H200).with_fitted({"triton_gemm_efficiency": 0.6})
    _model_bundle(tmp_path / "b" / "push8k", "push", {**AG, "M": 8192}, 2, params=made)
    hw_name = find_cases(tmp_path / "b")[0][0].hardware.name
    good, other = tmp_path / "good.json", tmp_path / "other.json"
    good.write_text(json.dumps({"fitted": {"triton_gemm_efficiency": 0.6}, "hardware": [hw_name], "how": "t"}))
    other.write_text(json.dumps({"fitted": {"triton_gemm_efficiency": 0.6}, "hardware": ["MI300X"], "how": "t"}))
    v = val.validate(tmp_path / "b", fitted_from=good)
    assert set(v.table["sample"]) == {"out"} and v.fitted == {"triton_gemm_efficiency": 0.6}
    assert v.validated["error_us"].abs().max() < 0.01 and "out of sample" in v.notes[0]
    # values fitted on another GPU are borrowed where this GPU's calibration measured nothing in
    # their place, and every prediction says from which GPU (issue 33)
    v_other = val.validate(tmp_path / "b", fitted_from=other)
    assert abs(v_other.table.set_index("quantity").loc["latency", "error_us"]) < 0.01
    assert any("borrowed from MI300X" in n for n in v_other.notes)
    case = v_other.cases[0]
    pred = predict_case(case, {"triton_gemm_efficiency": 0.6}, "MI300X")
    lines = [a for a in pred.assumptions if a.startswith("borrowed from another GPU")]
    assert lines == ["borrowed from another GPU (fitted there, not measured on this one): triton_gemm_efficiency "
                     "from MI300X; `taxmodel calibrate` on this GPU measures them"]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(InputError, match="not a fitted-parameters file"):
        val.validate(tmp_path / "b", fitted_from=bad)
    r = CliRunner().invoke(cli, ["validate", str(tmp_path / "b"), "--fitted-from", str(good)])
    assert r.exit_code == 0 and "out-of-sample" in r.output and "in-sample" not in r.output, r.output
    r = CliRunner().invoke(cli, ["validate", str(tmp_path / "b"), "--fitted-from", str(good), "--update-docs"])
    assert r.exit_code == 2 and "fits nothing" in r.output


def test_update_docs_round_trip(tmp_path):
    _model_bundle(tmp_path / "b" / "bsp", "bsp", AG, 2)
    doc = tmp_path / "model.md"
    doc.write_text(f"# x\n{MARK_START}\nold\n{MARK_END}\ntail\n")
    v = val.validate(tmp_path / "b", fit=False)
    update_docs(doc, v)
    assert docs_table(doc) == markdown_table(v)
    assert doc.read_text().endswith("tail\n")


def test_docs_table_matches_the_committed_profiles():
    profiles = ROOT / "profiles"
    from taxmodel.trace.bundle import find_bundles

    if not profiles.exists() or not find_bundles(profiles):
        pytest.skip("no measured bundles committed under profiles/ yet")
    v = val.validate(profiles, jobs=None)  # as `taxmodel validate` runs: one process per CPU
    assert docs_table(ROOT / "benchmarks" / "results" / "model_validation.md") == markdown_table(v), \
        "benchmarks/results/model_validation.md is stale: run `taxmodel validate profiles --update-docs`"
    assert json.loads(FITTED_FILE.read_text()) == json.loads(json.dumps(val.fitted_document(v))), \
        "taxmodel/data/fitted.json is stale: run `taxmodel validate profiles --update-docs`"


def test_predict_uses_a_gpus_own_fits_and_borrows_another_gpus_with_a_caveat(tmp_path):
    """A GPU's own fits apply as fitted; on a GPU without fits, another GPU's fits stand in for what
    its calibration did not measure, and the prediction says in one line that they were borrowed
    and from which GPU (issue 33)."""
    doc = {"fitted": {"triton_stream_efficiency": 1.2, "ll_merge_step_s": 2e-6}, "hardware": ["H200 SXM (calibrated)"],
           "how": "test"}
    f = tmp_path / "fitted.json"
    f.write_text(json.dumps(doc))
    values, note = fitted_for("H200 SXM (calibrated)", f)
    assert values == {"triton_stream_efficiency": 1.2, "ll_merge_step_s": 2e-6} and "fitted" in note
    assert fitted_for("H100 SXM", f) == (values, None)  # borrowed: named by the prediction, not as own fits
    assert fitted_for("x", tmp_path / "none.json") == ({}, None)
    p = ModelParams().with_fitted(values)
    assert p.triton_stream_efficiency == 1.2 and p.sources["ll_merge_step_s"].startswith("fitted")
    # the CLI: on by default for the hardware of the committed fits, off with --no-fitted or elsewhere
    shipped, _ = fitted_for("H200 SXM (calibrated)")
    assert shipped, "the committed fits name the calibrated H200"
    args = ["predict", "flash_decode", "--variant", "fused", "-n", "8", "--preset", "b1-kv16k"]
    on = CliRunner().invoke(cli, args + ["--hardware", "h200-calibrated"])
    off = CliRunner().invoke(cli, args + ["--hardware", "h200-calibrated", "--no-fitted"])
    other = CliRunner().invoke(cli, args + ["--hardware", "h100"])
    assert on.exit_code == off.exit_code == other.exit_code == 0, on.output + off.output + other.output
    assert "fitted on the measured bundles" in on.output
    assert "fitted on the measured bundles" not in off.output and "fitted on the measured bundles" not in other.output
    assert "borrowed from another GPU" in other.output and "from H200 SXM (calibrated)" in other.output
    assert "borrowed" not in on.output and "borrowed" not in off.output
    assert f"{shipped['ll_merge_step_s'] * 1e6:.2f} us (LL: one per source rank)" in on.output
    assert f"{ModelParams().ll_merge_step_s * 1e6:.2f} us (LL: one per source rank)" in off.output


# --- the CLI on a CPU machine ---------------------------------------------------------------------

def test_cli_predict_with_presets():
    r = CliRunner().invoke(cli, ["predict", "ag_gemm", "--variant", "bsp,pull", "-n", "8", "--hardware", "h200-calibrated",
                                 "--shape", "M=8192,N=8192,K=8192"])
    assert r.exit_code == 0, r.output
    assert "ag_gemm/bsp" in r.output and "ag_gemm/pull" in r.output and "Assumptions:" in r.output
    # the hardware chosen, said once, and the topology the prediction assumed
    assert r.output.count("hardware: h200-calibrated: H200 SXM (calibrated), as named") == 1
    assert "topology: 8 GPU(s)" in r.output


def test_cli_predict_json_and_sweep(tmp_path):
    r = CliRunner().invoke(cli, ["predict", "flash_decode", "--variant", "fused", "-n", "4", "--hardware", "mi300x",
                                 "--preset", "b1-kv16k", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc[0]["variant"] == "fused" and doc[0]["hardware"]["name"] == "MI300X"
    assert sum(row["mean_ns"] for row in doc[0]["summary"]) == pytest.approx(doc[0]["predicted_window_ns"])
    png = tmp_path / "sweep.png"
    r = CliRunner().invoke(cli, ["predict", "ag_gemm", "--variant", "bsp", "-n", "4", "--sweep", "M=1024:4096",
                                 "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert "1024" in r.output and "4096" in r.output and png.stat().st_size > 1000


def test_cli_predict_names_the_hardware_and_its_source_once():
    r = CliRunner().invoke(cli, ["predict", "flash_decode", "--variant", "bsp", "-n", "2", "--hardware", "h200-calibrated",
                                 "--preset", "b1-kv1k"])
    assert r.exit_code == 0, r.output
    head = r.output.splitlines()[0]
    assert head.endswith("on H200 SXM (calibrated)"), head
    r = CliRunner().invoke(cli, ["predict", "flash_decode", "--variant", "bsp", "-n", "2", "--hardware", "h100",
                                 "--preset", "b1-kv1k"])
    assert r.output.splitlines()[0].endswith("on H100 SXM (datasheet)")


def test_cli_predict_out_of_scope_is_a_clear_error():
    r = CliRunner().invoke(cli, ["predict", "ag_gemm", "--variant", "pull", "-n", "16", "--hardware", "mi300x"])
    assert r.exit_code == 2 and "out of the model's scope" in r.output


def test_cli_validate_and_calibrate_without_gpu(tmp_path, monkeypatch):
    _model_bundle(tmp_path / "p" / "bsp", "bsp", AG, 2)
    md = tmp_path / "v.md"
    r = CliRunner().invoke(cli, ["validate", str(tmp_path / "p"), "--markdown", str(md), "--no-fit"])
    assert r.exit_code == 0, r.output
    assert "ag_gemm/bsp" in md.read_text()
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = CliRunner().invoke(cli, ["calibrate", "-o", str(tmp_path / "hw.json")])
    assert r.exit_code == 2 and "datasheet presets" in r.output


def test_a_step_time_is_fitted_as_well_as_a_rate_and_on_records(tmp_path):
    """ll_merge_step_s lengthens the time it explains, an efficiency shortens it: the bisection
    handles both. A device-gated, instrumented flash decode fused bundle made by the model with a
    merge step of 1.7 us, whose merging CTAs recorded the model's own wait and merge, gives back
    1.7 us from those records; the same bundle without records, or host-aligned, fits nothing."""
    import pandas as pd

    from taxmodel.trace.bundle import load_bundle

    hw = resolve_model_hardware(None, {"hardware": {"name": "NVIDIA H200"}})[0]
    shape = {"batch": 1, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 1024}
    params = ModelParams.from_hardware(hw, ll_merge_step_s=1.7e-6)
    det = predict("flash_decode", "fused", shape, 4, hw, params).details
    assert det["wait_merge"] == pytest.approx(det["flag"] + 3 * 1.7e-6)

    def bundle(root: Path, align: str, records: bool) -> None:
        path = _model_bundle(root / "fused", "fused", shape, 4, workload="flash_decode", params=params)
        b = load_bundle(path)
        ev, meta = b.events, dict(b.meta)
        if records:
            k = ev[ev["kind"] == "kernel"]
            wait = k.assign(kind="record", cta=64, phase="flag_wait", start_ns=k["start_ns"] + 1000,
                            end_ns=k["start_ns"] + 1000 + round(det["flag"] * 1e9))
            merge = wait.assign(phase="combine", start_ns=wait["end_ns"],
                                end_ns=wait["end_ns"] + round(det["combine"] * 1e9))
            ev = pd.concat([ev, wait, merge], ignore_index=True)
        meta["capture"] = {**meta["capture"], "align": align, "instrument": records}
        write_bundle(path, ev, meta)

    bundle(tmp_path / "gated", "device", True)
    v = val.validate(tmp_path / "gated")
    assert v.fitted["ll_merge_step_s"] == pytest.approx(1.7e-6, rel=2e-3)
    assert v.cases[0].in_sample and v.cases[0].measured[RECORDS_AFTER_WAIT] == pytest.approx(
        det["wait_merge"] * 1e9, abs=2)
    for name, align, records in (("host", "host", True), ("plain", "device", False)):
        bundle(tmp_path / name, align, records)
        v = val.validate(tmp_path / name)
        assert "ll_merge_step_s" not in v.fitted and not v.cases[0].in_sample, name


def test_records_per_cta_gives_the_mean_and_the_longest_cta_of_each_phase():
    import pandas as pd

    rows = [  # (rank, iteration, cta, phase, start, end): two launches of one kernel on rank 0
        (0, 0, 0, "store_push", 0, 10), (0, 0, 0, "store_push", 20, 25), (0, 0, 1, "store_push", 0, 30),
        (0, 1, 0, "store_push", 0, 40), (0, 1, 1, "store_push", 0, 20), (0, 1, 1, "combine", 40, 44),
        (0, -1, 0, "store_push", 0, 1000),  # warm-up: not profiled
    ]
    ev = pd.DataFrame(rows, columns=["rank", "iteration", "cta", "phase", "start_ns", "end_ns"]).assign(
        kind="record", name="k", repetition=0)
    got = _records_per_cta(ev)
    assert got["records:k:store_push"] == pytest.approx((15 + 30 + 40 + 20) / 4)
    assert got["records:k:store_push:max"] == pytest.approx((30 + 40) / 2)
    assert got["records:k:combine"] == got["records:k:combine:max"] == 4


def test_a_bundle_the_model_cannot_predict_is_skipped_with_its_reason(tmp_path):
    """A one-rank capture of a variant that needs peers (ag_gemm/torch_fused) is skipped with the model's
    own reason; the other bundles of the directory are still validated."""
    _model_bundle(tmp_path / "bsp", "bsp", AG, 2)
    one = _model_bundle(tmp_path / "torch_fused", "bsp", AG, 1)
    meta = json.loads((one / "meta.json").read_text())
    meta["variant"] = "torch_fused"
    (one / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(Exception, match="more than one rank"):
        predict("ag_gemm", "torch_fused", AG, 1, H200)
    v = val.validate(tmp_path, fit=False)
    assert [c.variant for c in v.cases] == ["bsp"]
    assert len(v.skipped) == 1 and "torch_fused" in v.skipped[0] and "more than one rank" in v.skipped[0]


def test_cli_predict_names_a_part_once_when_its_category_has_one():
    r = CliRunner().invoke(cli, ["predict", "ag_gemm", "--variant", "push", "-n", "8", "--hardware", "h200",
                                 "--preset", "m8192"])
    assert r.exit_code == 0, r.output
    rows = [line.split() for line in r.output.splitlines() if line.startswith("  ") and line.rstrip().endswith("%")]
    assert [row[0] for row in rows][:3] == ["useful", "compute_inefficiency", "locality_tax"]
    assert all(row[0] != row[1] for row in rows), r.output  # "useful useful" was printed
    assert any(row[:2] == ["bsp_tax", "skew_wait"] for row in rows)


def test_the_tally_says_how_much_of_it_is_in_sample_or_zero_against_zero():
    """The headline tally counts in-sample rows (a parameter was fitted on their bundle to match
    one of its quantities) and 0-vs-0 rows (a tax neither side has); the line after it says how
    many, and the out-of-sample tally alone."""
    import pandas as pd

    from taxmodel.model.validation_markdown import _tally_parts

    rows = [("in", 100.0, 100.0, True), ("out", 100.0, 130.0, False), ("out", 0.0, 0.0, True), ("out", 50.0, 52.0, True)]
    t = pd.DataFrame([{"sample": s, "measured_us": m, "predicted_us": p, "ok": ok} for s, m, p, ok in rows])
    assert _tally_parts(t) == ("Out of sample (no parameter fitted on their bundle): 2 of 3; the other 1 rows above are "
                               "of bundles a parameter was fitted on. 1 of the 4 compare a measured 0 with a predicted 0 "
                               "(a tax neither side has).")


def test_update_docs_refuses_an_empty_validation_and_a_document_without_markers(tmp_path, monkeypatch):
    """`validate EMPTY_DIR --update-docs` rewrote the committed table with no rows and fitted.json
    with no fits; a document without the markers was found out only after the whole validation."""
    from taxmodel.model.analytic import fitted as fitted_mod

    fitted = tmp_path / "fitted.json"
    fitted.write_text('{"fitted": {"x": 1}}\n')
    monkeypatch.setattr(fitted_mod, "FITTED_FILE", fitted)  # never the shipped file, whatever happens
    doc = tmp_path / "model.md"
    doc.write_text(f"# x\n{MARK_START}\nold\n{MARK_END}\n")
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(cli, ["validate", str(tmp_path / "empty"), "--update-docs", "--docs", str(doc), "--no-cache"])
    assert r.exit_code == 2 and "no bundle under" in r.output and "was rewritten" in r.output, r.output
    assert "old" in doc.read_text() and fitted.read_text() == '{"fitted": {"x": 1}}\n'
    bare = tmp_path / "bare.md"
    bare.write_text("# no markers\n")
    _model_bundle(tmp_path / "b" / "bsp", "bsp", AG, 2)
    r = CliRunner().invoke(cli, ["validate", str(tmp_path / "b"), "--update-docs", "--docs", str(bare), "--no-cache"])
    assert r.exit_code == 2 and "no validation markers" in r.output and "ag_gemm/bsp" not in r.output, r.output
