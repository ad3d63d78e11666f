"""How the fine-grained All-Gather + GEMM variants move blocks of A between the ranks, each block
(or K piece of one) followed by a flag that holds the iteration (epoch): the SM copy kernel, the
copy-engine schedule, and the side streams both run on. ``push.py`` and ``pull.py`` choose a
direction; the GEMM that waits on the flags is ``gemm_tiles.py``.

Design decisions (why):
- Transports (``cfg.transport``). ``"ce"``: copy engines (``copy_engine.py``): one side stream per
  peer, one ``cuMemcpyAsync`` per M-block, then a stream flag write (set to the epoch); no SM takes
  part in the communication, so the persistent GEMM keeps every SM. ``"sm"``:
  ``copy_blocks_kernel`` below, a small Triton kernel on a side stream with 16-byte vector stores
  (Iris ``store``/``load`` with a contiguity hint: without it the translated pointers lose their
  alignment and every bf16 element becomes its own 2-byte NVLink write, ~10 GB/s), one
  release-set per K piece of a block (the GEMM waits piece by piece, so a tile starts when the
  first piece of its block has landed); by default it co-resides with the GEMM on the same SMs
  (it uses no shared memory and few registers).
- Epochs in device memory (CUDA graphs): the copy kernel keeps its own epoch slots, one per
  program (``kernels/device/epochs.py``: read at the program's start, stored back at its end;
  every launch on them with the same grid), so a captured graph replays correctly. The copy
  engines write a host-chosen value (``cuStreamWriteValue32``): eager only.
- Order: the first block goes to every peer first (work items interleaved over peers for the
  kernel; for the copy engines every peer's first copy, then every peer's second, one stream per
  peer: a 4x H200 trace shows one engine running a rank's pulls one after another in this order,
  the order pull's GEMM takes them, ``tile_gemm.peer_block``).
- In-kernel records (``ctx.instrument``): the copy kernel records one ``store_push`` per work item
  (one K piece of one block to one peer, flag included; ``remote_load`` in pull mode).
"""
from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

import iris

from taxmodel.kernels.device import trace
from taxmodel.kernels.device.epochs import check_grid, launch_epoch, publish_epoch
from taxmodel.kernels.device.sync import signal
from taxmodel.kernels.names import COPY_BLOCKS_KERNEL

from .copy_engine import CopyEngine
from .gemm_tiles import GemmConfig, ce_blocks_per_copy, ce_order_for, k_pieces, piece_cols, wave_programs
from .state import AgGemmState

COPY_KERNEL = COPY_BLOCKS_KERNEL


# rank changes between ranks: unspecialized, so every rank compiles the same kernel.
@triton.jit(do_not_specialize=["rank"])
def copy_blocks_kernel(
    gathered_ptr, flags_ptr, heap_bases, epoch_ptr, rec_ptr,
    M_loc, K, stride_m, parity_rows, flag_parity_stride, rank,
    WORLD: tl.constexpr, PULL: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_K: tl.constexpr, CHUNK_K: tl.constexpr, NUM_PROGS: tl.constexpr, EVEN: tl.constexpr,
    MODE: tl.constexpr = 0, INSTRUMENT: tl.constexpr = False, DOUBLE_BUFFER: tl.constexpr = False,
):
    """Move M-blocks of A between the ranks' gathered buffers (same rows on both sides).

    Push (``PULL`` false): this rank's slab into every peer's buffer; pull: every peer's slab into
    this rank's buffer. A work item is one piece (``BLOCK_M`` rows x ``CHUNK_K`` columns) of one
    block for one peer, moved ``ROWS x BLOCK_K`` elements at a time and then published by a
    release-set of that piece's flag to the epoch (on the peer for a push, here for a pull: the
    GEMM waits piece by piece). Items run piece-major within a block, peers interleaved, so every
    peer's first piece moves first. ``EVEN`` (no partial block or piece) drops the masks so that
    every access is a 16-byte vector.

    The epoch comes from this program's slot of ``epoch_ptr`` (``kernels/device/epochs.py``).
    Rows are read from parity 0; with ``DOUBLE_BUFFER`` (the push variant) they are written
    ``parity * parity_rows`` rows further (and flags ``parity * flag_parity_stride`` further),
    without it (pull) no address depends on the epoch. ``MODE`` is the clock of the in-kernel
    records (``INSTRUMENT``).
    """
    pid = tl.program_id(0)
    t_rec = trace.begin(INSTRUMENT, MODE)
    epoch = launch_epoch(epoch_ptr, pid)
    if DOUBLE_BUFFER:
        parity = epoch % 2
        dst_shift = parity * parity_rows * stride_m
        flags_base = flags_ptr + parity * flag_parity_stride
    else:
        dst_shift = 0
        flags_base = flags_ptr
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
            t_rec = trace.mark(rec_ptr, pid, trace.REMOTE_LOAD, t_rec, INSTRUMENT, MODE)
        else:
            signal(flag, epoch, rank, peer, heap_bases)
            t_rec = trace.mark(rec_ptr, pid, trace.STORE_PUSH, t_rec, INSTRUMENT, MODE)
    publish_epoch(epoch_ptr, pid, epoch, MODE)


def wait_target(cfg: GemmConfig, k: int, epoch: int) -> int:
    """The flag value the GEMM waits for in ``epoch``: every transport sets each flag (per block for
    the copy engines, per K piece for the copy kernel) to the epoch that delivered it. Stale values
    of the other parity are older epochs, so no reset is ever needed."""
    return epoch


def copy_plan(m_loc: int, k: int, world: int, cfg: GemmConfig) -> tuple[int, int, int, int]:
    """(programs, work items, columns per piece, columns per move) of ``copy_blocks_kernel``."""
    ck = piece_cols(cfg, k)
    bk = cfg.push_block_k
    while ck % bk:
        bk //= 2
    items = triton.cdiv(m_loc, cfg.block_m) * k_pieces(cfg, k) * (world - 1)
    return max(1, min(cfg.push_progs, items)), items, ck, bk


def copy_record_layout(m_loc: int, k: int, world: int, cfg: GemmConfig) -> trace.RecordLayout:
    """Record slots of one ``copy_blocks_kernel`` launch: one record per work item, items taken
    with stride ``programs``."""
    programs, items, _, _ = copy_plan(m_loc, k, world, cfg)
    return trace.RecordLayout(programs, triton.cdiv(items, programs))


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
    ``parity_rows``/``flag_parity_stride``, which compiles ``DOUBLE_BUFFER``); ``epochs`` the
    kernel's epoch slots (``epochs.new_epoch_slots``; every launch on them with the same grid,
    else ``ValueError``).
    """
    if world == 1:
        return
    k = gathered.shape[1]
    progs, _, ck, bk = copy_plan(m_loc, k, world, cfg)
    check_grid(epochs, progs, "launch_copy_blocks")
    rows = min(cfg.push_rows, cfg.block_m)
    even = (m_loc % cfg.block_m == 0 and k % ck == 0 and cfg.block_m % rows == 0 and gathered.stride(1) == 1)
    copy_blocks_kernel[(progs,)](
        gathered, flags, heap_bases, epochs, trace.record_pointer(records, epochs),
        m_loc, k, gathered.stride(0), parity_rows, flag_parity_stride, rank,
        WORLD=world, PULL=pull, BLOCK_M=cfg.block_m, ROWS=rows, BLOCK_K=bk, CHUNK_K=ck, NUM_PROGS=progs,
        EVEN=even, MODE=sync, INSTRUMENT=trace.instrument_code(records),
        DOUBLE_BUFFER=parity_rows != 0 or flag_parity_stride != 0, num_warps=cfg.push_warps,
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
    """Copy-engine moves of whole M-blocks, one stream per peer, in copies of
    ``ce_blocks_per_copy`` blocks, each copy followed by one flag: its last block's (the GEMM waits
    on that flag for every block of the copy, ``tile_gemm.flag_block``).

    Push: this rank's slab of ``src_buf`` -> the same rows of ``dst_buf`` on peer ``rank - step``;
    the flag is set on the peer. Pull: peer ``rank + step``'s slab (its own rows of its gathered
    buffer) -> this rank's buffer; the flag is set here. Copies go copy by copy, peers in turn
    (every peer's first copy, then every peer's second, ...), or, pulling in the "step" order
    (``gemm_tiles.ce_order_for``), peer by peer on the first stream (every copy of rank+1's slab, then rank+2's, ...).
    The flag value is the caller's (``value``).
    """
    row_bytes = st.k * dst_buf.element_size()
    src_base, dst_base = ce.offset_of(src_buf), ce.offset_of(dst_buf)
    bm, bpr = st.cfg.block_m, triton.cdiv(st.m_loc, st.cfg.block_m)
    per_copy = ce_blocks_per_copy(st.cfg, st.m_loc, st.n_loc, st.k, dst_buf.element_size(), st.world,
                                  wave_programs(st.cfg, st.c.device))
    copies = [(j0, step) for j0 in range(0, bpr, per_copy) for step in range(1, st.world)]
    by_peer = pull and ce_order_for(st.cfg, st.n_loc) == "step"
    if by_peer:
        copies.sort(key=lambda c: c[1])  # stable: a peer's copies stay in slab order
    for j0, step in copies:
        j = min(j0 + per_copy, bpr) - 1  # the copy's last block: its flag
        rows = min((j + 1) * bm, st.m_loc) - j0 * bm
        stream = (streams[0] if by_peer else streams[step - 1]) if streams else None
        if pull:
            peer = (st.rank + step) % st.world
            owner, dst, src = peer, st.rank, peer
        else:
            peer = (st.rank + st.world - step) % st.world
            owner, dst, src = st.rank, peer, st.rank
        off = (owner * st.m_loc + j0 * bm) * row_bytes
        ce.copy(dst, dst_base + off, src, src_base + off, rows * row_bytes, stream)
        ce.write_flag(dst, flags, owner * bpr + j, value, stream)
