"""Fine-grained pull: one persistent Triton GEMM that loads remote rows of A straight from the
peers' symmetric heaps (``iris.load`` through ``heap_bases``), own rows first.

No flags: every rank's shard is written during setup, and setup ends with a barrier, so a shard
never changes while a peer reads it (a workload whose A changed every iteration would need a
per-iteration ready flag, as the push variant has). The price: each A tile crosses the link once
per N-tile that uses it (the peer's L2 serves repeats, the local L2 does not cache peer memory),
so pull moves ``N / BLOCK_N`` times the all-gather's bytes; it is the simplest fine-grained form.
"""
from __future__ import annotations

from .gemm_tiles import A_PULL, launch_ag_gemm
from .workload import AgGemmState, AgGemmVariant, symmetric_heap

KERNEL = "ag_gemm_kernel"


def prepare(st: AgGemmState, nbytes: int) -> None:
    heap = symmetric_heap(st, nbytes)
    shard = heap.empty((st.m_loc, st.k), st.dtype)
    shard.copy_(st.a_local)
    st.a_local = shard
    st.cache["heap_bases"] = heap.heap_bases


def run(st: AgGemmState) -> None:
    st.epoch += 1
    with st.ctx.kernel(KERNEL):
        launch_ag_gemm(st.a_local, st.b, st.c, mode=A_PULL, rank=st.rank, world=st.world, m_loc=st.m_loc,
                       cfg=st.cfg, err=st.err, sync=st.sync, heap_bases=st.cache["heap_bases"], epoch=st.epoch,
                       budget=st.budget, count=st.count, seen=st.seen)


VARIANT = AgGemmVariant(
    name="pull",
    run=run,
    roles={KERNEL: "fused"},
    needs_heap=True,
    fine_grained=True,
    description="persistent Triton GEMM loading remote A tiles from peers' heaps (iris.load), own rows first",
    prepare=prepare,
)
