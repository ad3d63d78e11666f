"""Fine-grained push: every rank pushes its own A rows into its peers' gathered buffers, block by
block, each block followed by a flag that holds the iteration (epoch); the GEMM on each rank
consumes a remote block as soon as its flag says it arrived.

Design decisions (why):
- Transports (``cfg.transport``). ``"ce"``: copy engines (``copy_engine.py``): one side stream per
  peer, one ``cuMemcpyAsync`` per M-block into the peer's gathered buffer, then a stream flag write
  on the peer (set to the epoch); no SM takes part in the communication, so the persistent GEMM
  keeps every SM. ``"sm"``: ``copy_blocks_kernel`` below, a small Triton kernel on a side stream
  with 16-byte vector stores (Iris ``store`` with a contiguity hint: without it the translated
  pointers lose their alignment and every bf16 element became its own 2-byte NVLink write, the
  cause of the first version's ~10 GB/s), one release-set per K piece of a block (the GEMM waits
  piece by piece, so a tile starts when the first piece of its block has landed); by default it
  co-resides with the GEMM on the same SMs (it uses no shared memory and few registers).
- Own rows are never copied: this rank's A shard *is* its slab of the gathered buffer (a view), so
  the GEMM starts on own tiles at once while the peers' blocks arrive.
- The gathered buffer and the flags are double-buffered by epoch parity, and flags hold epochs
  (never reset). Race freedom: rank r's push of epoch e+2 into rank p's parity slot needs r to have
  finished its GEMM of epoch e+1, which needed p's push of e+1, which p enqueues only after its GEMM
  of epoch e (the push streams wait on the main stream), so p is done reading that slot. Own rows
  live in parity 0 only (the GEMM reads them there in both parities), so refreshing this rank's
  shard in place (``AgGemmState.reseed``) is one copy.
- Epochs in device memory (CUDA graphs): the copy kernel and the GEMM each keep their own
  [last finished epoch, done counter] words (``AgGemmState.epochs``), read at the start of every
  program and advanced by the launch's last program (``gemm_tiles.advance_epoch``); each kernel is
  launched once per iteration in stream order, so both count the same iterations, and the parity
  is computed on the device from them. A captured graph therefore replays correctly: the ``sm``
  transport is graph-safe. The copy-engine transport writes a host-chosen value
  (``cuStreamWriteValue32``) and picks the parity on the host: eager only (its value, ``st.epoch``,
  counts the same iterations as the GEMM's device epoch as long as nothing is captured).
- Push order is staggered: the first block goes to every peer at once (one stream per peer for the
  copy engines, work items interleaved over peers for the kernel), and each rank sends to
  ``rank - 1`` first, the peer whose GEMM consumes this rank's blocks first (``_tile_coords``).
- In-kernel records (``ctx.instrument``): the copy kernel records one ``store_push`` per work item
  (one K piece of one block to one peer, flag included; ``remote_load`` in pull mode); the GEMM's
  records are described in ``gemm_tiles``.
- Under Triton's interpreter, launches run to completion one after another: the pushes (which never
  wait) finish before this rank's GEMM starts, and the peers' pushes run in the peers' threads or
  processes, so no program ever waits on a later program of its own launch.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import triton
import triton.language as tl

import iris

from taxmodel.kernels import _trace
from taxmodel.kernels._sync import signal

from .copy_engine import CopyEngine
from .gemm_tiles import (A_WAIT, GemmConfig, advance_epoch, gemm_record_layout, k_pieces, launch_ag_gemm,
                         make_descriptor, piece_cols, tma_available)
from .workload import AgGemmState, AgGemmVariant, symmetric_heap

PUSH_KERNEL = "copy_blocks_kernel"
CE_PUSH = "ce_put"
GEMM_KERNEL = "ag_gemm_kernel"


# rank changes between ranks: unspecialized, so every rank compiles the same kernel.
@triton.jit(do_not_specialize=["rank"])
def copy_blocks_kernel(
    gathered_ptr, flags_ptr, heap_bases, epoch_ptr, rec_ptr,
    M_loc, K, stride_m, parity_rows, flag_parity_stride, rank,
    WORLD: tl.constexpr, PULL: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_K: tl.constexpr, CHUNK_K: tl.constexpr, NUM_PROGS: tl.constexpr, EVEN: tl.constexpr,
    MODE: tl.constexpr = 0, INSTRUMENT: tl.constexpr = False,
):
    """Move M-blocks of A between the ranks' gathered buffers (same rows on both sides).

    Push (``PULL`` false): this rank's slab into every peer's buffer; pull: every peer's slab into
    this rank's buffer. A work item is one piece (``BLOCK_M`` rows x ``CHUNK_K`` columns) of one
    block for one peer, moved ``ROWS x BLOCK_K`` elements at a time and then published by a
    release-set of that piece's flag to the epoch (on the peer for a push, here for a pull: the
    GEMM waits piece by piece). Items run piece-major within a block, peers interleaved, so every
    peer's first piece moves first. ``EVEN`` (no partial block or piece) drops the masks so that
    every access is a 16-byte vector.

    The epoch comes from ``epoch_ptr`` (device memory, advanced by the launch's last program);
    rows are read from parity 0 and written ``parity * parity_rows`` rows further (and flags
    ``parity * flag_parity_stride`` further): the push variant's double buffer. ``MODE`` is the
    clock of the in-kernel records (``INSTRUMENT``).
    """
    pid = tl.program_id(0)
    t_rec = _trace.begin(INSTRUMENT, MODE)
    epoch = tl.load(epoch_ptr) + 1
    parity = epoch % 2
    dst_shift = parity * parity_rows * stride_m
    flags_base = flags_ptr + parity * flag_parity_stride
    blocks_per_rank = tl.cdiv(M_loc, BLOCK_M)
    pieces = tl.cdiv(K, CHUNK_K)
    items = blocks_per_rank * pieces * (WORLD - 1)
    offs_r = tl.arange(0, ROWS)
    offs_k = tl.arange(0, BLOCK_K)
    for item in range(pid, items, NUM_PROGS):
        step = item % (WORLD - 1) + 1
        piece = (item // (WORLD - 1)) % pieces
        j = item // ((WORLD - 1) * pieces)
        if PULL:
            peer = (rank + step) % WORLD
            owner = peer
        else:
            peer = (rank + WORLD - step) % WORLD
            owner = rank
        for r0 in range(0, BLOCK_M, ROWS):
            rows = j * BLOCK_M + r0 + offs_r
            base = gathered_ptr + (owner * M_loc + rows)[:, None] * stride_m
            for k0 in range(piece * CHUNK_K, piece * CHUNK_K + CHUNK_K, BLOCK_K):
                ks = k0 + offs_k
                ptrs = base + ks[None, :]
                if EVEN:
                    if PULL:
                        v = iris.load(ptrs, rank, peer, heap_bases, hint=(1, 16))
                        tl.store(ptrs + dst_shift, v)
                    else:
                        v = tl.load(ptrs)
                        iris.store(ptrs + dst_shift, v, rank, peer, heap_bases, hint=(1, 16))
                else:
                    mask = (rows < M_loc)[:, None] & (ks < K)[None, :]
                    if PULL:
                        v = iris.load(ptrs, rank, peer, heap_bases, mask=mask)
                        tl.store(ptrs + dst_shift, v, mask=mask)
                    else:
                        v = tl.load(ptrs, mask=mask)
                        iris.store(ptrs + dst_shift, v, rank, peer, heap_bases, mask=mask)
        # One release per piece (system scope), after every thread's stores of the piece.
        flag = flags_base + (owner * blocks_per_rank + j) * pieces + piece
        if PULL:
            signal(flag, epoch, rank, rank, heap_bases)
            t_rec = _trace.mark(rec_ptr, pid, _trace.REMOTE_LOAD, t_rec, INSTRUMENT, MODE)
        else:
            signal(flag, epoch, rank, peer, heap_bases)
            t_rec = _trace.mark(rec_ptr, pid, _trace.STORE_PUSH, t_rec, INSTRUMENT, MODE)
    advance_epoch(epoch_ptr, epoch, NUM_PROGS)


def wait_target(cfg: GemmConfig, k: int, epoch: int) -> int:
    """The flag value the GEMM waits for in ``epoch``: every transport sets each flag (per block for
    the copy engines, per K piece for the copy kernel) to the epoch that delivered it. Stale values
    of the other parity are older epochs, so no reset is ever needed."""
    return epoch


def graph_safe(transport: str) -> bool:
    """Whether a CUDA graph may capture one iteration and replay it: the copy kernel and the GEMM
    take their epochs (and the parity) from device memory; the copy engines' flag value and
    parity are chosen on the host."""
    return transport == "sm"


def copy_plan(m_loc: int, k: int, world: int, cfg: GemmConfig) -> tuple[int, int, int, int]:
    """(programs, work items, columns per piece, columns per move) of ``copy_blocks_kernel``."""
    ck = piece_cols(cfg, k)
    bk = cfg.push_block_k
    while ck % bk:
        bk //= 2
    items = triton.cdiv(m_loc, cfg.block_m) * k_pieces(cfg, k) * (world - 1)
    return max(1, min(cfg.push_progs, items)), items, ck, bk


def copy_record_layout(m_loc: int, k: int, world: int, cfg: GemmConfig) -> _trace.RecordLayout:
    """Record slots of one ``copy_blocks_kernel`` launch: one record per work item, items taken
    with stride ``programs``."""
    programs, items, _, _ = copy_plan(m_loc, k, world, cfg)
    return _trace.RecordLayout(programs, triton.cdiv(items, programs))


def reserved_programs(st: AgGemmState) -> int:
    """SMs the persistent GEMM leaves to the copy kernel (``GemmConfig.reserve_sms``), else 0."""
    cfg = st.cfg
    return cfg.push_progs if (cfg.transport == "sm" and cfg.reserve_sms and st.world > 1) else 0


def launch_copy_blocks(gathered: torch.Tensor, flags: torch.Tensor, heap_bases: torch.Tensor, *, pull: bool,
                       m_loc: int, rank: int, world: int, cfg: GemmConfig, epochs: torch.Tensor, sync: int = 0,
                       parity_rows: int = 0, flag_parity_stride: int = 0,
                       records: Any = None) -> None:
    """Enqueue ``copy_blocks_kernel`` on the current stream (nothing to do on one rank).

    ``gathered`` is the [rows, K] buffer (both parities stacked for the push variant: pass
    ``parity_rows``/``flag_parity_stride``); ``epochs`` the kernel's int32 [2] epoch words.
    """
    if world == 1:
        return
    k = gathered.shape[1]
    progs, _, ck, bk = copy_plan(m_loc, k, world, cfg)
    rows = min(cfg.push_rows, cfg.block_m)
    even = (m_loc % cfg.block_m == 0 and k % ck == 0 and cfg.block_m % rows == 0 and gathered.stride(1) == 1)
    copy_blocks_kernel[(progs,)](
        gathered, flags, heap_bases, epochs, _trace.record_pointer(records, epochs),
        m_loc, k, gathered.stride(0), parity_rows, flag_parity_stride, rank,
        WORLD=world, PULL=pull, BLOCK_M=cfg.block_m, ROWS=rows, BLOCK_K=bk, CHUNK_K=ck, NUM_PROGS=progs,
        EVEN=even, MODE=sync, INSTRUMENT=_trace.instrument_code(records), num_warps=cfg.push_warps,
    )


def side_streams(st: AgGemmState, count: int) -> list[Any]:
    """``count`` side streams on the GPU (cached in the state), an empty list on CPU."""
    if not st.c.is_cuda:
        return []
    streams = st.cache.setdefault("side_streams", [])
    while len(streams) < count:
        streams.append(torch.cuda.Stream(device=st.c.device))
    return streams[:count]


def fork(st: AgGemmState, streams: list[Any]) -> Any:
    """Make ``streams`` wait for the main stream's work so far (reused events: less host time per
    iteration than ``wait_stream``). Returns the main stream (None on CPU)."""
    if not streams:
        return None
    main = torch.cuda.current_stream(st.c.device)
    ev = st.cache.get("fork_event")
    if ev is None:
        ev = st.cache["fork_event"] = torch.cuda.Event()
    ev.record(main)
    for s in streams:
        s.wait_event(ev)
    return main


def join(st: AgGemmState, main: Any, streams: list[Any]) -> None:
    """Make the main stream wait for every side stream (the next iteration and the timers see them)."""
    if not streams:
        return
    evs = st.cache.setdefault("join_events", [])
    while len(evs) < len(streams):
        evs.append(torch.cuda.Event())
    for s, ev in zip(streams, evs):
        ev.record(s)
        main.wait_event(ev)


def ce_transfer_blocks(st: AgGemmState, ce: CopyEngine, src_buf: torch.Tensor, dst_buf: torch.Tensor,
                       flags: torch.Tensor, *, pull: bool, value: int, streams: list[Any]) -> None:
    """Copy-engine moves of whole M-blocks, one stream per peer, each block followed by its flag.

    Push: this rank's slab of ``src_buf`` -> the same rows of ``dst_buf`` on peer ``rank - step``;
    the flag is set on the peer. Pull: peer ``rank + step``'s slab (its own rows of its gathered
    buffer) -> this rank's buffer; the flag is set here. Blocks go in consumption order
    (block-major, peers interleaved). Host-chosen flag value: not graph-safe.
    """
    row_bytes = st.k * dst_buf.element_size()
    src_base, dst_base = ce.offset_of(src_buf), ce.offset_of(dst_buf)
    bm, bpr = st.cfg.block_m, triton.cdiv(st.m_loc, st.cfg.block_m)
    for j in range(bpr):
        rows = min(bm, st.m_loc - j * bm)
        for step in range(1, st.world):
            stream = streams[step - 1] if streams else None
            if pull:
                peer = (st.rank + step) % st.world
                owner, dst, src = peer, st.rank, peer
            else:
                peer = (st.rank + st.world - step) % st.world
                owner, dst, src = st.rank, peer, st.rank
            off = (owner * st.m_loc + j * bm) * row_bytes
            ce.copy(dst, dst_base + off, src, src_base + off, rows * row_bytes, stream)
            ce.write_flag(dst, flags, owner * bpr + j, value, stream)


def prepare(st: AgGemmState, nbytes: int) -> None:
    """Gathered buffers and flags (both parities) on the heap; own shard in parity 0's slab."""
    heap = symmetric_heap(st, nbytes)
    cfg = st.cfg
    bpr = triton.cdiv(st.m_loc, cfg.block_m)
    pieces = k_pieces(cfg, st.k)
    st.gathered = heap.empty((2, st.m, st.k), st.dtype)
    st.flags = heap.zeros((2, st.world * bpr * pieces), torch.int32)
    own = slice(st.rank * st.m_loc, (st.rank + 1) * st.m_loc)
    st.gathered[0, own].copy_(st.a_local)
    st.a_local = st.gathered[0, own]
    st.cache["heap_bases"] = heap.heap_bases
    st.cache["stacked"] = st.gathered.view(2 * st.m, st.k)  # both parities as one [2M, K] buffer
    st.new_epochs()
    if cfg.transport == "ce":
        st.cache["ce"] = CopyEngine(heap, st.c.device, cfg.ce_signal)
    elif cfg.transport != "sm":
        raise ValueError(f"push: unknown transport {cfg.transport!r} (use 'ce' or 'sm')")
    if cfg.use_tma and tma_available():
        st.cache["a_desc"] = make_descriptor(st.cache["stacked"], [cfg.block_m, cfg.block_k])
        st.cache["b_desc"] = make_descriptor(st.b, [cfg.block_k, cfg.block_n])
    st.add_records(GEMM_KERNEL, gemm_record_layout(st.m_loc, st.n_loc, st.world, cfg, pieces, st.c.device,
                                                   reserved_programs(st)))
    if cfg.transport == "sm" and st.world > 1:
        st.add_records(PUSH_KERNEL, copy_record_layout(st.m_loc, st.k, st.world, cfg))


def run(st: AgGemmState) -> None:
    st.epoch += 1  # the host's count (the copy engines' flag value); the kernels count on the device
    cfg = st.cfg
    flags, bases, stacked = st.flags, st.cache["heap_bases"], st.cache["stacked"]
    ce = cfg.transport == "ce"
    streams = side_streams(st, (st.world - 1) if ce else 1) if st.world > 1 else []
    main = fork(st, streams)  # this iteration's inputs (and the previous GEMM) come first
    if ce:
        parity = st.epoch % 2
        with st.ctx.kernel(CE_PUSH):
            ce_transfer_blocks(st, st.cache["ce"], st.gathered[0], st.gathered[parity], flags[parity], pull=False,
                               value=st.epoch, streams=streams)
    elif st.world > 1:
        with (torch.cuda.stream(streams[0]) if streams else contextlib.nullcontext()), st.ctx.kernel(PUSH_KERNEL):
            launch_copy_blocks(stacked, flags, bases, pull=False, m_loc=st.m_loc, rank=st.rank, world=st.world,
                               cfg=cfg, epochs=st.copy_epochs, sync=st.sync, parity_rows=st.m,
                               flag_parity_stride=flags.shape[1], records=st.records.get(PUSH_KERNEL))
    reserve = reserved_programs(st)
    with st.ctx.kernel(GEMM_KERNEL):
        launch_ag_gemm(stacked, st.b, st.c, mode=A_WAIT, rank=st.rank, world=st.world, m_loc=st.m_loc, cfg=cfg,
                       err=st.err, sync=st.sync, flags=flags, heap_bases=bases, epochs=st.gemm_epochs,
                       budget=st.budget, count=st.count, seen=st.seen, a_desc=st.cache.get("a_desc"),
                       b_desc=st.cache.get("b_desc"), reserve_programs=reserve, pieces=k_pieces(cfg, st.k),
                       parity_rows=st.m, flag_parity_stride=flags.shape[1], records=st.records.get(GEMM_KERNEL))
    join(st, main, streams)


VARIANT = AgGemmVariant(
    name="push",
    run=run,
    roles={CE_PUSH: "comm", r"(?i)memcpy": "comm", PUSH_KERNEL: "comm", GEMM_KERNEL: "fused"},
    needs_heap=True,
    fine_grained=True,
    description="each rank pushes its A blocks into the peers' gathered buffers (copy engines or a Triton copy "
                "kernel) with epoch flags; persistent GEMM consumes each block when its flag arrives, own rows first",
    prepare=prepare,
)
