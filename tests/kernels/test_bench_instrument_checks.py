"""bench_instrument's consistency check (benchmarks/bench_instrument.py ``_consistency``): a kernel
that did not run in the step (the AG+GEMM copy kernel on one rank: no peers) is not a failure; a
kernel that ran without records, or records without their kernel, is."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_instrument  # noqa: E402

INFO = {"residual_ns": {0: 0}, "spans_longer_than_kernel": 0}


def _rows(kernel: bool, records: bool, name: str = "gemm") -> list[dict]:
    rows = []
    if kernel:
        rows.append(dict(kind="kernel", name=name, cta=-1, phase="", start_ns=0, end_ns=1000))
    if records:
        rows += [dict(kind="record", name=name, cta=0, phase="compute", start_ns=100, end_ns=400),
                 dict(kind="record", name=name, cta=0, phase="flag_wait", start_ns=400, end_ns=900)]
    return rows


def test_a_kernel_not_launched_is_not_a_failure() -> None:
    merged = pd.DataFrame(_rows(True, True))
    out = bench_instrument._consistency(merged, INFO, ("gemm", "copy"))
    assert out["ok"] is True
    assert out["kernels"]["copy"] == {"ok": True, "why": "not launched"}
    assert out["kernels"]["gemm"]["ok"] is True and out["kernels"]["gemm"]["records"] == 2


def test_a_kernel_without_records_or_records_without_a_kernel_fail() -> None:
    for kernel, records in ((True, False), (False, True)):
        merged = pd.DataFrame(_rows(True, True) + _rows(kernel, records, "copy"))
        out = bench_instrument._consistency(merged, INFO, ("gemm", "copy"))
        assert out["ok"] is False and out["kernels"]["copy"]["ok"] is False, (kernel, records)


def test_phases_that_do_not_sum_to_the_lifetime_fail() -> None:
    rows = _rows(True, True)
    rows[-1] = dict(rows[-1], start_ns=500)  # a gap between the CTA's two records
    out = bench_instrument._consistency(pd.DataFrame(rows), INFO, ("gemm",))
    assert out["ok"] is False and out["kernels"]["gemm"]["max_phase_sum_minus_life_ns"] == 100
