"""`taxmodel compare` end to end on synthetic bundles with realistic noise and known injections.

Noise: every GEMM takes a uniform random 0-5 us extra per rank and iteration (``jitter_ns``),
about 1% of the ~125 us iteration, like the 0.3-2.6% spread of the per-step windows in the
H200 traces. Each side has 8 repetitions of 6 iterations, enough that the verdicts below hold
with a wide margin for these fixed seeds.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from taxmodel import safetext
from taxmodel.cli import cli
from taxmodel.regress import compare_paths
from taxmodel.regress.samples import METRICS
from taxmodel.trace.bundle import META_FILE, write_bundle
from taxmodel.testing.synthetic import synthetic_bundle

VARIANTS = ("bsp", "fused")
NOISE = dict(world_size=2, iterations=6, repetitions=8, jitter_ns=5000)
SLOW_GAP_NS = 2100  # three queued kernels per iteration wait 2.1 us more: +6.3 us, ~5% of the window
BSP_ROW = "synthetic/bsp/k=512,m=128,n=256"
FUSED_ROW = "synthetic/fused/k=512,m=128,n=256"


def write_case(root: Path, name: str, *, meta_update: dict | None = None, **params) -> Path:
    """Write a synthetic bundle to ``root/name``; return its path."""
    case = synthetic_bundle(**params)
    meta = {**case.bundle.meta, **(meta_update or {})}
    return write_bundle(root / name, case.bundle.events, meta)


def write_side(root: Path, seed: int, slow: dict[str, dict] | None = None, variants=VARIANTS, **common) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, variant in enumerate(variants):
        params = {**NOISE, **common, **(slow or {}).get(variant, {})}
        write_case(root, variant, variant=variant, seed=seed * 100 + i, **params)
    return root


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    root = tmp_path_factory.mktemp("regress")
    return {
        "baseline": write_side(root / "baseline", seed=1),
        "same": write_side(root / "same", seed=2),
        "slow": write_side(root / "slow", seed=3, slow={"bsp": {"kernel_gap_ns": SLOW_GAP_NS}}),
        "skewed": write_side(root / "skewed", seed=4, slow={"bsp": {"skew_ns": 10_000}}),
    }


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def test_candidate_from_the_same_distribution_passes(sides, tmp_path):
    code, out = run("compare", sides["baseline"], sides["same"], "--junit", tmp_path / "j.xml", "--markdown", tmp_path / "s.md")
    assert code == 0, out
    assert "verdict: UNCHANGED (0 regressed, 0 improved, 2 unchanged)" in out
    suites = ET.parse(tmp_path / "j.xml").getroot()
    assert suites.get("failures") == "0" and suites.get("errors") == "0"
    assert int(suites.get("tests")) == 2 * len(METRICS) == 2 * 15  # latency + 6 categories + 8 sub-categories per row


def test_five_percent_kernel_gap_regresses_that_row_only(sides, tmp_path):
    junit, md, js = tmp_path / "junit.xml", tmp_path / "summary.md", tmp_path / "out.json"
    code, out = run("compare", sides["baseline"], sides["slow"], "--junit", junit, "--markdown", md, "--json", js)
    assert code == 1, out
    data = json.loads(js.read_text())
    rows = {r["row"]: r for r in data["rows"]}
    assert rows[BSP_ROW]["verdict"] == "regressed" and rows[FUSED_ROW]["verdict"] == "unchanged"
    assert rows[BSP_ROW]["regressed"] == ["latency", "launch_tax", "kernel_gap"]
    assert rows[BSP_ROW]["unit_baseline"] == "repetition" and rows[BSP_ROW]["repetitions_candidate"] == 8
    assert 0.045 < rows[BSP_ROW]["latency_rel_change"] < 0.055  # the injection is the 5% it claims
    assert data["exit_code"] == 1 and data["verdict"] == "regressed"
    # JUnit: one testcase per row and metric, one failure per regressed metric, all in the bsp row
    root = ET.parse(junit).getroot()
    assert root.get("failures") == "3"
    failed = [(c.get("classname"), c.get("name")) for c in root.iter("testcase") if c.find("failure") is not None]
    assert failed == [("synthetic.bsp[k=512,m=128,n=256]", m) for m in ("latency", "launch_tax", "kernel_gap")]
    assert len(list(root.iter("testcase"))) == 2 * len(METRICS)
    # Markdown: the verdict table with both rows
    text = md.read_text()
    assert "| Row | Verdict | Latency baseline → candidate | Change [CI] | Regressed metrics | Improved metrics |" in text
    assert f"| `{BSP_ROW}` | ❌ regressed |" in text and f"| `{FUSED_ROW}` | ✅ unchanged |" in text
    assert "latency, launch_tax, kernel_gap" in text


def test_a_new_skew_is_caught_in_the_variant_that_has_it(sides):
    result = compare_paths(sides["baseline"], sides["skewed"])
    verdicts = dict(zip(result.rows["row"], result.rows["verdict"]))
    assert verdicts == {BSP_ROW: "regressed", FUSED_ROW: "unchanged"}
    regressed = result.rows.set_index("row").loc[BSP_ROW, "regressed"]
    # the late rank waits 10 us on the host (launch tax), the other one inside the all-gather
    assert {"latency", "bsp_tax", "skew_wait"} <= set(regressed)
    assert result.exit_code == 1


def test_swapping_sides_turns_the_regression_into_an_improvement(sides):
    result = compare_paths(sides["slow"], sides["baseline"])
    verdicts = dict(zip(result.rows["row"], result.rows["verdict"]))
    assert verdicts == {BSP_ROW: "improved", FUSED_ROW: "unchanged"}
    assert result.exit_code == 0


def test_results_are_deterministic(sides):
    a = compare_paths(sides["baseline"], sides["slow"])
    b = compare_paths(sides["baseline"], sides["slow"])
    assert a.metrics[["ci_low", "ci_high"]].equals(b.metrics[["ci_low", "ci_high"]])


def test_mismatched_workloads_cannot_be_compared(sides, tmp_path):
    other = write_side(tmp_path / "other", seed=5, workload="flash_decode")
    md, junit, js = tmp_path / "s.md", tmp_path / "j.xml", tmp_path / "o.json"
    code, out = run("compare", sides["baseline"], other, "--markdown", md, "--junit", junit, "--json", js)
    assert code == 2
    reason = "mismatched workloads: baseline has synthetic, candidate has flash_decode"
    assert reason in out
    # the reports still say why, for the CI job summary and test tab
    assert "cannot compare" in md.read_text() and safetext.markdown(reason) in md.read_text()  # escaped, literal
    assert ET.parse(junit).getroot().get("errors") == "1"
    assert json.loads(js.read_text())["exit_code"] == 2


def test_mismatched_devices_cannot_be_compared(sides, tmp_path):
    cand = tmp_path / "h100"
    cand.mkdir()
    for v in VARIANTS:
        write_case(cand, v, variant=v, seed=7, meta_update={"hardware": {"name": "NVIDIA H100", "vendor": "nvidia"}}, **NOISE)
    code, out = run("compare", sides["baseline"], cand)
    assert code == 2
    assert "device differs (baseline H200 SXM, candidate NVIDIA H100)" in out


def test_graph_and_eager_captures_cannot_be_compared(sides, tmp_path):
    cand = tmp_path / "graph"
    cand.mkdir()
    for v in VARIANTS:
        write_case(cand, v, variant=v, seed=7, meta_update={"capture": {"graph": True}}, **NOISE)
    code, out = run("compare", sides["baseline"], cand)
    assert code == 2
    assert "launches differs (baseline eager, candidate CUDA graph)" in out


def test_mismatched_world_sizes_cannot_be_compared(sides, tmp_path):
    cand = write_side(tmp_path / "ws4", seed=8, **{"world_size": 4, "repetitions": 2})
    code, out = run("compare", sides["baseline"], cand)
    assert code == 2
    assert "world_size differs (baseline 2, candidate 4)" in out


def test_other_schema_versions_cannot_be_compared(sides, tmp_path):
    cand = write_side(tmp_path / "old", seed=9, **{"repetitions": 2})
    meta_path = cand / "bsp" / META_FILE
    meta = json.loads(meta_path.read_text())
    meta["schema_version"] = 0
    meta_path.write_text(json.dumps(meta))
    code, out = run("compare", sides["baseline"], cand)
    assert code == 2
    assert "candidate" in out and "schema_version" in out


def test_rows_on_one_side_are_reported_and_exit_2_unless_allowed(sides, tmp_path):
    cand = write_side(tmp_path / "bsp_only", seed=2, variants=("bsp",))
    junit = tmp_path / "j.xml"
    code, out = run("compare", sides["baseline"], cand, "--junit", junit)
    assert code == 2
    assert f"missing: {FUSED_ROW} is only in the baseline" in out
    assert ET.parse(junit).getroot().get("errors") == "1"
    code, out = run("compare", sides["baseline"], cand, "--allow-missing", "--junit", junit)
    assert code == 0, out
    root = ET.parse(junit).getroot()
    assert root.get("errors") == "0" and root.get("skipped") == "2"  # useful (not gated) + the missing row


def test_a_stricter_config_beside_the_baseline_is_picked_up(sides, tmp_path):
    """A threshold above the injected change turns the regression into 'unchanged'."""
    cfg = tmp_path / "loose.toml"
    cfg.write_text("[thresholds.latency]\nrelative = 0.10\n[thresholds.default]\nrelative = 0.10\n")
    code, out = run("compare", sides["baseline"], sides["slow"], "--config", cfg)
    assert code == 0, out
    assert f"Thresholds: {cfg}" in out
