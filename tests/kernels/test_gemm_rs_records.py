"""In-kernel trace records of the fused GEMM + Reduce-Scatter kernels (kernels/device/trace.py) on two
thread ranks in Triton's interpreter: the GEMM records ``compute`` per tile and ``store_push`` per
tile pushed to the peer, the reduction ``flag_wait`` and ``combine`` per own output tile; every
CTA's records are chained and non-overlapping, nothing is dropped, and outputs stay right."""
from __future__ import annotations

import os
from dataclasses import replace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pandas as pd
import pytest

from taxmodel.kernels.device import trace
from taxmodel.kernels.device.sync import check_errors
from taxmodel.kernels.gemm_rs import tiles
from taxmodel.kernels.gemm_rs.state import CPU_RS_CONFIG, FUSED_GEMM_KERNEL, FUSED_REDUCE_KERNEL
from taxmodel.kernels.gemm_rs.workload import GemmRs
from taxmodel.runtime.context import RankContext, run_in_threads

pytestmark = pytest.mark.skipif(type(tiles.gemm_rs_kernel).__name__ != "InterpretedFunction",
                                reason="kernels were imported without TRITON_INTERPRET=1")

SHAPE = {"M": 72, "N": 40, "K": 36, "seed": 2}  # 2 ranks: 36 rows each = 3 blocks of 16 (one partial) x 3 N-tiles
WORLD, ITERATIONS = 2, 2
OWN_TILES = 3 * 3


def _instrumented_run(reduce: str) -> list[tuple[pd.DataFrame, dict, float]]:
    wl = GemmRs(replace(CPU_RS_CONFIG, reduce=reduce))

    def body(ctx: RankContext):
        ctx.instrument = True
        v = wl.variants()["fused"]
        state = wl.setup(ctx, SHAPE, v)
        ref = wl.reference(ctx, SHAPE, state)
        book = ctx.records
        book.arm(ITERATIONS)
        err = 0.0
        for it in range(ITERATIONS):
            book.set_iteration(it)
            state.poison()
            v.run(state)
            check_errors(state.err, tiles.KERNEL_NAMES, ctx)
            err = max(err, float((state.out.float() - ref).abs().max()))
            ctx.barrier()
        return book.drain(ctx.rank), dict(book.dropped), err

    return run_in_threads(WORLD, body, heap_bytes=1 << 20, timeout_s=300, spin_timeout_s=60)


def _check_chained(rec: pd.DataFrame) -> None:
    """Per (kernel, CTA): every record has a non-negative length and none overlaps the next."""
    assert (rec["end_ns"] >= rec["start_ns"]).all()
    for _, g in rec.groupby(["name", "cta"]):
        g = g.sort_values("start_ns", kind="stable")
        assert (g["start_ns"].to_numpy()[1:] >= g["end_ns"].to_numpy()[:-1]).all()


def test_record_layouts_hold_two_records_per_tile_per_program() -> None:
    cfg = CPU_RS_CONFIG.gemm
    tiles_total = WORLD * OWN_TILES
    programs = cfg.num_progs  # the CPU config's persistent grid (fewer programs than tiles)
    assert tiles.own_tiles(36, 40, cfg) == OWN_TILES and 1 < programs < tiles_total
    per_program = 2 * -(-tiles_total // programs)
    assert tiles.gemm_record_layout(36, 40, WORLD, cfg, False, "cpu") == trace.RecordLayout(programs, per_program)
    # the tail reduction runs on one program under the interpreter: every tile and every own tile
    assert tiles.gemm_record_layout(36, 40, WORLD, cfg, True, "cpu") == trace.RecordLayout(1, 2 * tiles_total
                                                                                           + 2 * OWN_TILES)
    assert tiles.reduce_record_layout(36, 40, cfg) == trace.RecordLayout(OWN_TILES, 2)
    assert tiles.records_per_iteration(36, 40, WORLD, cfg) == 2 * (WORLD + 1) * OWN_TILES


def test_reduce_kernel_records_phases_per_tile() -> None:
    for rank, (rec, dropped, err) in enumerate(_instrumented_run("kernel")):
        assert dropped == {} and err < 1e-4
        assert set(rec["rank"]) == {rank}
        assert sorted(rec["iteration"].unique().tolist()) == list(range(ITERATIONS))
        for _, g in rec.groupby("iteration"):
            _check_chained(g)
            gemm, red = g[g["name"] == FUSED_GEMM_KERNEL], g[g["name"] == FUSED_REDUCE_KERNEL]
            assert len(gemm) + len(red) == len(g)
            # The GEMM: compute for every tile (plus the own tiles' epilogue), a push for every peer tile.
            assert gemm["phase"].value_counts().to_dict() == {"compute": WORLD * OWN_TILES + OWN_TILES,
                                                              "store_push": (WORLD - 1) * OWN_TILES}
            assert gemm["cta"].between(0, CPU_RS_CONFIG.gemm.num_progs - 1).all()
            # The reduction: one program per own tile, each waits then combines, in that order.
            assert red["phase"].value_counts().to_dict() == {"flag_wait": OWN_TILES, "combine": OWN_TILES}
            for cta, c in red.sort_values("start_ns", kind="stable").groupby("cta"):
                assert c["phase"].tolist() == ["flag_wait", "combine"]
                assert c["start_ns"].iloc[1] == c["end_ns"].iloc[0]  # chained
            assert sorted(red["cta"].unique().tolist()) == list(range(OWN_TILES))
            # The reduction starts after the same rank's GEMM ended (stream order).
            assert red["start_ns"].min() >= gemm["end_ns"].max()


def test_tail_reduction_records_in_the_gemm_kernel() -> None:
    for rec, dropped, err in _instrumented_run("tail"):
        assert dropped == {} and err < 1e-4
        assert set(rec["name"]) == {FUSED_GEMM_KERNEL}  # no second kernel, no second buffer
        for _, g in rec.groupby("iteration"):
            _check_chained(g)
            assert g["phase"].value_counts().to_dict() == {
                "compute": WORLD * OWN_TILES + OWN_TILES, "store_push": (WORLD - 1) * OWN_TILES,
                "flag_wait": OWN_TILES, "combine": OWN_TILES}
            assert set(g["cta"]) == {0}  # one program under the interpreter (tiles.gemm_programs)
            g = g.sort_values("start_ns", kind="stable")
            # chained end to start over the program's whole life: phases sum to its lifetime
            assert (g["start_ns"].to_numpy()[1:] == g["end_ns"].to_numpy()[:-1]).all()
            # every tile is computed (and pushed) before the first wait
            first_wait = g.index[g["phase"] == "flag_wait"][0]
            assert set(g.loc[:first_wait, "phase"].iloc[:-1]) <= {"compute", "store_push"}


def test_uninstrumented_run_allocates_no_record_buffers() -> None:
    wl = GemmRs(CPU_RS_CONFIG)

    def body(ctx: RankContext):
        state = wl.setup(ctx, SHAPE, wl.variants()["fused"])
        wl.variants()["fused"].run(state)
        check_errors(state.err, tiles.KERNEL_NAMES, ctx)
        return state.rec_gemm, state.rec_reduce, ctx.records

    for rec_gemm, rec_reduce, book in run_in_threads(WORLD, body, heap_bytes=1 << 20, timeout_s=300):
        assert rec_gemm is None and rec_reduce is None and book is None
