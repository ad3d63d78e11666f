"""The same step with nothing traced, beside the traced one: ``capture_meta.unprofiled_step_ns``
reads it from a bundle's meta only where ``capture.replay_method`` says it was timed as a benchmark
runs steps; ``taxmodel analyze`` prints it with the ratio and what a ratio past 5% means, ``--json``
and the report's metadata table carry it."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.report import document, terminal
from taxmodel.trace.capture_meta import unprofiled_step_ns

RUN4 = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200x2-model-check-run4" / "runs" / "default"
SHORT = RUN4 / "flash_decode" / "bsp-batch16xkv_len1024xq_heads32xkv_heads4xhead_dim128"  # traced 1.093x


@pytest.mark.parametrize("capture, expected", [
    ({"replay_step_us": 23.1, "replay_method": "graph-of-iterations minus one-step graph"}, 23100.0),
    ({"replay_step_us": 23.1}, None),  # an older bundle: one graph launch per step, not comparable
    ({"replay_step_us": None, "replay_method": "x"}, None),
    ({"replay_step_us": -1.0, "replay_method": "x"}, None),
    ({"replay_step_us": float("nan"), "replay_method": "x"}, None),
    ({"replay_step_us": True, "replay_method": "x"}, None),
    ({"replay_step_us": "23", "replay_method": "x"}, None),
])
def test_the_unprofiled_step_is_read_only_where_its_method_is_recorded(capture, expected):
    assert unprofiled_step_ns({"capture": capture}) == expected
    assert unprofiled_step_ns({}) is None and unprofiled_step_ns({"capture": "broken"}) is None


def _ledger(window_us: float, replay_us: float | None) -> SimpleNamespace:
    capture = {"replay_step_us": replay_us, "replay_method": "m"} if replay_us is not None else {}
    windows = pd.DataFrame({"window_ns": [window_us * 1e3, window_us * 1e3]})
    return SimpleNamespace(meta={"capture": capture}, windows=windows)


def test_the_line_says_which_way_a_step_past_five_percent_went():
    assert terminal.unprofiled_step_line(_ledger(100.0, None)) == ""
    within = terminal.unprofiled_step_line(_ledger(102.0, 100.0))
    assert "100.0 us" in within and "1.020" in within and ":" not in within.split(")")[-1]
    assert "tracer lengthened" in terminal.unprofiled_step_line(_ledger(109.3, 100.0))
    assert "ran faster" in terminal.unprofiled_step_line(_ledger(90.0, 100.0))


def test_analyze_prints_it_and_json_and_the_report_table_carry_it():
    r = CliRunner().invoke(cli, ["analyze", str(SHORT)])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("un-profiled"))
    meta = json.loads((SHORT / "meta.json").read_text())
    ref_us = meta["capture"]["replay_step_us"]
    assert f"{ref_us:,.1f} us" in line and "tracer lengthened" in line
    r = CliRunner().invoke(cli, ["analyze", str(SHORT), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["ledgers"][0]["unprofiled_step_ns"] == pytest.approx(ref_us * 1e3)
    assert document._unprofiled_cell(meta) == f"{ref_us:,.1f}"
    assert document._unprofiled_cell({"capture": {"replay_step_us": 5.0}}) == ""
