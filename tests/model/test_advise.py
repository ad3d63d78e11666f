"""The fusion advisor (taxmodel.model.advise): candidates, the taxes on their boundaries, the bound,
the confidence, and the seam for per-kernel floors. Expected values come from how the synthetic
bundles were built (their injected gaps and skews), not from the advisor's own arithmetic."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import taxmodel
from taxmodel.cli import cli
from taxmodel.model import advise as adv
from taxmodel.ledger.compute import compute_ledger
from taxmodel.testing.synthetic import COLLECTIVE, GEMM, synthetic_bundle

ROOT = Path(__file__).resolve().parents[2]
GATED_AG = ROOT / "profiles" / "h200x4-graph-gate" / "ag_gemm" / "bsp-M1024xN8192xK8192xtp0"
KINETO = sorted((ROOT / "tests" / "data" / "kineto").glob("h200x4_ag_gemm_bsp_clean_rank*.json.gz"))


def _advise(case, **kw) -> pd.DataFrame:
    led = compute_ledger(case.bundle, case.hardware)
    return adv.advise(adv.Inputs(case.bundle, led, kw.pop("kernel_costs", None)), top=None, **kw)


def _row(table: pd.DataFrame, kind: str) -> pd.Series:
    rows = table[table["kind"] == kind]
    assert len(rows) == 1, table[["kind", "kernels"]]
    return rows.iloc[0]


@pytest.fixture(scope="module")
def gapped():
    # 2 ranks, 3 iterations; rank 1 launches its collective 5 us late; every queued kernel waits 3 us
    return synthetic_bundle(world_size=2, iterations=3, kernel_gap_ns=3000, skew_ns=5000, intermediate_bytes=1 << 24)


def test_collective_pair_carries_its_skew_exposed_transfer_and_the_gap_to_its_gemm(gapped):
    t = _advise(gapped)
    pair = _row(t, "AG+GEMM")
    assert pair["kernels"] == f"{COLLECTIVE} -> {GEMM}"
    # per rank and iteration: the 20 us transfer on both ranks plus the 5 us rank 0 waits for rank 1
    assert pair["bsp_tax_us"] == pytest.approx((2 * 20.0 + 5.0) / 2)
    assert pair["launch_tax_us"] == pytest.approx(3.0)  # the one queued gap between the collective and the GEMM
    assert pair["per_iteration"] == pytest.approx(1.0)
    assert pair["bound_us"] == pytest.approx(pair["bsp_tax_us"] + pair["launch_tax_us"] + pair["locality_tax_us"])


def test_run_holds_every_gap_between_its_kernels_and_ranks_first(gapped):
    t = _advise(gapped)
    run = _row(t, "run")
    assert run["n_kernels"] == 4
    expected = gapped.expected
    # the layout starts every rank's window with its prologue, so each gap the construction put in
    # (queued gaps, the late rank's host-starved launch and its latency) lies between the run's kernels
    total = expected[expected["subcategory"].isin(adv.LAUNCH_PARTS)]["ns"].sum() / (3 * 2) / 1e3
    assert total > 0
    assert run["launch_tax_us"] == pytest.approx(total, abs=1e-3)
    assert list(t["bound_us"]) == sorted(t["bound_us"], reverse=True)


def test_chain_after_gemm_gets_the_declared_intermediate_between_them(gapped):
    t = _advise(gapped)
    chain = _row(t, "chain")
    assert chain["kernels"].startswith(GEMM) and chain["n_kernels"] == 2
    hw = gapped.hardware
    assert chain["locality_tax_us"] == pytest.approx(2 * (1 << 24) / hw.hbm_bytes_per_s * 1e6, rel=1e-6)
    assert "memory-bound by kernel name" in chain["missing"]
    assert chain["confidence"] == "estimated"


def test_a_host_sync_breaks_runs_and_chains():
    case = synthetic_bundle(world_size=2, iterations=2, sync_ns=4000)
    t = _advise(case)
    assert "chain" not in set(t["kind"])  # the sync returns between the GEMM and the epilogue
    assert not any(k.endswith("epilogue_kernel") for k in t.loc[t["kind"] == "run", "kernels"])


def test_one_iteration_without_cost_still_gets_candidates_and_says_what_is_missing():
    case = synthetic_bundle(world_size=2, iterations=1, kernel_gap_ns=2000)
    case.bundle.meta.pop("cost", None)
    t = _advise(case)
    assert len(t)
    missing = " ".join(t["missing"])
    assert "per-kernel floors" in missing
    assert "one iteration" in missing
    assert "locality (no counters" in missing
    assert t["locality_tax_us"].isna().all()
    pair = _row(t, "AG+GEMM")
    assert np.isnan(pair["predicted_saving_us"])
    assert "shapes for the ag_gemm model" in pair["missing"]


def test_per_kernel_floors_cap_the_bound_and_drop_out_of_missing(gapped):
    ev = gapped.bundle.events
    gpu = ev[ev["kind"].isin(["kernel", "memcpy", "memset"])]
    floors = pd.DataFrame({"floor_ns": (gpu["end_ns"] - gpu["start_ns"]).astype(float)}, index=gpu.index)
    t = _advise(gapped, kernel_costs=floors)
    pair = _row(t, "AG+GEMM")
    # every kernel at its floor: only the idle time between them is left to recover
    assert pair["bound_us"] == pytest.approx(3.0)
    assert "per-kernel floors" not in pair["missing"]


def test_kernel_costs_bound_decides_what_is_memory_bound(gapped):
    ev = gapped.bundle.events
    gpu = ev[ev["kind"] == "kernel"]
    bound = pd.Series(np.where(gpu["name"] == "epilogue_kernel", "compute", None), index=gpu.index, dtype=object)
    t = _advise(gapped, kernel_costs=pd.DataFrame({"bound": bound}))
    assert "chain" not in set(t["kind"])


def test_covered_matches_a_brute_force_overlap():
    rng = np.random.default_rng(3)
    rows = []
    for rank in range(2):
        for it in range(2):
            t = 1000 * it
            for _ in range(6):
                a = t + int(rng.integers(0, 40))
                b = a + int(rng.integers(1, 60))
                rows.append((0, it, rank, "kernel_gap" if rng.random() < 0.5 else "useful", a, b))
                t = b
    iv = pd.DataFrame(rows, columns=["repetition", "iteration", "rank", "subcategory", "start_ns", "end_ns"])
    q = pd.DataFrame({"rank": rng.integers(0, 2, 30), "iteration": rng.integers(0, 2, 30)})
    q["a"] = q["iteration"] * 1000 + rng.integers(0, 300, 30)
    q["b"] = q["a"] + rng.integers(0, 300, 30)
    got = adv.covered(iv, "kernel_gap", q["rank"].to_numpy(), np.zeros(30, np.int64), q["iteration"].to_numpy(),
                      q["a"].to_numpy(), q["b"].to_numpy())
    g = iv[iv["subcategory"] == "kernel_gap"]
    for i, r in q.iterrows():
        x = g[(g["rank"] == r["rank"]) & (g["iteration"] == r["iteration"])]
        want = (np.minimum(x["end_ns"], r["b"]) - np.maximum(x["start_ns"], r["a"])).clip(lower=0).sum()
        assert got[i] == want


def test_real_bsp_bundle_pair_holds_the_collectives_whole_wait_and_a_prediction():
    p = taxmodel.load(GATED_AG)
    t = p.advise()
    assert list(t.columns) == list(adv.COLUMNS)
    pair = _row(t, "AG+GEMM")
    s = p.summary.set_index("subcategory")["mean_ns"]
    # one collective per iteration: all of the rank's skew wait and exposed transfer lie in the pair
    assert pair["bsp_tax_us"] == pytest.approx((s["skew_wait"] + s["exposed_comm"]) / 1e3, rel=1e-9)
    assert pair["model"] in ("ag_gemm/pull", "ag_gemm/push")
    assert np.isfinite(pair["predicted_saving_us"]) and np.isfinite(pair["predicted_fused_us"])
    assert pair["confidence"] == "estimated"


def test_foreign_trace_gets_the_pair_and_names_the_missing_shapes():
    p = taxmodel.load(KINETO)
    pair = _row(p.advise(), "AG+GEMM")
    assert pair["bsp_tax_us"] > 0
    assert "shapes for the ag_gemm model" in pair["missing"]
    assert "locality (no counters" in pair["missing"]


def test_cli_prints_table_and_json_and_fails_cleanly():
    r = CliRunner().invoke(cli, ["advise", str(GATED_AG), "--top", "3"])
    assert r.exit_code == 0, r.output
    assert "AG+GEMM" in r.output and "what fusing would buy" in r.output
    r = CliRunner().invoke(cli, ["advise", str(GATED_AG), "--json"])
    doc = json.loads(r.output)
    assert doc["candidates"][0]["kind"] == "AG+GEMM"
    r = CliRunner().invoke(cli, ["advise", str(ROOT / "docs")])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_kernel_classes_by_name():
    names = pd.Series(["cutlass_80_tensorop_bf16_s16816gemm_relu_bf16", "triton_poi_fused_add_mul_0",
                       "flash_fwd_kernel", "flash_decode_combine_local", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                       "some_custom_kernel"])
    role = pd.Series(["compute"] * 4 + ["comm", "compute"])
    op = pd.Series([""] * 4 + ["allreduce", ""])
    got = adv._classes(names, role, op, None, names.index)
    assert list(got) == ["gemm", "memory", "attention", "memory", "comm", "other"]


def test_gemm_then_all_reduce_is_a_pair_without_a_model():
    from taxmodel.trace.bundle import Bundle

    p = taxmodel.load(ROOT / "profiles" / "h200x4-graph-gate" / "gemm_rs" / "bsp-M1024xN8192xK8192")
    ev = p.events.copy()
    ev["collective_op"] = ev["collective_op"].replace({"reduce_scatter": "allreduce"})
    q = taxmodel.api.Profile(Bundle(events=ev, meta=p.meta, path=p.path))
    t = q.advise()
    pair = _row(t, "GEMM+AR")
    assert pair["ops"] == "gemm -> allreduce"
    assert pair["model"] == "" and np.isnan(pair["predicted_saving_us"])
    assert pair["bsp_tax_us"] == pytest.approx(_row(p.advise(), "GEMM+RS")["bsp_tax_us"])


def test_a_bundle_of_lone_kernels_has_no_candidates_and_says_so():
    from taxmodel.report.advice import render_advice
    from taxmodel.trace.bundle import Bundle

    case = synthetic_bundle(world_size=2, iterations=2)
    ev = case.bundle.events
    keep = (ev["kind"] != "kernel") | (ev["name"] == GEMM)
    bundle = Bundle(events=ev[keep].reset_index(drop=True), meta=case.bundle.meta)
    led = compute_ledger(bundle, case.hardware)
    t = adv.advise(adv.Inputs(bundle, led))
    assert t.empty and list(t.columns) == list(adv.COLUMNS)
    assert "no fusion candidates" in render_advice(t, "x", 1.0)
