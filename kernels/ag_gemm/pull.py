"""Fine-grained pull: each rank fetches its peers' A rows itself, block by block, into its own
gathered buffer, and one persistent Triton GEMM consumes each block as soon as it is staged, own
rows first.

Transports (``cfg.transport``):
- ``"ce"`` (default): copy engines read every remote M-block exactly once (one side stream per
  peer, or one for all peers in turn in the "step" order, ``gemm_tiles.ce_order_for``;
  ``cuMemcpyAsync`` copies of whole blocks) and set a local flag after each block to ``CE_SET``, a
  value above every epoch; the GEMM's waits poll local memory and no SM moves data. After the GEMM
  the rank zeroes its flags on the main stream (``CopyEngine.reset_flags``: one memset), so the next
  iteration's waits see only that iteration's blocks.
- ``"sm"``: ``transport.copy_blocks_kernel`` in pull mode (16-byte vector Iris loads from the peer,
  local stores, a local release-set per K piece, which the GEMM waits on piece by piece) on a side
  stream, beside the GEMM.
- ``"direct"``: the GEMM loads remote tiles straight from the peers' heaps with ``iris.load``. Each
  A tile then crosses the link once per N-tile that uses it (``N / BLOCK_N`` times the all-gather's
  bytes: 32x at N=8192, BLOCK_N=256): kept as the reference for why staging matters.

Each rank's shard is its own slab of its gathered buffer, written during setup; setup ends with a
barrier, so a slab never changes while a peer reads it (a workload whose A changed every iteration
would need a per-iteration "shard ready" flag, as the push variant has). The gathered buffer is
single: this iteration's staging copies wait for the previous iteration's GEMM (side streams wait
on the main stream); the copy kernel's flags hold epochs, so they never need a reset, and the copy
engines' flags are reset after the GEMM (every flag was set before the GEMM could end).

CUDA graphs: every transport is graph-safe. The ``sm`` copy kernel and the GEMM read their epochs
from device memory (their epoch slots, see ``transport``); the buffer is single, so no load
address depends on the epoch (``DOUBLE_BUFFER`` off); ``direct`` has no flags at all; the copy engines' copies,
flag writes and the reset are the same operations every iteration (memcpy, memory-operation and
memset nodes), since their flag value does not change with the epoch. The copy engines are what
gives the GEMM every SM in a graph (issue 37). In-kernel records: the copy kernel records one
``remote_load`` per work item, the GEMM as in ``gemm_tiles``.
"""
from __future__ import annotations

import contextlib

import torch
import triton

from taxmodel.kernels.names import AG_GEMM_KERNEL, CE_GET
from taxmodel.vocabulary import MEMCPY, MEMSET

from .copy_engine import CopyEngine
from .gemm_tiles import (A_PULL, A_WAIT, ce_order_for, gemm_record_layout, k_pieces, launch_ag_gemm, make_descriptor,
                         tma_available)
from .state import AgGemmState, AgGemmVariant, symmetric_heap
from .transport import (COPY_KERNEL, ce_transfer_blocks, copy_record_layout, fork, join, launch_copy_blocks,
                        reserved_programs, side_streams)

KERNEL = AG_GEMM_KERNEL
STAGE_KERNEL = COPY_KERNEL
CE_PULL = CE_GET


#: The copy engines' flag value: above every epoch the GEMM waits for (``wait_target``), the same in
#: every iteration, so a graph replays the flag writes unchanged.
CE_SET = 1 << 30


def graph_safe(transport: str) -> bool:
    """Whether a CUDA graph may capture an iteration and replay it (see the module docstring)."""
    return transport in ("ce", "sm", "direct")


def prepare(st: AgGemmState, nbytes: int) -> None:
    heap = symmetric_heap(st, nbytes)
    cfg = st.cfg
    bpr = triton.cdiv(st.m_loc, cfg.block_m)
    pieces = k_pieces(cfg, st.k)
    st.gathered = heap.empty((st.m, st.k), st.dtype)
    st.flags = heap.zeros((st.world * bpr * pieces,), torch.int32)
    own = st.gathered[st.rank * st.m_loc:(st.rank + 1) * st.m_loc]
    own.copy_(st.a_local)
    st.a_local = own
    st.cache["heap_bases"] = heap.heap_bases
    st.new_epochs()
    if cfg.transport == "ce":
        st.cache["ce"] = CopyEngine(heap, st.c.device, cfg.ce_signal)
    elif cfg.transport not in ("sm", "direct"):
        raise ValueError(f"pull: unknown transport {cfg.transport!r} (use 'ce', 'sm' or 'direct')")
    if cfg.transport != "direct" and cfg.use_tma and tma_available():
        st.cache["a_desc"] = make_descriptor(st.gathered, [cfg.block_m, cfg.block_k])
        st.cache["b_desc"] = make_descriptor(st.b, [cfg.block_k, cfg.block_n])
    if cfg.transport != "direct":
        st.add_records(KERNEL, gemm_record_layout(st.m_loc, st.n_loc, st.world, cfg, pieces, st.c.device,
                                                  reserved_programs(st)))
    if cfg.transport == "sm" and st.world > 1:
        st.add_records(STAGE_KERNEL, copy_record_layout(st.m_loc, st.k, st.world, cfg))


def run(st: AgGemmState) -> None:
    cfg, bases = st.cfg, st.cache["heap_bases"]
    common = dict(rank=st.rank, world=st.world, m_loc=st.m_loc, cfg=cfg, err=st.err, sync=st.sync,
                  heap_bases=bases, budget=st.budget, count=st.count, seen=st.seen)
    if cfg.transport == "direct":
        with st.ctx.kernel(KERNEL):
            launch_ag_gemm(st.gathered, st.b, st.c, mode=A_PULL, **common)
        return
    ce = cfg.transport == "ce"
    per_peer = ce and ce_order_for(cfg, st.n_loc) == "round"  # a side stream per peer, or one for all in turn
    streams = side_streams(st, (st.world - 1) if per_peer else 1) if st.world > 1 else []
    main = fork(st, streams)  # the previous GEMM is done reading the buffer
    if ce:
        with st.ctx.kernel(CE_PULL):
            ce_transfer_blocks(st, st.cache["ce"], st.gathered, st.gathered, st.flags, pull=True, value=CE_SET,
                               streams=streams)
    elif st.world > 1:
        with (torch.cuda.stream(streams[0]) if streams else contextlib.nullcontext()), st.ctx.kernel(STAGE_KERNEL):
            launch_copy_blocks(st.gathered, st.flags, bases, pull=True, m_loc=st.m_loc, rank=st.rank,
                               world=st.world, cfg=cfg, epochs=st.copy_epochs, sync=st.sync,
                               records=st.records.get(STAGE_KERNEL))
    reserve = reserved_programs(st)
    with st.ctx.kernel(KERNEL):
        launch_ag_gemm(st.gathered, st.b, st.c, mode=A_WAIT, flags=st.flags, epochs=st.gemm_epochs,
                       a_desc=st.cache.get("a_desc"), b_desc=st.cache.get("b_desc"), reserve_programs=reserve,
                       pieces=k_pieces(cfg, st.k), records=st.records.get(KERNEL), copy_by_copy=ce, **common)
    join(st, main, streams)
    if ce:  # every flag was set before the GEMM ended: clear them for the next iteration
        st.cache["ce"].reset_flags(st.flags, main)


VARIANT = AgGemmVariant(
    name="pull",
    run=run,
    roles={CE_PULL: "comm", MEMCPY: "comm", MEMSET: "comm", STAGE_KERNEL: "comm", KERNEL: "fused"},
    needs_heap=True,
    fine_grained=True,
    description="each rank stages every remote A block once into its gathered buffer (copy engines or a Triton "
                "pull kernel) with local epoch flags; persistent GEMM consumes each block when staged, own rows first",
    prepare=prepare,
)
