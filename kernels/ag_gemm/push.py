"""Fine-grained push: every rank pushes its own A rows into its peers' gathered buffers, block by
block, each block followed by a flag that holds the iteration (epoch); the GEMM on each rank
consumes a remote block as soon as its flag says it arrived.

Design decisions (why):
- The blocks travel by copy engines or by the SM copy kernel (``cfg.transport``; ``transport.py``).
- Own rows are never copied: this rank's A shard *is* its slab of the gathered buffer (a view), so
  the GEMM starts on own tiles at once while the peers' blocks arrive.
- The gathered buffer and the flags are double-buffered by epoch parity, and flags hold epochs
  (never reset). Race freedom: rank r's push of epoch e+2 into rank p's parity slot needs r to have
  finished its GEMM of epoch e+1, which needed p's push of e+1, which p enqueues only after its GEMM
  of epoch e (the push streams wait on the main stream), so p is done reading that slot. Own rows
  live in parity 0 only (the GEMM reads them there in both parities), so refreshing this rank's
  shard in place (``AgGemmState.reseed``) is one copy.
- Epochs in device memory (CUDA graphs): the copy kernel and the GEMM each keep their own epoch
  slots (``AgGemmState.epochs``, one per program: ``kernels/device/epochs.py``); each kernel is
  launched once per iteration in stream order with the same grid, so both count the same
  iterations, and the parity is computed on the device from them (both kernels compile their
  ``DOUBLE_BUFFER``). A captured graph therefore replays correctly: the ``sm`` transport is
  graph-safe. The copy-engine transport picks the parity on the host: eager only (its flag value,
  ``st.epoch``, counts the same iterations as the GEMM's device epoch as long as nothing is
  captured).
- Each rank sends to ``rank - 1`` first, the peer whose GEMM consumes this rank's blocks first
  (``tile_gemm.tile_coords``). The GEMM's in-kernel records are described in ``gemm_tiles``.
- Under Triton's interpreter, launches run to completion one after another: the pushes (which never
  wait) finish before this rank's GEMM starts, and the peers' pushes run in the peers' threads or
  processes, so no program ever waits on a later program of its own launch.
"""
from __future__ import annotations

import contextlib

import torch
import triton

from taxmodel.kernels.names import AG_GEMM_KERNEL, CE_PUT
from taxmodel.vocabulary import MEMCPY

from .copy_engine import CopyEngine
from .gemm_tiles import A_WAIT, gemm_record_layout, k_pieces, launch_ag_gemm, make_descriptor, tma_available
from .state import AgGemmState, AgGemmVariant, symmetric_heap
from .transport import (COPY_KERNEL, ce_transfer_blocks, copy_record_layout, fork, join, launch_copy_blocks,
                        reserved_programs, side_streams)

PUSH_KERNEL = COPY_KERNEL
CE_PUSH = CE_PUT
GEMM_KERNEL = AG_GEMM_KERNEL


def graph_safe(transport: str) -> bool:
    """Whether a CUDA graph may capture one iteration and replay it: the copy kernel and the GEMM
    take their epochs (and the parity) from device memory; the copy engines' flag value and
    parity are chosen on the host."""
    return transport == "sm"


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
    roles={CE_PUSH: "comm", MEMCPY: "comm", PUSH_KERNEL: "comm", GEMM_KERNEL: "fused"},
    needs_heap=True,
    fine_grained=True,
    description="each rank pushes its A blocks into the peers' gathered buffers (copy engines or a Triton copy "
                "kernel) with epoch flags; persistent GEMM consumes each block when its flag arrives, own rows first",
    prepare=prepare,
)
