"""benchmarks/bench_ag_gemm.py and bench_gemm_rs.py on one CPU rank (Triton's interpreter): a shape
override reaches every row, and the final round times every variant at its best config and every
floor side by side (``@final`` rows) and is what the verdict columns compare. The times mean nothing
here; the rows, their checks and the table's columns are what a GPU run relies on."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_ag_gemm  # noqa: E402
import bench_gemm_rs  # noqa: E402


def test_final_round_and_shape_override(tmp_path: Path) -> None:
    out = tmp_path / "ag"
    rc = bench_ag_gemm.main(["--cpu", "--sizes", "tiny", "--variants", "bsp,pull,push", "--graph", "--shape", "N=24",
                             "--final-rounds", "2", "--final-every-config", "--out", str(out)])
    assert rc == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["N"] for r in rows if "N" in r} == {24}
    final = {r["variant"]: r for r in rows if str(r["variant"]).endswith("@final")}
    assert {"bsp@final", "pull@final", "push@final", "floor:matmul(cublas)@final", "floor:gemm(triton)@final"} <= set(final)
    assert all(r["ms"] > 0 and "interleaved rounds" in r["note"] for r in final.values())
    # --final-every-config: pull's other transport (the CPU run tries "ce" and "sm") joins the round beside its best
    others = [v for v in final if v.startswith("pull[")]
    assert len(others) == 1 and final[others[0]]["config"] not in ("", final["pull@final"]["config"])
    table = (out / "results.md").read_text()
    assert "final: best fine-grained vs bsp" in table and "`@final`" in table


def test_a_bad_shape_override_is_refused() -> None:
    with pytest.raises(SystemExit):
        bench_ag_gemm.parse_args(["--shape", "N"])
    with pytest.raises(SystemExit):
        bench_ag_gemm.parse_args(["--final-rounds", "-1"])


def test_gemm_rs_final_round(tmp_path: Path) -> None:
    out = tmp_path / "rs"
    assert bench_gemm_rs.main(["--cpu", "--sizes", "tiny", "--graph", "--final-rounds", "2", "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    final = {r["variant"] for r in rows if str(r["variant"]).endswith("@final")}
    assert {"bsp@final", "fused@final", "floor:matmul(cublas)@final", "floor:gemm(triton)@final"} <= final
    assert "final: fused vs cuBLAS alone" in (out / "results.md").read_text()
