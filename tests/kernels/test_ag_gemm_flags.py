"""The fine-grained variants' flag protocol: every output tile computed exactly once per iteration,
never before the flag of its A block holds this iteration's value (epoch or piece count), for both
transports (copy engine, copy kernel) of push and pull, and a missing peer becomes a RunError."""
from __future__ import annotations

import os
import time
from dataclasses import replace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from taxmodel.errors import RunError
from taxmodel.kernels.device.sync import check_errors
from taxmodel.kernels.ag_gemm import gemm_tiles
from taxmodel.kernels.ag_gemm.transport import wait_target
from taxmodel.kernels.ag_gemm.workload import AgGemm
from taxmodel.runtime.context import RankContext, run_in_threads
from taxmodel.workload import get_workload

pytestmark = pytest.mark.skipif(type(gemm_tiles.ag_gemm_kernel).__name__ != "InterpretedFunction",
                                reason="kernels were imported without TRITON_INTERPRET=1")

SHAPE = {**AgGemm.presets["tiny"], "M": 72, "seed": 5}  # M_loc 24 at 3 ranks: a partial block per slab


def _protocol_run(variant: str, transport: str, world: int, delay_rank: int | None, delay_s: float, iterations: int,
                  **cfg):
    wl = AgGemm(replace(gemm_tiles.CPU_CONFIG, transport=transport, **cfg))
    target = wait_target  # push and pull: the same flag protocol

    def body(ctx: RankContext):
        v = wl.variants()[variant]
        state = wl.setup(ctx, SHAPE, v)
        state.enable_debug_counters()
        ref = wl.reference(ctx, SHAPE, state)
        seen, targets = [], []
        for it in range(iterations):
            state.poison()
            state.seen.fill_(-1)
            if ctx.rank == delay_rank:
                time.sleep(delay_s)  # the peers' GEMMs reach this rank's blocks long before they arrive
            v.run(state)
            check_errors(state.err, variant, ctx)
            torch.testing.assert_close(state.c.float(), ref, rtol=1e-4, atol=1e-4)
            seen.append(state.seen.clone())
            targets.append(target(state.cfg, state.k, it + 1))
            ctx.barrier()
        return state.count.clone(), seen, targets

    return run_in_threads(world, body, heap_bytes=1 << 20, timeout_s=300, spin_timeout_s=60)


def test_flags_per_block_follow_the_transport() -> None:
    ce = replace(gemm_tiles.CPU_CONFIG, transport="ce")
    sm = replace(gemm_tiles.CPU_CONFIG, transport="sm", push_chunk_k=32)  # block_k 16
    assert gemm_tiles.k_pieces(ce, 40) == 1  # copy engines flag whole blocks
    assert gemm_tiles.k_pieces(sm, 40) == 2 and gemm_tiles.piece_cols(sm, 40) == 32
    assert gemm_tiles.k_pieces(sm, 5) == 1 and gemm_tiles.piece_cols(sm, 5) == 16
    assert [wait_target(sm, 40, e) for e in range(1, 4)] == [1, 2, 3]  # flags hold the epoch
    with pytest.raises(ValueError, match="multiple of block_k"):
        gemm_tiles.piece_cols(replace(sm, push_chunk_k=24), 40)


@pytest.mark.parametrize("variant,transport,cfg", [
    ("push", "ce", {}), ("push", "sm", {}), ("pull", "ce", {}), ("pull", "sm", {}),
    # The ready horizon (one flag per block: the copy engines) rescanning two flags at a time past a
    # late peer's blocks, and the per-tile wait it replaced.
    ("push", "ce", {"horizon_scan": 2}), ("pull", "ce", {"wait_horizon": False})])
def test_each_tile_once_and_only_after_its_flag_with_a_late_peer(variant: str, transport: str, cfg: dict) -> None:
    iterations = 2
    results = _protocol_run(variant, transport, 3, delay_rank=1, delay_s=1.0, iterations=iterations, **cfg)
    for count, seen, targets in results:
        assert count.tolist() == [iterations] * count.numel()  # every tile once per iteration
        for s, target in zip(seen, targets):
            # The flag each tile saw before reading A already held this iteration's value.
            assert s.min().item() >= target


def test_missing_peer_is_a_run_error_naming_rank_kernel_and_flag() -> None:
    wl = get_workload("ag_gemm")

    def body(ctx: RankContext) -> None:
        v = wl.variants()["push"]
        state = wl.setup(ctx, SHAPE, v)
        if ctx.rank == 0:  # rank 1 never runs: its blocks never arrive
            v.run(state)
            check_errors(state.err, {0: "ag_gemm_kernel"}, ctx)

    with pytest.raises(RunError, match=r"rank 0: kernel ag_gemm_kernel gave up waiting on flag \d+ from rank 1"):
        run_in_threads(2, body, heap_bytes=1 << 20, timeout_s=120, spin_timeout_s=0.3)
