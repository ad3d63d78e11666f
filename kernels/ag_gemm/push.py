"""Fine-grained push: every rank pushes its own A rows into its peers' gathered buffers, block by
block, each block followed by a release-set flag; the GEMM on each rank consumes a remote block as
soon as its flag holds the current epoch.

Design decisions (why):
- The push runs as its own small kernel (``push_progs`` programs) on a side stream, launched
  before the GEMM; the GEMM's persistent grid leaves that many SMs free, so both kernels are
  resident together on a GPU and the GEMM's waits can always be satisfied. Under Triton's
  interpreter, launches run to completion one after another: the push kernel (which never waits)
  finishes before this rank's GEMM starts, and the peers' pushes run in the peers' threads or
  processes, so no program ever waits on a later program of its own launch.
- Own rows are never copied: this rank's A shard *is* its slab of the gathered buffer (a view), so
  the GEMM starts on own tiles at once while the peers' blocks arrive.
- The gathered buffer and the flags are double-buffered by epoch parity, and flags hold epochs
  (never reset). Race freedom: rank r's push of epoch e+2 into rank p's parity slot needs r to have
  finished its GEMM of epoch e+1, which needed p's push of e+1, which p enqueues only after its GEMM
  of epoch e (the push stream waits on the main stream), so p is done reading that slot.
- Blocks are pushed block-major over destinations (block 0 to every peer, then block 1, ...),
  the order the GEMM schedules remote tiles in.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

import iris

from taxmodel.kernels._sync import signal_add

from .gemm_tiles import A_WAIT, launch_ag_gemm, make_descriptor, tma_available
from .workload import AgGemmState, AgGemmVariant, symmetric_heap

PUSH_KERNEL = "push_rows_kernel"
GEMM_KERNEL = "ag_gemm_kernel"


@triton.jit
def push_rows_kernel(
    gathered_ptr, flags_ptr, heap_bases,
    M_loc, K, stride_m, stride_k, rank,
    WORLD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK_K: tl.constexpr,
    NUM_PROGS: tl.constexpr,
):
    """Copy this rank's slab of ``gathered`` (rows rank*M_loc ...) into the same rows of every peer's
    gathered buffer. A work item is one piece (BLOCK_M rows x CHUNK_K columns) of one block for one
    peer; after it, the peer's counter flag of that block gets +1 (release). Items run block-major,
    then piece, then peer, so every peer receives block 0 first."""
    pid = tl.program_id(0)
    blocks_per_rank = tl.cdiv(M_loc, BLOCK_M)
    pieces = tl.cdiv(K, CHUNK_K)
    items = blocks_per_rank * pieces * (WORLD - 1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    for item in range(pid, items, NUM_PROGS):
        peer_step = item % (WORLD - 1) + 1
        piece = (item // (WORLD - 1)) % pieces
        j = item // ((WORLD - 1) * pieces)
        dst = (rank + peer_step) % WORLD
        rows = j * BLOCK_M + offs_m
        row_ok = rows < M_loc
        base = gathered_ptr + (rank * M_loc + rows)[:, None] * stride_m
        for k0 in range(piece * CHUNK_K, piece * CHUNK_K + CHUNK_K, BLOCK_K):
            ks = k0 + offs_k
            ptrs = base + ks[None, :] * stride_k
            iris.put(ptrs, ptrs, rank, dst, heap_bases, mask=row_ok[:, None] & (ks < K)[None, :])
        signal_add(flags_ptr + rank * blocks_per_rank + j, 1, rank, dst, heap_bases)


def push_pieces(k: int, chunk_k: int) -> int:
    """Pieces per block: the count a block's flag gains per epoch of its parity."""
    return triton.cdiv(k, chunk_k)


def flag_target(epoch: int, pieces: int) -> int:
    """Counter value meaning "every piece of this block arrived for ``epoch``": flags of one parity
    count the arrivals of all epochs of that parity so far ((epoch + 1) // 2 of them)."""
    return (epoch + 1) // 2 * pieces


def launch_push(gathered: torch.Tensor, flags: torch.Tensor, heap_bases: torch.Tensor, *, m_loc: int,
                rank: int, world: int, block_m: int, block_k: int, chunk_k: int, num_progs: int,
                num_warps: int) -> None:
    """Enqueue the push kernel (nothing to do on one rank)."""
    if world == 1:
        return
    k = gathered.shape[1]
    items = triton.cdiv(m_loc, block_m) * push_pieces(k, chunk_k) * (world - 1)
    progs = max(1, min(num_progs, items))
    push_rows_kernel[(progs,)](
        gathered, flags, heap_bases, m_loc, k, gathered.stride(0), gathered.stride(1), rank,
        WORLD=world, BLOCK_M=block_m, BLOCK_K=min(block_k, chunk_k), CHUNK_K=chunk_k, NUM_PROGS=progs,
        num_warps=num_warps,
    )


def prepare(st: AgGemmState, nbytes: int) -> None:
    """Gathered buffers and flags (both parities) on the heap; own shard placed in both slabs."""
    heap = symmetric_heap(st, nbytes)
    bpr = triton.cdiv(st.m_loc, st.cfg.block_m)
    st.gathered = heap.empty((2, st.m, st.k), st.dtype)
    st.flags = heap.zeros((2, st.world * bpr), torch.int32)
    own = slice(st.rank * st.m_loc, (st.rank + 1) * st.m_loc)
    st.gathered[:, own].copy_(st.a_local.unsqueeze(0).expand(2, -1, -1))
    st.a_local = st.gathered[0, own]
    st.cache["heap_bases"] = heap.heap_bases
    if st.cfg.use_tma and tma_available():
        cfg = st.cfg
        st.cache["a_desc"] = [make_descriptor(st.gathered[p], [cfg.block_m, cfg.block_k]) for p in (0, 1)]
        st.cache["b_desc"] = make_descriptor(st.b, [cfg.block_k, cfg.block_n])
    if st.c.is_cuda:
        st.cache["side_stream"] = torch.cuda.Stream(device=st.c.device)


def run(st: AgGemmState) -> None:
    st.epoch += 1
    parity, cfg = st.epoch % 2, st.cfg
    gathered, flags, bases = st.gathered[parity], st.flags[parity], st.cache["heap_bases"]
    chunk_k = min(cfg.push_chunk_k, triton.next_power_of_2(st.k))
    target = flag_target(st.epoch, push_pieces(st.k, chunk_k))
    side = st.cache.get("side_stream")
    main = torch.cuda.current_stream(st.c.device) if side is not None else None
    if side is not None:
        side.wait_stream(main)  # this iteration's inputs (and the previous GEMM) come first
    with (torch.cuda.stream(side) if side is not None else contextlib.nullcontext()), st.ctx.kernel(PUSH_KERNEL):
        launch_push(gathered, flags, bases, m_loc=st.m_loc, rank=st.rank, world=st.world, block_m=cfg.block_m,
                    block_k=cfg.push_block_k, chunk_k=chunk_k, num_progs=cfg.push_progs, num_warps=cfg.push_warps)
    a_desc = st.cache["a_desc"][parity] if "a_desc" in st.cache else None
    with st.ctx.kernel(GEMM_KERNEL):
        launch_ag_gemm(gathered, st.b, st.c, mode=A_WAIT, rank=st.rank, world=st.world, m_loc=st.m_loc, cfg=cfg,
                       err=st.err, sync=st.sync, flags=flags, heap_bases=bases, epoch=target, budget=st.budget,
                       count=st.count, seen=st.seen, a_desc=a_desc, b_desc=st.cache.get("b_desc"),
                       reserve_programs=cfg.push_progs if st.world > 1 else 0)
    if side is not None:
        main.wait_stream(side)


VARIANT = AgGemmVariant(
    name="push",
    run=run,
    roles={PUSH_KERNEL: "comm", GEMM_KERNEL: "fused"},
    needs_heap=True,
    fine_grained=True,
    description="push kernel (side stream) stores A blocks into peers with release flags; persistent GEMM "
                "consumes each block when its flag holds the epoch, own rows first",
    prepare=prepare,
)
