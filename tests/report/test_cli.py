"""`taxmodel report` and `taxmodel export-trace` end to end, on bundles written to disk."""
import json

import pytest
from click.testing import CliRunner

from conftest import real_ledger_available
from taxmodel.cli import cli
from taxmodel.report import headline
from taxmodel.report.build import load_cases
from taxmodel.trace.bundle import write_bundle

pytestmark = pytest.mark.skipif(not real_ledger_available(), reason="taxmodel.model.ledger is not written yet")


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
    # meta.json stores shape keys sorted, so compare with the ledgers of the bundles as loaded
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


def test_export_trace_wants_one_bundle(bundle_dir, tmp_path):
    res = CliRunner().invoke(cli, ["export-trace", str(bundle_dir), "-o", str(tmp_path / "t.json")])
    assert res.exit_code == 2
    assert "exactly one" in res.output
