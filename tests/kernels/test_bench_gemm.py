"""benchmarks/bench_gemm.py's CPU-runnable parts and the per-shape tile table (issue 25).

The timing itself needs a GPU; here: argument parsing, the shapes it times, the record format, the
correctness check (it must reject a wrong product, not only accept a right one), one tiny run in
Triton's interpreter end to end, and the table lookup (``gemm_table.py``, ``config_for_shape``).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_gemm  # noqa: E402

from taxmodel.kernels.ag_gemm import gemm_table  # noqa: E402
from taxmodel.kernels.ag_gemm.gemm_tiles import CPU_CONFIG, GPU_CONFIG, config_for_shape  # noqa: E402


def test_shapes_cover_the_full_and_tensor_parallel_gemms() -> None:
    args = bench_gemm.parse_args(["--ms", "1024,8192", "--world", "4"])
    assert bench_gemm.shapes(args) == [(1024, 8192, 8192), (1024, 2048, 8192), (1024, 8192, 2048),
                                       (8192, 8192, 8192), (8192, 2048, 8192), (8192, 8192, 2048)]
    assert bench_gemm.shapes(bench_gemm.parse_args(["--ms", "64", "--world", "1"])) == [(64, 8192, 8192)]


def test_arguments_are_checked() -> None:
    with pytest.raises(SystemExit):
        bench_gemm.parse_args(["--tune"])  # no --table-out
    with pytest.raises(SystemExit):
        bench_gemm.parse_args(["--ms", "0"])
    assert bench_gemm.parse_args([]).dtype == "bfloat16"
    assert bench_gemm.parse_args(["--cpu"]).dtype == "float32"


def test_the_check_rejects_a_wrong_or_unwritten_product() -> None:
    dev = torch.device("cpu")
    right = bench_gemm.relative_error(5, 6, 7, torch.float32, dev, bench_gemm.cublas_fn, seed=0)
    assert right < 1e-6

    def off_by_one_row(ops: bench_gemm.Operands):
        def run() -> None:
            torch.matmul(ops.a, ops.b, out=ops.c)
            ops.c[0] += 1.0
        return run

    assert bench_gemm.relative_error(5, 6, 7, torch.float32, dev, off_by_one_row, seed=0) > bench_gemm.TOLERANCE
    # a kernel that writes nothing leaves the NaN poison: infinitely wrong
    assert bench_gemm.relative_error(5, 6, 7, torch.float32, dev, lambda ops: (lambda: None), seed=0) == float("inf")


def test_interpreter_run_writes_records_and_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """M=1 and M=34 (two ranks of 17 rows: partial 16-row CPU tiles), N/2 and K/2: every engine impl
    (alone, with its flag waits, GEMM+RS's pushes to the owners' slots) is right and timed
    interleaved with torch.matmul, and the output has the issue's record format."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rc = bench_gemm.main(["--cpu", "--ms", "1,34", "--n", "40", "--k", "48", "--world", "2", "--samples", "2",
                          "--calls", "1", "--warmup", "0", "--out-dir", str(tmp_path),
                          "--impls", ",".join(bench_gemm.ENGINE_IMPLS)])
    assert rc == 0
    recs = json.loads((tmp_path / "gemm_cpu.json").read_text())
    assert {(r["M"], r["N"], r["K"]) for r in recs} == {(m, n, k) for m in (1, 34) for n, k in ((40, 48), (20, 48), (40, 24))}
    for r in recs:
        assert {"M", "N", "K", "dtype", "impl", "config", "times_ms"} <= set(r)
        assert r["impl"] in ("cublas", *bench_gemm.ENGINE_IMPLS) and r["dtype"] == "float32"
        assert len(r["times_ms"]) == 2 and all(t > 0 for t in r["times_ms"])
        assert r["rel_error"] <= bench_gemm.TOLERANCE
    assert {r["impl"] for r in recs} == {"cublas", *bench_gemm.ENGINE_IMPLS}
    tax = next(r for r in recs if r["impl"] == "taxmodel")
    assert tax["config"].startswith(CPU_CONFIG.tile_label())
    md = (tmp_path / "gemm_cpu.md").read_text()
    cb = next(r for r in recs if r["impl"] == "cublas" and (r["M"], r["N"], r["K"]) == (34, 40, 48))
    for impl in bench_gemm.ENGINE_IMPLS:
        row = next(line for line in md.splitlines() if line.startswith(f"| 34 | 40 | 48 | {impl} |"))
        tx = next(r for r in recs if r["impl"] == impl and (r["M"], r["N"], r["K"]) == (34, 40, 48))
        ratio = statistics.median(cb["times_ms"]) / statistics.median(tx["times_ms"])
        assert f"{ratio:.3f}x" in row


def test_shape_classes_round_up_to_powers_of_two() -> None:
    assert gemm_table.shape_class(8192, 8192, 8192) == "m8192-n8192-k8192"
    assert gemm_table.shape_class(3000, 2048, 8192) == "m4096-n2048-k8192"
    assert gemm_table.shape_class(1, 40, 48) == "m1024-n1024-k1024"
    with pytest.raises(ValueError):
        gemm_table.shape_class(0, 8, 8)


def test_table_entries_are_tile_fields_of_fitting_configs() -> None:
    assert gemm_table.FAMILY_TABLES  # at least one tuned family
    for family, table in gemm_table.FAMILY_TABLES.items():
        for key, entry in table.items():
            assert set(entry) <= set(gemm_table.TILE_FIELDS), (family, key)
            fields = {**{f: getattr(GPU_CONFIG, f) for f in gemm_table.TILE_FIELDS}, **entry}
            assert bench_gemm.smem_bytes(fields) <= bench_gemm.SMEM_LIMIT, (family, key)


@pytest.mark.parametrize("name,family", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100"),
                                         ("NVIDIA H200", "h200"), ("NVIDIA H800", "h100"), ("NVIDIA GH200 480GB", None),
                                         ("NVIDIA A100-SXM4-80GB", None), ("AMD Instinct MI300X", None)])
def test_device_family_from_the_gpu_name(name: str, family: str | None) -> None:
    assert gemm_table.device_family(name) == family


def test_config_for_shape_uses_the_table_on_a_gpu_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = {"m4096-n2048-k8192": {"block_m": 128, "block_n": 128, "num_stages": 4, "flatten": False}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(gemm_table.TABLE_ENV, str(path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    cuda = torch.device("cuda")
    cfg = config_for_shape(3000, 2048, 8192, cuda)
    assert (cfg.block_m, cfg.block_n, cfg.num_stages, cfg.flatten) == (128, 128, 4, False)
    assert cfg.transport == GPU_CONFIG.transport and cfg.block_k == GPU_CONFIG.block_k
    assert config_for_shape(8192, 8192, 8192, cuda) == GPU_CONFIG  # not in this table: the default
    assert config_for_shape(3000, 2048, 8192, torch.device("cpu")) == CPU_CONFIG
    path.write_text(json.dumps({"m1024-n1024-k1024": {"block_mm": 1}}))
    with pytest.raises(ValueError, match="unknown fields"):
        config_for_shape(1, 1, 1, cuda)


def test_table_candidate_set_is_the_committed_entries_and_the_spinning_wait_at_ag_shapes() -> None:
    """``--candidate-set table`` (a new GPU of a known architecture): every distinct committed entry
    once, and at a shape whose impl waits on flags the family's own entry with ``wait_vote`` off,
    so the tuning times the voting wait against the spin it replaced."""
    distinct = []
    for table in gemm_table.FAMILY_TABLES.values():
        for entry in table.values():
            if entry not in distinct:
                distinct.append(entry)
    own = gemm_table.FAMILY_TABLES["h100"]["m1024-n8192-k2048"]
    ag = bench_gemm.candidates(1024, 8192, 2048, "taxmodel_wait", "h100", "table")
    assert ag[:-1] == distinct and ag[-1] == {**own, "wait_vote": False, "wait_horizon": False}
    assert bench_gemm.candidates(1024, 8192, 2048, "taxmodel_rs", "h100", "table") == distinct
    assert bench_gemm.candidates(1024, 8192, 2048, "taxmodel_wait", None, "table") == distinct
    assert bench_gemm.candidates(1024, 8192, 2048, "taxmodel_wait", "h100", "all") == bench_gemm.CANDIDATES
    assert all(set(c) <= set(gemm_table.TILE_FIELDS) for c in ag)
