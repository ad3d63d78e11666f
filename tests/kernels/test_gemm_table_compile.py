"""Every entry of the committed per-shape tile table (``kernels/ag_gemm/gemm_table.py``) compiles for
sm_90 in the mode the fine-grained variants run (``A_WAIT``: flag waits per K piece), with and
without in-kernel records, fits an SM, and keeps the flag wait's acquire and bounded deadline.

Why: the table was tuned with the GEMM alone (``A_LOCAL``, bench_gemm.py); a tile choice that
compiles there could still fail, spill or lose its acquire once the flag waits are compiled in.
Ahead-of-time compilation as in test_ag_gemm_compile.py (tests/kernels/aot.py).
"""
from __future__ import annotations

import pytest

from aot import assert_fits_an_sm, compile_report

SCRIPT = r'''
from taxmodel.kernels.ag_gemm import gemm_tiles as gt, gemm_table

PATTERNS = {"globaltimer": r"%globaltimer", "tma_loads": r"cp\.async\.bulk\.tensor", "wgmma": r"wgmma\.mma_async",
            "acquire": r"(ld|atom)\.global[\w.]*\.acquire"}
M_LOC, N, K, PIECES = 256, 2048, 8192, 4

def args(bm, bn, bk, tma_store, epi):
    c_desc = f"tensordesc<bf16[{bm}, {bn // epi}]>" if tma_store else "none"
    return [("a_ptr", "*bf16", 0), ("b_ptr", "*bf16", 0), ("c_ptr", "*bf16", 0), ("a_desc", f"tensordesc<bf16[{bm}, {bk}]>", 0),
            ("b_desc", f"tensordesc<bf16[{bk}, {bn}]>", 0), ("c_desc", c_desc, 0), ("flags_ptr", "*i32", 0),
            ("heap_bases", "*i64", 0), ("err_ptr", "*i64", 0), ("count_ptr", "*i64", 0), ("seen_ptr", "*i64", 0),
            ("epoch_ptr", "*i32", 0), ("rec_ptr", "*i64", 0), ("M_loc", "i32", M_LOC), ("N", "i32", N), ("K", "i32", K),
            ("stride_am", "i32", K), ("stride_ak", "i32", 1), ("stride_bk", "i32", N), ("stride_bn", "i32", 1),
            ("stride_cm", "i32", N), ("stride_cn", "i32", 1), ("parity_rows", "i32", 1024),
            ("flag_parity_stride", "i32", 32), ("rank", "i32", 3), ("budget", "i64", 30_000_000_001),
            ("kernel_id", "i32", 0)]

report = {}
entries = [e for table in gemm_table.FAMILY_TABLES.values() for e in table.values()]
for entry in entries:
    cfg = gt.replace(gt.GPU_CONFIG, **entry)
    tag = cfg.tile_label()
    if tag in report:
        continue
    epi = cfg.epi_split if cfg.tma_store else 1
    # As the variants launch it: K pieces (the SM copy transport) never flattened, with and without
    # records; one piece (the copy engines) flattened as the entry says; the push variant's double
    # buffer (DOUBLE_BUFFER: a superset of the single buffer's code).
    for inst, pieces in ((False, PIECES), (True, PIECES), (False, 1)):
        flat = cfg.flatten and gt.flatten_ok(pieces, inst, True)
        consts = dict(WORLD=4, A_MODE=gt.A_WAIT, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                      GROUP_M=cfg.group_m, NUM_PROGS=132, NUM_STAGES=cfg.num_stages, USE_TMA=True, SYNC_MODE=1,
                      COUNT=False, TMA_STORE=cfg.tma_store, EPI_SPLIT=epi, K_PIECES=pieces,
                      KT_PER_PIECE=K // pieces // cfg.block_k, INSTRUMENT=inst, FLATTEN=flat,
                      WAIT_VOTE=cfg.wait_vote, WAIT_HORIZON=cfg.wait_horizon, HORIZON_SCAN=cfg.horizon_scan,
                      DOUBLE_BUFFER=True, FLAG_CHUNK=1, ORDER_CHUNK=1)
        name = tag + ("-inst" if inst else "") + ("-p1" if pieces == 1 else "")
        report[name] = build(gt.ag_gemm_kernel, args(cfg.block_m, cfg.block_n, cfg.block_k, cfg.tma_store, epi),
                             consts, cfg.num_warps, cfg.num_stages, name.replace("x", "_"))
print(json.dumps(report))
'''


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return compile_report(SCRIPT, tmp_path_factory)


@pytest.mark.slow
def test_every_table_entry_compiles_fits_and_keeps_its_flag_wait(report):
    from dataclasses import replace

    from taxmodel.kernels.ag_gemm import gemm_table
    from taxmodel.kernels.ag_gemm.gemm_tiles import GPU_CONFIG

    entries = [e for table in gemm_table.FAMILY_TABLES.values() for e in table.values()]
    labels = {replace(GPU_CONFIG, **e).tile_label() for e in entries}
    assert entries and set(report) == labels | {f"{t}-inst" for t in labels} | {f"{t}-p1" for t in labels}
    for name, r in report.items():
        assert_fits_an_sm(report, name)
        assert r["tma_loads"] > 0 and r["wgmma"] > 0, (name, r)
        assert r["acquire"] >= 1 and r["globaltimer"] >= 1, (name, r)
