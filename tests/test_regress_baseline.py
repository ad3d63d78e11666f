"""`taxmodel baseline update`: shows what changes, refuses without confirmation, writes whole, logs."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.regress.baseline import LOG_NAME, apply_update, plan_update, read_log
from taxmodel.trace.bundle import find_bundles

from test_regress_compare import BSP_ROW, FUSED_ROW, SLOW_GAP_NS, write_side


def run(*args, input=None):
    result = CliRunner().invoke(cli, [str(a) for a in args], input=input)
    return result.exit_code, result.output


@pytest.fixture()
def baseline(tmp_path):
    return write_side(tmp_path / "profiles" / "h200", seed=1, repetitions=3)


def _snapshot(path):
    return sorted((p.relative_to(path).as_posix(), p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file())


def test_update_without_confirmation_writes_nothing(baseline, tmp_path):
    cand = write_side(tmp_path / "runs", seed=2, repetitions=3, slow={"bsp": {"kernel_gap_ns": SLOW_GAP_NS}})
    before = _snapshot(baseline)
    code, out = run("baseline", "update", cand, "--baseline", baseline)
    assert code == 2
    assert "re-run with --yes" in out
    assert f"replace  {BSP_ROW}: latency " in out  # the plan is printed before refusing
    assert _snapshot(baseline) == before
    assert not list(baseline.parent.glob(".*tmp"))  # no staging left behind


def test_update_with_yes_replaces_the_rows_and_logs_it(baseline, tmp_path):
    cand = write_side(tmp_path / "runs", seed=2, repetitions=3, variants=("bsp",),
                      slow={"bsp": {"kernel_gap_ns": SLOW_GAP_NS}})
    code, out = run("baseline", "update", cand, "--baseline", baseline, "--yes", "-m", "slower gaps accepted")
    assert code == 0, out
    # old vs new latency and taxes per row: bsp replaced (launch tax 0 -> 6.3 us), fused kept
    line = next(text for text in out.splitlines() if BSP_ROW in text)
    assert line.strip().startswith("replace")
    assert "launch_tax 0.0 -> 6.3 us" in line
    assert any(text.strip().startswith("keep") and FUSED_ROW in text for text in out.splitlines())
    names = sorted(p.name for p in find_bundles(baseline))
    assert names == ["fused", "synthetic__bsp__k=512_m=128_n=256"]
    log = read_log(baseline)
    assert len(log) == 1 and log[0]["message"] == "slower gaps accepted"
    assert [r["row"] for r in log[0]["rows"]] == [BSP_ROW]
    assert log[0]["rows"][0]["new_launch_tax_us"] == pytest.approx(6.3)
    # the candidate now passes against the updated baseline (its fused row stays only there)
    code, out = run("compare", baseline, cand, "--allow-missing")
    assert code == 0, out


def test_interactive_confirmation(baseline, tmp_path, monkeypatch):
    cand = write_side(tmp_path / "runs", seed=2, repetitions=3)
    monkeypatch.setattr("taxmodel.cli._stdin_is_terminal", lambda: True)
    code, out = run("baseline", "update", cand, "--baseline", baseline, input="n\n")
    assert code == 1 and "Aborted" in out
    assert read_log(baseline) == []
    code, out = run("baseline", "update", cand, "--baseline", baseline, input="y\n")
    assert code == 0, out
    assert len(read_log(baseline)) == 1


def test_first_update_creates_the_baseline_directory(tmp_path):
    cand = write_side(tmp_path / "runs", seed=2, repetitions=2)
    target = tmp_path / "profiles" / "new"
    plan = plan_update(cand, target)
    assert list(plan.changes["action"]) == ["add", "add"]
    apply_update(plan)
    assert len(find_bundles(target)) == 2
    entry = json.loads((target / LOG_NAME).read_text().splitlines()[0])
    assert entry["candidate"] == str(cand) and len(entry["rows"]) == 2


def test_a_bundle_is_not_a_baseline_directory(baseline, tmp_path):
    cand = write_side(tmp_path / "runs", seed=2, repetitions=2)
    code, out = run("baseline", "update", cand, "--baseline", baseline / "bsp", "--yes")
    assert code == 2 and "is a bundle itself" in out
