"""All-Gather + GEMM: every CPU variant against an fp32 reference, on thread ranks (interpreter)."""
from __future__ import annotations

import os
from dataclasses import replace
from types import SimpleNamespace

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
from taxmodel.kernels.ag_gemm import gemm_tiles
from taxmodel.kernels.ag_gemm.state import shape_dims
from taxmodel.kernels.ag_gemm.transport import ce_transfer_blocks
from taxmodel.kernels.ag_gemm.workload import AgGemm
from taxmodel.runtime.context import RankContext, run_in_threads
from taxmodel.workload import get_workload

interpreted = pytest.mark.skipif(type(gemm_tiles.ag_gemm_kernel).__name__ != "InterpretedFunction",
                                 reason="kernels were imported without TRITON_INTERPRET=1")


def run_and_check(world: int, variant: str, shape: dict, iterations: int = 2, transport: str = "ce",
                  ce_copy_bytes: int | None = 0, ce_order: str = "round") -> list[float]:
    wl = AgGemm(replace(gemm_tiles.CPU_CONFIG, transport=transport, ce_copy_bytes=ce_copy_bytes, ce_order=ce_order))

    def body(ctx: RankContext) -> list[float]:
        v = wl.variants()[variant]
        state = wl.setup(ctx, shape, v)
        ref = wl.reference(ctx, shape, state)
        errs = []
        for _ in range(iterations):
            state.poison()
            v.run(state)
            check_errors(state.err, variant, ctx)
            out = wl.output(state)
            assert not torch.isnan(out).any(), "a tile was never written"
            errs.append(float((out.float() - ref).abs().max()))
            ctx.barrier()
        return errs

    return [e for errs in run_in_threads(world, body, heap_bytes=1 << 20, timeout_s=300) for e in errs]


def test_registered_and_presets() -> None:
    wl = get_workload("ag_gemm")
    assert isinstance(wl, AgGemm)
    assert set(wl.variants()) == {"bsp", "pull", "push", "torch_fused"}
    assert wl.shape("tiny") == {"M": 96, "N": 40, "K": 40, "tp": 0}
    for m in (1024, 4096, 8192, 16384):
        assert wl.shape(f"m{m}") == {"M": m, "N": 8192, "K": 8192, "tp": 0}
        assert wl.shape(f"m{m}_n4096")["K"] == 4096
    assert shape_dims(wl.shape("m8192_tp"), 4) == (8192, 2048, 2048, 8192)
    with pytest.raises(InputError, match="multiple of the world size"):
        shape_dims({"M": 10, "N": 8, "K": 8}, 4)


def test_cost_declares_flops_bytes_and_intermediates() -> None:
    wl = get_workload("ag_gemm")
    shape = {"M": 8192, "N": 8192, "K": 8192, "tp": 0}
    bsp = wl.cost(shape, 4, "bsp")
    assert bsp.flops == 2 * 8192 ** 3
    assert bsp.link_bytes == 3 * 2048 * 8192 * 2
    assert bsp.hbm_bytes == (2048 * 8192 + 8192 * 8192 + 8192 * 8192) * 2
    assert [(i.name, i.bytes) for i in bsp.intermediates] == [("gathered_A", 8192 * 8192 * 2)]
    staged = wl.cost(shape, 4, "pull").intermediates  # default transport: copy-engine staging
    assert [(i.name, i.bytes) for i in staged] == [("staged_A", 3 * 2048 * 8192 * 2)]
    direct = AgGemm(replace(gemm_tiles.GPU_CONFIG, transport="direct"))
    assert direct.cost(shape, 4, "pull").intermediates == ()
    assert wl.cost(shape, 4, "push").intermediates[0].bytes == 3 * 2048 * 8192 * 2
    tp = wl.cost({**shape, "tp": 1}, 4, "bsp")
    assert tp.flops == 2 * 8192 * 2048 * 8192
    assert wl.cost(shape, 1, "push").link_bytes == 0


def test_torch_fused_says_why_it_is_unavailable_on_cpu() -> None:
    ctx = RankContext(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), backend="threads")
    assert "CUDA" in get_workload("ag_gemm").variants()["torch_fused"].available(ctx)


@interpreted
@pytest.mark.parametrize("variant,world,transport", [
    ("bsp", 1, "ce"), ("bsp", 3, "ce"),
    ("pull", 1, "ce"), ("pull", 2, "ce"), ("pull", 2, "sm"), ("pull", 2, "direct"),
    ("push", 1, "ce"), ("push", 2, "ce"), ("push", 2, "sm"),
])
def test_variant_matches_reference(variant: str, world: int, transport: str) -> None:
    errs = run_and_check(world, variant, {**AgGemm.presets["tiny"], "seed": world}, transport=transport)
    assert max(errs) < 1e-4


@interpreted
@pytest.mark.parametrize("variant,world,m_loc,blocks_per_copy,order", [
    ("pull", 2, 96, 4, "round"), ("push", 2, 96, 4, "round"), ("pull", 2, 48, 2, "round"), ("push", 2, 40, 5, "round"),
    ("pull", 3, 96, 4, "round"), ("push", 3, 40, 2, "round"), ("pull", 3, 48, 1, "round"), ("pull", 3, 40, 2, "step"),
    ("pull", 4, 32, 1, "step")])
def test_copy_engines_in_copies_of_several_blocks(variant: str, world: int, m_loc: int, blocks_per_copy: int,
                                                  order: str) -> None:
    # 16-row blocks of K=40 fp32 (2560 bytes): copies of 4 blocks over 6 (the last copy 2 blocks), of 2
    # over 3, of every block at once (40 rows: 3 blocks, the last partial), and one block a copy. The
    # GEMM waits on the flag of each copy's last block for all of its blocks: a wrong row offset gives a
    # wrong product, a wrong flag a wait that never ends. On 3 ranks the GEMM takes the peers' blocks
    # copy by copy (``tile_gemm.peer_block``'s order for copies of several blocks): a position that maps
    # to no block, or to one twice, leaves a tile unwritten (NaN) or wrong. With ``ce_order`` "step" the
    # pulls go peer by peer and the GEMM takes whole slabs in turn (``peer_block`` with the slab as chunk).
    block_bytes = gemm_tiles.CPU_CONFIG.block_m * 40 * 4
    cfg = replace(gemm_tiles.CPU_CONFIG, transport="ce", ce_copy_bytes=blocks_per_copy * block_bytes)
    assert gemm_tiles.ce_blocks_per_copy(cfg, m_loc, 40, 40, 4, world, 3) == min(blocks_per_copy, -(-m_loc // 16))
    errs = run_and_check(world, variant, {"M": world * m_loc, "N": 40, "K": 40, "tp": 0, "seed": m_loc},
                         ce_copy_bytes=blocks_per_copy * block_bytes, ce_order=order)
    assert max(errs) < 1e-4


def test_blocks_per_copy_is_whole_blocks_within_the_slab() -> None:
    cfg = replace(gemm_tiles.GPU_CONFIG, transport="ce")
    # the default: a slab in max(world, 4) copies (2 MiB blocks of 128 x 8192 bf16)
    assert cfg.ce_copy_bytes is None
    assert gemm_tiles.ce_blocks_per_copy(cfg, 8192, 8192, 8192, 2, 2, 132) == 16  # 64 blocks in 4 copies of 32 MiB
    assert gemm_tiles.ce_blocks_per_copy(cfg, 4096, 8192, 8192, 2, 4, 132) == 8
    assert gemm_tiles.ce_blocks_per_copy(cfg, 2048, 8192, 8192, 2, 8, 132) == 2  # 8 copies on 8 ranks
    assert gemm_tiles.ce_blocks_per_copy(cfg, 256, 8192, 8192, 2, 4, 132) == 1  # a slab of 2 blocks: one per copy
    sized = replace(cfg, ce_copy_bytes=16 << 20)
    assert gemm_tiles.ce_blocks_per_copy(sized, 8192, 8192, 8192, 2, 2, 132) == 8
    assert gemm_tiles.ce_blocks_per_copy(sized, 256, 8192, 8192, 2, 2, 132) == 2  # never more than the slab's blocks
    assert gemm_tiles.ce_blocks_per_copy(replace(cfg, ce_copy_bytes=1 << 20), 8192, 8192, 8192, 2, 2, 132) == 1  # at least one
    assert gemm_tiles.ce_blocks_per_copy(replace(cfg, ce_copy_bytes=0), 8192, 8192, 8192, 2, 2, 132) == 1  # 0: one per copy
    assert gemm_tiles.ce_blocks_per_copy(replace(sized, transport="sm"), 8192, 8192, 8192, 2, 2, 132) == 1  # flags per K piece
    assert [replace(cfg, ce_copy_bytes=b).label()[-9:] for b in (None, 0, 8 << 20)] == ["fl-ce-mem", "ce-mem-1b",
                                                                                        "ce-mem-8m"]
    # pulls peer by peer (N per rank <= CE_STEP_MAX_N): one wave's blocks a copy (132 programs, 8 N-tiles a block:
    # 16 blocks), at most the slab
    assert gemm_tiles.ce_blocks_per_copy(cfg, 4096, 2048, 8192, 2, 4, 132) == 16  # m16384_tp: 2 copies of 32 MiB
    assert gemm_tiles.ce_blocks_per_copy(cfg, 2048, 2048, 8192, 2, 4, 132) == 16  # m8192_tp: the slab in one copy
    assert gemm_tiles.ce_blocks_per_copy(cfg, 1024, 2048, 8192, 2, 4, 132) == 8   # m4096_tp: the slab (8 blocks)
    assert gemm_tiles.ce_blocks_per_copy(cfg, 4096, 4096, 4096, 2, 4, 132) == 8   # 16 N-tiles a block
    assert gemm_tiles.ce_blocks_per_copy(cfg, 4096, 2048, 8192, 2, 4, 4) == 1     # a wave narrower than a block


@interpreted
@pytest.mark.parametrize("variant,transport", [("pull", "sm"), ("push", "sm"), ("push", "ce")])
def test_even_blocks_take_the_unmasked_vector_path(variant: str, transport: str) -> None:
    # M_loc 32 (two whole 16-row blocks), K 64 (two whole 32-column pieces): the kernel's EVEN path.
    errs = run_and_check(2, variant, {"M": 64, "N": 40, "K": 64, "tp": 0, "seed": 3}, transport=transport)
    assert max(errs) < 1e-4


@interpreted
@pytest.mark.slow
@pytest.mark.parametrize("variant,world,transport", [("pull", 3, "ce"), ("push", 3, "sm"), ("pull", 4, "sm"),
                                                     ("push", 4, "ce")])
def test_variant_matches_reference_more_ranks(variant: str, world: int, transport: str) -> None:
    errs = run_and_check(world, variant, {**AgGemm.presets["tiny_tp"], "seed": 10 + world}, iterations=1,
                         transport=transport)
    assert max(errs) < 1e-4


@interpreted
@settings(max_examples=3, deadline=None)
@given(m_loc=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 40), seed=st.integers(0, 1000),
       transport=st.sampled_from(["ce", "sm"]))
def test_push_odd_shapes(m_loc: int, n: int, k: int, seed: int, transport: str) -> None:
    errs = run_and_check(2, "push", {"M": 2 * m_loc, "N": n, "K": k, "tp": 0, "seed": seed}, iterations=1,
                         transport=transport)
    assert max(errs) < 1e-4


@triton.jit
def _delivery_order_kernel(out_ptr, rank, blocks_per_rank, WORLD: tl.constexpr, CHUNK: tl.constexpr):
    r = tl.program_id(0)
    peer, j = tile_gemm.peer_block(r, rank, blocks_per_rank, WORLD, CHUNK)
    tl.store(out_ptr + 3 * r, peer)
    tl.store(out_ptr + 3 * r + 1, j)
    tl.store(out_ptr + 3 * r + 2, tile_gemm.peer_position(peer, j, rank, blocks_per_rank, WORLD, CHUNK))


@interpreted
@pytest.mark.parametrize("world,bpr,chunk", [(2, 5, 2), (3, 6, 4), (4, 5, 2), (4, 16, 4), (4, 3, 8), (3, 4, 1),
                                             (4, 6, 6)])
def test_the_peers_blocks_come_copy_by_copy_in_the_order_the_engine_delivers_them(world: int, bpr: int,
                                                                                  chunk: int) -> None:
    """Every peer block once, at the position ``peer_position`` gives back; with copies of ``chunk``
    blocks the order is the copy engine's (``transport.ce_transfer_blocks``: for each copy in turn,
    rank+1's, rank+2's, ...; a slab's last copy may be short), block by block interleaved with one;
    with the whole slab as one chunk, peer by peer (``ce_order`` "step")."""
    for rank in range(world):
        n = (world - 1) * bpr
        out = torch.full((3 * n,), -1, dtype=torch.int32)
        _delivery_order_kernel[(n,)](out, rank, bpr, WORLD=world, CHUNK=chunk)
        rows = [tuple(x) for x in out.view(-1, 3).tolist()]
        assert [p for _, _, p in rows] == list(range(n))
        expect = []
        for j0 in range(0, bpr, chunk):
            for step in range(1, world):
                expect += [((rank + step) % world, j) for j in range(j0, min(j0 + chunk, bpr))]
        if chunk == 1:
            expect = [((rank + step) % world, j) for j in range(bpr) for step in range(1, world)]
        assert [(s, j) for s, j, _ in rows] == expect


def test_pulls_go_peer_by_peer_on_one_stream_in_step_order() -> None:
    """``ce_order`` "step": every copy of rank+1's slab, then rank+2's, ..., all on the first side
    stream, each copy followed by its flag; "round" keeps one stream per peer, copy by copy."""
    class Engine:
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def offset_of(self, tensor: torch.Tensor) -> int:
            return 0

        def copy(self, dst, dst_off, src, src_off, nbytes, stream) -> None:
            self.calls.append(("copy", src, dst_off, nbytes, stream))

        def write_flag(self, dst, flags, index, value, stream) -> None:
            self.calls.append(("flag", dst, index, stream))

    buf = torch.zeros((4 * 64, 8), dtype=torch.bfloat16)
    for order, expect_src, expect_streams in (("step", [2, 2, 3, 3, 0, 0], ["s0"] * 6),
                                              ("round", [2, 3, 0, 2, 3, 0], ["s0", "s1", "s2"] * 2)):
        cfg = replace(gemm_tiles.CPU_CONFIG, transport="ce", ce_copy_bytes=2 * 16 * 8 * 2, ce_order=order)
        state = SimpleNamespace(cfg=cfg, k=8, m_loc=64, n_loc=8192, world=4, rank=1, c=torch.empty(0))
        eng = Engine()
        ce_transfer_blocks(state, eng, buf, buf, torch.zeros(16, dtype=torch.int32), pull=True, value=7,
                           streams=["s0", "s1", "s2"])
        copies = [c for c in eng.calls if c[0] == "copy"]
        assert [c[1] for c in copies] == expect_src
        assert [c[4] for c in copies] == expect_streams
        assert [c[0] for c in eng.calls] == ["copy", "flag"] * 6  # a flag right after each copy
        # the flag of each copy is its last block's (2 blocks a copy of a 4-block slab)
        assert sorted(c[2] for c in eng.calls if c[0] == "flag") == [1, 3, 9, 11, 13, 15]
    with pytest.raises(ValueError, match="ce_order"):
        gemm_tiles.order_chunk(replace(gemm_tiles.CPU_CONFIG, ce_order="spiral"), 64, 4, 2)
    assert gemm_tiles.order_chunk(replace(gemm_tiles.CPU_CONFIG, ce_order="step"), 8192, 4, 2) == 4
    assert gemm_tiles.order_chunk(replace(gemm_tiles.CPU_CONFIG, ce_order="round"), 64, 4, 2) == 2
    assert replace(gemm_tiles.GPU_CONFIG, ce_order="step").label().endswith("ce-mem-step")


def test_the_default_pull_order_is_peer_by_peer_where_the_gemm_is_narrow() -> None:
    """``ce_order`` "auto": peer by peer ("step") where the GEMM has at most ``CE_STEP_MAX_N`` columns
    per rank (the copies then last about as long as the GEMM), else copy by copy over every peer."""
    auto = gemm_tiles.GPU_CONFIG
    assert auto.ce_order == "auto" and auto.label().endswith("ce-mem")
    assert gemm_tiles.ce_order_for(auto, 2048) == "step"  # 4-rank tensor-parallel presets: N 8192 / 4
    assert gemm_tiles.ce_order_for(auto, gemm_tiles.CE_STEP_MAX_N) == "step"
    assert gemm_tiles.ce_order_for(auto, gemm_tiles.CE_STEP_MAX_N + 1) == "round"
    assert gemm_tiles.ce_order_for(auto, 8192) == "round"
    assert gemm_tiles.ce_order_for(replace(auto, ce_order="round"), 2048) == "round"
    assert gemm_tiles.ce_order_for(replace(auto, ce_order="step"), 8192) == "step"


def test_small_own_slabs_take_narrower_tiles() -> None:
    """``first_wave_tiles`` (pull on the copy engines): 128-column tiles where the own slab's 128x256 tiles fill less than half a
    wave and 128-column ones at least half (M=1024 on 4 ranks, N=8192, 132 programs: 64 -> 128 tiles);
    otherwise the config as given (2 ranks, larger M, the narrow tensor-parallel slab, 8 ranks)."""
    cfg = gemm_tiles.GPU_CONFIG
    narrow = gemm_tiles.first_wave_tiles(cfg, 256, 8192, 4, 132)
    assert (narrow.block_n, narrow.num_stages, narrow.tma_store, narrow.ce_order) == (128, 4, False, "step")
    assert gemm_tiles.first_wave_tiles(replace(cfg, ce_order="round"), 256, 8192, 4, 132).ce_order == "round"
    assert narrow.transport == cfg.transport and narrow.block_m == 128
    for m_loc, n_loc, world in ((512, 8192, 2), (1024, 8192, 4), (256, 2048, 4), (128, 8192, 8), (256, 4096, 4)):
        assert gemm_tiles.first_wave_tiles(cfg, m_loc, n_loc, world, 132) is cfg
    assert gemm_tiles.first_wave_tiles(cfg, 256, 8192, 1, 132) is cfg  # one rank: nothing to wait for
    sm = replace(cfg, transport="sm")
    assert gemm_tiles.first_wave_tiles(sm, 256, 8192, 4, 132) is sm  # the copy kernel: measured slower
    assert gemm_tiles.first_wave_tiles(gemm_tiles.CPU_CONFIG, 256, 8192, 4, 132) is gemm_tiles.CPU_CONFIG


def test_the_workload_picks_first_wave_tiles_for_pull_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AgGemm.shape_config`` (what ``setup`` and the benchmark's ``--no-tune`` run): with no config
    given, pull at M=1024 on 4 ranks takes ``first_wave_tiles``' 128x128 tiles and peers in turn; push,
    2 ranks and a given config keep theirs. (On the CPU the table is a no-op: the GPU default and a
    132-program wave stand in for a Hopper GPU.)"""
    from taxmodel.kernels.ag_gemm import workload as ag_workload

    monkeypatch.setattr(ag_workload, "default_config", lambda device: gemm_tiles.GPU_CONFIG)
    monkeypatch.setattr(ag_workload, "wave_programs", lambda cfg, device: 132)
    wl = AgGemm()
    shape = wl.shape("m1024")
    pull = wl.shape_config(shape, 4, "pull", "cpu")
    assert (pull.block_n, pull.ce_order) == (128, "step")
    assert wl.shape_config(shape, 4, "push", "cpu") == gemm_tiles.GPU_CONFIG
    assert wl.shape_config(shape, 2, "pull", "cpu") == gemm_tiles.GPU_CONFIG
    given = replace(gemm_tiles.GPU_CONFIG, num_stages=5)
    assert AgGemm(given).shape_config(shape, 4, "pull", "cpu") is given
    # a bundle's meta records what each variant ran
    assert wl.config_summary("cpu", shape=shape, world=4, variant="pull") == {"label": pull.label(), "transport": "ce"}
    assert "128x128x64" in pull.label() and pull.label().endswith("ce-mem-step")
