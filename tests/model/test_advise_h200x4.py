"""benchmarks/results/advise_h200x4.md is what the committed 4x H200 bundles give: the advisor's
predicted saving and bound for each bsp AG+GEMM / GEMM+RS bundle beside the measured saving of
the best fine-grained variant at its shape (benchmarks/advise_h200x4.py). The agreement itself is
not asserted (1 of 10 within 25% when recorded); that the bound covers the measured saving is:
it did for all 10, and a change that breaks it should be looked at."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import taxmodel

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "advise_h200x4.md"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("advise_h200x4", ROOT / "benchmarks" / "advise_h200x4.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def table(script):
    return script.comparison()


def test_the_recorded_table_is_what_the_bundles_give(script, table):
    assert script.table_in(RESULTS) == script.markdown(table)


def test_every_bsp_bundle_with_fine_grained_peers_is_compared(table):
    assert len(table) == 10
    assert set(zip(table["folder"], table["workload"])) == {("h200x4-graph-gate", "ag_gemm"),
                                                            ("h200x4-graph-gate", "gemm_rs"), ("h200x4-graph", "ag_gemm")}
    assert table[["measured_saving_us", "bound_us", "predicted_saving_us"]].notna().all().all()


def test_measured_saving_comes_from_the_bundles_windows(table):
    row = table[(table["folder"] == "h200x4-graph-gate") & (table["workload"] == "gemm_rs")
                & (table["shape"] == "K=8192 M=8192 N=8192")].iloc[0]
    folder = ROOT / "profiles" / "h200x4-graph-gate" / "gemm_rs"
    bsp = taxmodel.load(folder / "bsp-M8192xN8192xK8192").windows["window_ns"].mean()
    fused = taxmodel.load(folder / "fused-M8192xN8192xK8192").windows["window_ns"].mean()
    assert row["measured_saving_us"] == pytest.approx((bsp - fused) / 1e3, rel=1e-12)


def test_the_bound_covers_every_measured_saving(table):
    assert (table["bound_us"] >= table["measured_saving_us"]).all(), table
