"""`taxmodel report` and `taxmodel export-trace` end to end, on bundles written to disk."""
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import real_ledger_available
from taxmodel.cli import cli
from taxmodel.report import headline
from taxmodel.report.build import load_cases
from taxmodel.trace.bundle import write_bundle

pytestmark = pytest.mark.skipif(not real_ledger_available(), reason="taxmodel.ledger.compute is not written yet")


@pytest.fixture(scope="module")
def bundle_dir(real_cases, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for i, (bundle, led) in enumerate(real_cases):
        write_bundle(root / "ag_gemm" / f"{led.label.replace('/', '_')}", bundle.events, bundle.meta)
    return root


def test_report_html_from_a_directory_of_bundles(bundle_dir, real_cases, tmp_path):
    out = tmp_path / "report.html"
    res = CliRunner().invoke(cli, ["report", str(bundle_dir), "-o", str(out)])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    # compare with the ledgers of the bundles as loaded (their meta as stored)
    assert lines[:-1] == headline.headlines([led for _, led in load_cases([bundle_dir])])
    assert len(lines) == 3
    assert lines[-1] == f"wrote {out}"
    html = out.read_text()
    assert html.count('src="data:image/png;base64,') == 7  # 6 ledger views and what fusing would buy


def test_report_markdown(bundle_dir, tmp_path):
    out = tmp_path / "md" / "report.md"
    res = CliRunner().invoke(cli, ["report", str(bundle_dir / "ag_gemm"), "-o", str(out), "--format", "md"])
    assert res.exit_code == 0, res.output
    assert not list(out.parent.glob("*.png")), "figures loose beside the report"
    pngs = sorted(p.name for p in (out.parent / "report-figures").glob("*.png"))
    assert len(pngs) == 7
    assert all(f"](report-figures/{p})" in out.read_text() for p in pngs)
    # every file written is named: the report, and the folder of its figures with their count
    assert res.output.splitlines()[-2:] == [f"wrote {out}", f"wrote 7 figure(s) it links to, in {out.parent / 'report-figures'}/"]


def test_report_on_a_directory_without_bundles_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "empty"), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 2
    assert "no bundles found below this directory" in res.output


def test_export_trace(bundle_dir, tmp_path):
    bundle = sorted((bundle_dir / "ag_gemm").iterdir())[0]
    out = tmp_path / "trace.json"
    res = CliRunner().invoke(cli, ["export-trace", str(bundle), "-o", str(out)])
    assert res.exit_code == 0, res.output
    trace = json.loads(out.read_text())
    assert any(e.get("cat", "").startswith("ledger,") for e in trace["traceEvents"])


def test_export_trace_writes_one_trace_per_bundle_into_a_directory(bundle_dir, tmp_path):
    """Several bundles (a shell glob, a directory) and one trace file: refused in one line saying
    what to give instead, nothing written; a directory gets one trace per bundle, each named."""
    bundles = sorted((bundle_dir / "ag_gemm").iterdir())
    assert len(bundles) > 1
    res = CliRunner().invoke(cli, ["export-trace", *map(str, bundles), "-o", str(tmp_path / "t.json")])
    assert res.exit_code == 2 and not (tmp_path / "t.json").exists()
    assert f"-o {tmp_path / 't.json'} names one trace file, but {len(bundles)} bundles were given" in res.output
    assert "give -o a directory" in res.output
    res = CliRunner().invoke(cli, ["export-trace", str(bundle_dir), "-o", str(tmp_path / "traces")])
    assert res.exit_code == 0, res.output
    written = [tmp_path / "traces" / f"{b.name}.json" for b in bundles]
    assert res.output.splitlines() == [f"wrote {w}" for w in written]
    for w in written:
        assert any(e.get("cat", "").startswith("ledger,") for e in json.loads(w.read_text())["traceEvents"])
    # the README's `-o traces/` with the one bundle a glob matched: a directory all the same
    res = CliRunner().invoke(cli, ["export-trace", str(bundles[0]), "-o", f"{tmp_path / 'one'}/"])
    assert res.exit_code == 0 and res.output == f"wrote {tmp_path / 'one' / bundles[0].name}.json\n", res.output


def test_commands_that_take_bundles_take_several_and_say_how_to_import_a_trace(bundle_dir, tmp_path):
    bundles = sorted((bundle_dir / "ag_gemm").iterdir())
    res = CliRunner().invoke(cli, ["show", *map(str, bundles[:2])])
    assert res.exit_code == 0, res.output
    assert res.output.count("GPU time by rank and role") == 2
    trace = tmp_path / "rank0.json.gz"
    shutil.copy(Path(__file__).parents[1] / "data" / "kineto" / "h200x4_ag_gemm_bsp_clean_rank0.json.gz", trace)
    for cmd in (["show"], ["analyze"], ["advise"], ["report", "-o", str(tmp_path / "r.html")],
                ["export-trace", "-o", str(tmp_path / "t.json")]):
        res = CliRunner().invoke(cli, [*cmd, str(trace)])
        assert res.exit_code == 2, (cmd, res.output)
        assert f"{trace} is a kineto trace, not a bundle: import it first" in res.output, (cmd, res.output)
        assert f"taxmodel import {trace} ... -o my_job" in res.output
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path)])
    assert res.exit_code == 2 and "it holds traces, not bundles (1 file(s) such as rank0.json.gz, a kineto trace)" in res.output
    assert f"taxmodel import {tmp_path}/*.json.gz -o my_job" in res.output
