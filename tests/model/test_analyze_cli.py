"""`taxmodel analyze`: tables, JSON, comparison, exit codes."""
from __future__ import annotations

import json

from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.trace.bundle import write_bundle
from taxmodel.testing.synthetic import synthetic_bundle


def make(tmp_path, name, **kw):
    case = synthetic_bundle(**kw)
    return str(write_bundle(tmp_path / name, case.bundle.events, case.bundle.meta)), case


def test_analyze_table_and_comparison(tmp_path):
    bsp, case = make(tmp_path, "bsp", skew_ns=6000)
    fused, _ = make(tmp_path, "fused", variant="fused", flag_wait_ns=2000)
    res = CliRunner().invoke(cli, ["analyze", bsp, fused, "--per-rank"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "Skew wait" in out and "Flag wait" in out and "iteration window" in out
    assert "variants side by side" in out and "fused − bsp (us)" in out
    assert "fused saves" in out
    assert "datasheet" in out  # the hardware caveat
    assert "per rank" in out


def test_analyze_json(tmp_path):
    bsp, case = make(tmp_path, "bsp", skew_ns=6000)
    res = CliRunner().invoke(cli, ["analyze", bsp, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    led = doc["ledgers"][0]
    skew = {r["subcategory"]: r["mean_ns"] for r in led["summary"]}["skew_wait"]
    assert skew == case.expected_ns("skew_wait") / (3 * 2)
    assert led["hardware"] == {"name": "H200 SXM", "source": "datasheet"}


def test_analyze_bad_input_exit_2_and_lenient(tmp_path):
    case = synthetic_bundle(world_size=2)
    ev = case.bundle.events
    ev = ev[~((ev["rank"] == 1) & (ev["iteration"] == 2))]
    path = str(write_bundle(tmp_path / "cut", ev, case.bundle.meta))
    res = CliRunner().invoke(cli, ["analyze", path])
    assert res.exit_code == 2
    assert "iteration 2" in res.output and "--lenient" in res.output
    res = CliRunner().invoke(cli, ["analyze", path, "--lenient"])
    assert res.exit_code == 0 and "skipped:" in res.output


def test_analyze_hardware_file(tmp_path):
    from taxmodel.hardware.specs import find_preset, save_hardware
    import dataclasses

    spec = dataclasses.replace(find_preset("H200"), name="my H200", source="calibrated", aliases=())
    hw = save_hardware(spec, tmp_path / "hw.json")
    bsp, _ = make(tmp_path, "bsp")
    res = CliRunner().invoke(cli, ["analyze", bsp, "--hardware", str(hw), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["ledgers"][0]["hardware"] == {"name": "my H200", "source": "calibrated"}


def test_analyze_says_how_locality_was_obtained(tmp_path):
    """Per bundle, measured (DRAM counters), estimated (declared intermediates) or not measured
    (issue 24: the ledger says which)."""
    from pathlib import Path

    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.report.terminal import render_ledger
    from taxmodel.trace.bundle import load_bundle

    case = synthetic_bundle(world_size=2)
    assert "locality: estimated (declared intermediates)" in render_ledger(compute_ledger(case.bundle))
    counted = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200x1-counters" / "gemm_rs" / "bsp-M1024xN8192xK8192"
    if counted.exists():
        assert "locality: measured (DRAM counters)" in render_ledger(compute_ledger(load_bundle(counted)))
