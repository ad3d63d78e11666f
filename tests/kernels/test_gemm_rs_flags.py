"""The fused GEMM + Reduce-Scatter flag protocol on thread ranks (Triton's interpreter): every
source's tile lands in its owner's slot, every own output tile is reduced exactly once per
iteration and only after the flags of all its contributions hold this iteration's epoch (with a
late peer), for both reduction placements; a missing peer becomes a RunError naming it."""
from __future__ import annotations

import os
import time
from dataclasses import replace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from taxmodel.errors import RunError
from taxmodel.kernels.device.sync import check_errors
from taxmodel.kernels.gemm_rs import tiles
from taxmodel.kernels.gemm_rs.state import CPU_RS_CONFIG, make_a_shard, make_b_shard
from taxmodel.kernels.gemm_rs.workload import GemmRs
from taxmodel.runtime.context import RankContext, run_in_threads

pytestmark = pytest.mark.skipif(type(tiles.gemm_rs_kernel).__name__ != "InterpretedFunction",
                                reason="kernels were imported without TRITON_INTERPRET=1")

SHAPE = {"M": 72, "N": 40, "K": 36, "seed": 5}  # 3 ranks: M/world 24 (a partial block), N 40, K/world 12


def _protocol_run(reduce: str, world: int, delay_rank: int | None, iterations: int):
    wl = GemmRs(replace(CPU_RS_CONFIG, reduce=reduce))

    def body(ctx: RankContext):
        v = wl.variants()["fused"]
        state = wl.setup(ctx, SHAPE, v)
        state.enable_debug_counters()
        ref = wl.reference(ctx, SHAPE, state)
        seen = []
        for _ in range(iterations):
            state.poison()
            state.seen.fill_(-1)
            if ctx.rank == delay_rank:
                time.sleep(1.0)  # the peers' reductions reach this rank's contributions long before they exist
            v.run(state)
            check_errors(state.err, tiles.KERNEL_NAMES, ctx)
            torch.testing.assert_close(state.out.float(), ref, rtol=1e-4, atol=1e-4)
            seen.append(state.seen.clone())
            ctx.barrier()
        return state.count.clone(), seen, state.flags.clone(), state.recv.clone(), state.m_loc

    return run_in_threads(world, body, heap_bytes=1 << 20, timeout_s=300, spin_timeout_s=60)


@pytest.mark.parametrize("reduce", ["kernel", "tail"])
def test_each_tile_reduced_once_and_only_after_all_flags_with_a_late_peer(reduce: str) -> None:
    iterations, world = 2, 3
    results = _protocol_run(reduce, world, delay_rank=1, iterations=iterations)
    n_tiles = tiles.own_tiles(24, 40, CPU_RS_CONFIG.gemm)
    assert n_tiles == 2 * 3  # two 16-row blocks (one partial) x three 16-column tiles (one partial)
    for count, seen, flags, _, _ in results:
        assert count.tolist() == [iterations] * n_tiles  # every own tile reduced once per iteration
        for epoch, s in enumerate(seen, start=1):
            # The least flag a tile's reduction saw before reading any slot: this iteration's epoch
            # (a peer may already be one epoch ahead, never behind).
            assert s.min().item() >= epoch
            assert s.max().item() <= epoch + 1
        assert flags.shape == (tiles.flag_rows(24, 40, CPU_RS_CONFIG.gemm), world) == (n_tiles + 1, world)
        assert flags[:n_tiles].tolist() == [[iterations] * world] * n_tiles  # every source signalled every tile


def test_every_source_lands_its_partial_rows_in_the_owners_slot() -> None:
    world, iterations = 3, 1
    results = _protocol_run("kernel", world, delay_rank=None, iterations=iterations)
    cpu = torch.device("cpu")
    m, k_loc = SHAPE["M"], SHAPE["K"] // world
    for owner, (_, _, _, recv, m_loc) in enumerate(results):
        slots = recv[iterations % 2]  # this epoch's half of the receive buffer
        rows = slice(owner * m_loc, (owner + 1) * m_loc)
        for src in range(world):
            a = make_a_shard(5, src, m, k_loc, torch.float32, cpu)
            b = make_b_shard(5, src, k_loc, SHAPE["N"], SHAPE["K"], torch.float32, cpu)
            # a slot's rows are padded to 16 elements (tiles.slot_row_stride): N=40 in rows of 48
            assert slots.shape[-1] == tiles.slot_row_stride(SHAPE["N"]) == 48
            torch.testing.assert_close(slots[src][:, :SHAPE["N"]], (a @ b)[rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduce,kernel", [("kernel", "rs_reduce_kernel"), ("tail", "gemm_rs_kernel")])
def test_missing_peer_is_a_run_error_naming_rank_kernel_and_flag(reduce: str, kernel: str) -> None:
    wl = GemmRs(replace(CPU_RS_CONFIG, reduce=reduce))

    def body(ctx: RankContext) -> None:
        v = wl.variants()["fused"]
        state = wl.setup(ctx, SHAPE, v)
        if ctx.rank == 0:  # rank 1 never runs: its contributions never arrive
            v.run(state)
            check_errors(state.err, tiles.KERNEL_NAMES, ctx)

    with pytest.raises(RunError, match=rf"rank 0: kernel {kernel} gave up waiting on flag \d+ from rank 1 .*"
                                       r"expected epoch >= 1 and saw 0"):
        run_in_threads(2, body, heap_bytes=1 << 20, timeout_s=120, spin_timeout_s=0.3)
