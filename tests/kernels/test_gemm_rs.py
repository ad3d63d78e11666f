"""GEMM + Reduce-Scatter: shapes, declared cost, tile order, and every CPU variant against an fp32
reference on thread ranks (Triton's interpreter), with the output poisoned before each run."""
from __future__ import annotations

import os
from dataclasses import replace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from taxmodel.errors import InputError
from taxmodel.kernels.device import tile_gemm
from taxmodel.kernels.device.sync import check_errors
from taxmodel.kernels.gemm_rs import tiles
from taxmodel.kernels.gemm_rs.state import CPU_RS_CONFIG, make_a_shard, make_b_shard, shape_dims
from taxmodel.kernels.gemm_rs.workload import GemmRs
from taxmodel.runtime.context import RankContext, run_in_threads
from taxmodel.workload import classify_role, get_workload

interpreted = pytest.mark.skipif(type(tiles.gemm_rs_kernel).__name__ != "InterpretedFunction",
                                 reason="kernels were imported without TRITON_INTERPRET=1")


def run_and_check(world: int, variant: str, shape: dict, iterations: int = 2, reduce: str = "kernel",
                  **config: object) -> list[float]:
    """Max abs error against the fp32 reference of every rank and iteration (NaN-poisoned output)."""
    wl = GemmRs(replace(CPU_RS_CONFIG, reduce=reduce, **config))

    def body(ctx: RankContext) -> list[float]:
        v = wl.variants()[variant]
        state = wl.setup(ctx, shape, v)
        ref = wl.reference(ctx, shape, state)
        assert ref.shape == (state.m_loc, state.n)
        errs = []
        for _ in range(iterations):
            state.poison()
            v.run(state)
            check_errors(state.err, tiles.KERNEL_NAMES, ctx)
            out = wl.output(state)
            assert not torch.isnan(out).any(), "a row of this rank's output was never written"
            errs.append(float((out.float() - ref).abs().max()))
            ctx.barrier()
        return errs

    return [e for errs in run_in_threads(world, body, heap_bytes=1 << 20, timeout_s=300) for e in errs]


def test_registered_presets_and_shape_checks() -> None:
    wl = get_workload("gemm_rs")
    assert isinstance(wl, GemmRs)
    assert set(wl.variants()) == {"bsp", "fused", "torch_fused"}
    assert wl.shape("tiny") == {"M": 120, "N": 40, "K": 60}
    for m in (1024, 4096, 8192):
        assert wl.shape(f"m{m}") == {"M": m, "N": 8192, "K": 8192}
        assert wl.shape(f"m{m}_n4096") == {"M": m, "N": 4096, "K": 4096}
    assert wl.default_preset == "m8192" and wl.cpu_preset == "tiny"
    assert shape_dims(wl.shape("m8192"), 4) == (8192, 2048, 8192, 8192, 2048)
    # The tiny preset has a partial tile in every dimension at every world size 1..4.
    b = CPU_RS_CONFIG.gemm
    for world in (1, 2, 3, 4):
        _, m_loc, n, _, k_loc = shape_dims(wl.shape("tiny"), world)
        assert m_loc % b.block_m and n % b.block_n and k_loc % b.block_k
    with pytest.raises(InputError, match="M=10 must be a multiple of the world size 4"):
        shape_dims({"M": 10, "N": 8, "K": 8}, 4)
    with pytest.raises(InputError, match="K=6 must be a multiple of the world size 4"):
        shape_dims({"M": 8, "N": 8, "K": 6}, 4)


def test_cost_declares_flops_bytes_and_intermediates() -> None:
    wl = get_workload("gemm_rs")
    shape = {"M": 8192, "N": 8192, "K": 8192}
    bsp = wl.cost(shape, 4, "bsp")
    assert bsp.flops == 2 * 8192 * 8192 * 2048
    assert bsp.link_bytes == 3 * 2048 * 8192 * 2  # (world-1)/world of M*N bf16 values
    assert bsp.hbm_bytes == (8192 * 2048 + 2048 * 8192 + 2048 * 8192) * 2
    assert bsp.dtype == "bf16"
    assert [(i.name, i.bytes) for i in bsp.intermediates] == [("partial_C", 8192 * 8192 * 2)]
    fused = wl.cost(shape, 4, "fused")
    assert (fused.flops, fused.hbm_bytes, fused.link_bytes) == (bsp.flops, bsp.hbm_bytes, bsp.link_bytes)
    assert [(i.name, i.bytes) for i in fused.intermediates] == [("received_partials", 4 * 2048 * 8192 * 2)]
    assert (fused.intermediates[0].producer, fused.intermediates[0].consumer) == ("gemm_rs_kernel", "rs_reduce_kernel")
    tail = GemmRs(replace(CPU_RS_CONFIG, reduce="tail")).cost(shape, 4, "fused").intermediates[0]
    assert tail.consumer == "gemm_rs_kernel"  # one kernel both lands and reads the partials
    assert wl.cost(shape, 4, "torch_fused").intermediates[0].bytes == 8192 * 8192 * 2
    one = wl.cost(shape, 1, "fused")
    assert one.link_bytes == 0 and one.flops == 2 * 8192 ** 3
    assert wl.cost({**shape, "dtype": 32}, 2, "bsp").link_bytes == 4096 * 8192 * 4


def test_roles_classify_the_kernels_of_each_variant() -> None:
    v = get_workload("gemm_rs").variants()
    assert classify_role("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", v["bsp"].roles) == "comm"
    assert classify_role("reduce_scatter", v["bsp"].roles) == "comm"
    assert classify_role("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", v["bsp"].roles) == "compute"
    assert classify_role("matmul", v["bsp"].roles) == "compute"
    assert classify_role("gemm_rs_kernel", v["fused"].roles) == "fused"
    assert classify_role("rs_reduce_kernel", v["fused"].roles) == "fused"
    assert classify_role("Memcpy DtoD (Device -> Device)", v["torch_fused"].roles) == "comm"


def test_torch_fused_says_why_it_is_unavailable_on_cpu() -> None:
    ctx = RankContext(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), backend="threads")
    assert "CUDA" in get_workload("gemm_rs").variants()["torch_fused"].available(ctx)


def test_reference_is_the_sum_over_ranks_of_the_shard_products() -> None:
    shape = {"M": 12, "N": 5, "K": 6, "seed": 3}
    full_a = torch.cat([make_a_shard(3, r, 12, 3, torch.float32, torch.device("cpu")) for r in range(2)], dim=1)
    full_b = torch.cat([make_b_shard(3, r, 3, 5, 6, torch.float32, torch.device("cpu")) for r in range(2)], dim=0)
    wl = GemmRs()

    def body(ctx: RankContext) -> torch.Tensor:
        return wl.reference(ctx, shape, wl.setup(ctx, shape, wl.variants()["bsp"]))

    refs = run_in_threads(2, body)
    torch.testing.assert_close(torch.cat(refs), (full_a.double() @ full_b.double()).float(), rtol=1e-5, atol=1e-5)


@triton.jit
def _coords_kernel(out_ptr, rank, blocks_per_rank, n_tiles, WORLD: tl.constexpr, GROUP_M: tl.constexpr):
    t = tl.program_id(0)
    owner, j, pid_n = tile_gemm.tile_coords(t, rank, blocks_per_rank, n_tiles, tile_gemm.ROLE_RS, WORLD, GROUP_M)
    tl.store(out_ptr + 3 * t, owner)
    tl.store(out_ptr + 3 * t + 1, j)
    tl.store(out_ptr + 3 * t + 2, pid_n)


def tile_sequence(rank: int, world: int, bpr: int, n_tiles: int, group_m: int) -> list[tuple[int, int, int]]:
    out = torch.full((world * bpr * n_tiles * 3,), -1, dtype=torch.int32)
    _coords_kernel[(world * bpr * n_tiles,)](out, rank, bpr, n_tiles, WORLD=world, GROUP_M=group_m)
    return [tuple(x) for x in out.view(-1, 3).tolist()]


@interpreted
@pytest.mark.parametrize("world,bpr,n_tiles,group_m", [(1, 3, 2, 2), (3, 2, 3, 1), (4, 3, 2, 2), (4, 2, 1, 8)])
def test_tile_order_peers_first_staggered_own_last(world: int, bpr: int, n_tiles: int, group_m: int) -> None:
    for rank in range(world):
        seq = tile_sequence(rank, world, bpr, n_tiles, group_m)
        # Every tile of the partial product exactly once.
        assert sorted(seq) == sorted((o, j, n) for o in range(world) for j in range(bpr) for n in range(n_tiles))
        owners = [o for o, _, _ in seq]
        n_peer = (world - 1) * bpr * n_tiles
        assert set(owners[:n_peer]) <= set(range(world)) - {rank}  # peers' tiles first
        assert owners[n_peer:] == [rank] * (bpr * n_tiles)  # own tiles last
        if world > 1:
            # Staggered: the first M-blocks go to rank+1, rank+2, ... (every peer gets block 0 early).
            first_blocks = []
            for o, j, _ in seq:
                if (o, j) not in first_blocks:
                    first_blocks.append((o, j))
            assert first_blocks[:world - 1] == [((rank + s) % world, 0) for s in range(1, world)]


@interpreted
@pytest.mark.parametrize("variant,world,reduce", [
    ("bsp", 1, "kernel"), ("bsp", 3, "kernel"),
    ("fused", 1, "kernel"), ("fused", 2, "kernel"), ("fused", 2, "tail"), ("fused", 3, "kernel"),
])
def test_variant_matches_reference(variant: str, world: int, reduce: str) -> None:
    errs = run_and_check(world, variant, {**GemmRs.presets["tiny"], "seed": world}, reduce=reduce)
    assert max(errs) < 1e-4


@interpreted
@pytest.mark.slow
@pytest.mark.parametrize("variant,world,reduce", [("bsp", 4, "kernel"), ("fused", 4, "kernel"), ("fused", 4, "tail")])
def test_variant_matches_reference_four_ranks(variant: str, world: int, reduce: str) -> None:
    errs = run_and_check(world, variant, {**GemmRs.presets["tiny"], "seed": 40}, iterations=1, reduce=reduce)
    assert max(errs) < 1e-4


@interpreted
def test_even_tiles_take_the_vector_hint_path() -> None:
    # N = 32 (a multiple of 16: hinted stores), whole 16x16 tiles, K/world = 32.
    errs = run_and_check(2, "fused", {"M": 64, "N": 32, "K": 64, "seed": 7}, iterations=1)
    assert max(errs) < 1e-4


@interpreted
@settings(max_examples=3, deadline=None)
@given(m_loc=st.integers(1, 40), n=st.integers(1, 40), k_loc=st.integers(1, 24), seed=st.integers(0, 1000),
       reduce=st.sampled_from(["kernel", "tail"]))
def test_fused_odd_shapes(m_loc: int, n: int, k_loc: int, seed: int, reduce: str) -> None:
    errs = run_and_check(2, "fused", {"M": 2 * m_loc, "N": n, "K": 2 * k_loc, "seed": seed}, iterations=1,
                         reduce=reduce)
    assert max(errs) < 1e-4


@interpreted
@pytest.mark.parametrize("world,reduce,spread,lag", [(3, "kernel", False, 1), (2, "tail", False, 1),
                                                     (3, "kernel", True, 2), (2, "tail", True, 9)])
def test_both_tile_orders_and_lags_keep_the_sum_right(world: int, reduce: str, spread: bool, lag: int) -> None:
    # lag 9 is past the blocks a slab has: clamped to the last round (tiles.spread_lag)
    errs = run_and_check(world, "fused", {"M": 96, "N": 40, "K": 36, "seed": 12}, iterations=2, reduce=reduce,
                         spread=spread, lag=lag)
    assert max(errs) < 1e-4


def test_spread_is_the_default_order_and_the_lag_stays_within_a_slab() -> None:
    assert CPU_RS_CONFIG.spread and GemmRs().config is None
    assert "spread1" in CPU_RS_CONFIG.label() and "first" in replace(CPU_RS_CONFIG, spread=False).label()
    cfg = CPU_RS_CONFIG.gemm  # 16-row blocks
    assert tiles.spread_lag(48, cfg, 1) == 1 and tiles.spread_lag(48, cfg, 9) == 3 and tiles.spread_lag(48, cfg, 0) == 1


@triton.jit
def _spread_kernel(out_ptr, rank, blocks_per_rank, n_tiles, lag, WORLD: tl.constexpr, GROUP_M: tl.constexpr):
    t = tl.program_id(0)
    owner, j, pid_n = tile_gemm.rs_spread_coords(t, rank, blocks_per_rank, n_tiles, lag, WORLD, GROUP_M)
    tl.store(out_ptr + 3 * t, owner)
    tl.store(out_ptr + 3 * t + 1, j)
    tl.store(out_ptr + 3 * t + 2, pid_n)


def spread_sequence(rank: int, world: int, bpr: int, n_tiles: int, lag: int, group_m: int) -> list[tuple[int, int, int]]:
    out = torch.full((world * bpr * n_tiles * 3,), -1, dtype=torch.int32)
    _spread_kernel[(world * bpr * n_tiles,)](out, rank, bpr, n_tiles, lag, WORLD=world, GROUP_M=group_m)
    return [tuple(x) for x in out.view(-1, 3).tolist()]


def grouped_rows(rows: list[tuple[int, int]], n_tiles: int, group_m: int) -> list[tuple[int, int, int]]:
    """Tiles of ``rows`` (slab, block) taken group_m rows at a time, every N-tile of a group (rows fastest)."""
    return [(*row, n) for g in range(0, len(rows), group_m) for n in range(n_tiles) for row in rows[g:g + group_m]]


@interpreted
@pytest.mark.parametrize("world,bpr,n_tiles,lag,group_m", [(1, 3, 2, 1, 2), (2, 3, 2, 1, 1), (3, 4, 3, 2, 4),
                                                            (4, 3, 2, 3, 2), (4, 5, 1, 1, 8), (4, 6, 3, 1, 8)])
def test_spread_order_rounds_one_block_of_every_peer_then_the_lagged_own_block(world: int, bpr: int, n_tiles: int,
                                                                               lag: int, group_m: int) -> None:
    every = sorted((o, j, n) for o in range(world) for j in range(bpr) for n in range(n_tiles))
    for rank in range(world):
        seq = spread_sequence(rank, world, bpr, n_tiles, lag, group_m)
        assert sorted(seq) == every  # every tile of the partial product exactly once
        if world == 1:
            assert seq == grouped_rows([(0, j) for j in range(bpr)], n_tiles, group_m)  # the plain grouped order
            continue
        peers = [(rank + s) % world for s in range(1, world)]
        # the rounds written out as rows: a head of lag rounds of peers, then W rows a round (the
        # peers' block i, the own block i - lag), then the last lag own blocks; each part grouped
        head = [(p, i) for i in range(lag) for p in peers]
        middle = [row for i in range(lag, bpr) for row in [(p, i) for p in peers] + [(rank, i - lag)]]
        tail = [(rank, j) for j in range(bpr - lag, bpr)]
        assert seq == (grouped_rows(head, n_tiles, group_m) + grouped_rows(middle, n_tiles, group_m)
                       + grouped_rows(tail, n_tiles, group_m))
        # the pushes spread: after the lag, every whole group of W rows holds one own row
        owners = [o for o, _, _ in seq]
        assert owners[:lag * (world - 1) * n_tiles].count(rank) == 0
        assert owners.count(rank) == bpr * n_tiles
