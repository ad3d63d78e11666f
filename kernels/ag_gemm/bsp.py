"""Bulk-synchronous All-Gather + GEMM: one collective into a gathered buffer, then cuBLAS.

This is what a user writes first: ``all_gather_into_tensor`` (NCCL on GPUs) and ``torch.matmul``.
The gathered A is an intermediate: written to HBM by the collective and read back by the GEMM.
On CPU ranks that are threads of one process (no process group), the collective is emulated by
copying the peers' shards out of the symmetric heap (the same data movement, done by the host).
"""
from __future__ import annotations

import torch

from taxmodel.vocabulary import ALLGATHER, COLLECTIVE_KERNELS, GEMM_KERNELS

from .state import AgGemmState, AgGemmVariant, symmetric_heap


def prepare(st: AgGemmState, nbytes: int) -> None:
    st.gathered = torch.empty(st.m, st.k, dtype=st.dtype, device=st.c.device)
    if st.ctx.backend == "threads":
        heap = symmetric_heap(st, nbytes)
        shard = heap.empty((st.m_loc, st.k), st.dtype)
        shard.copy_(st.a_local)
        st.a_local = shard


def _thread_all_gather(st: AgGemmState) -> None:
    heap = st.heap or st.ctx.heap
    off = heap.offset_of(st.a_local)
    nbytes = st.a_local.numel() * st.a_local.element_size()
    for r in range(st.world):
        rows = heap.peer(r)[off:off + nbytes].view(st.dtype).view(st.m_loc, st.k)
        st.gathered[r * st.m_loc:(r + 1) * st.m_loc].copy_(rows)


def run(st: AgGemmState) -> None:
    ctx = st.ctx
    st.epoch += 1
    with ctx.kernel("all_gather"):
        if st.world == 1:
            st.gathered.copy_(st.a_local)
        elif ctx.backend == "threads":
            _thread_all_gather(st)
        else:
            import torch.distributed as dist

            dist.all_gather_into_tensor(st.gathered, st.a_local, group=ctx.group)
    with ctx.kernel("matmul"):
        torch.matmul(st.gathered, st.b, out=st.c)


VARIANT = AgGemmVariant(
    name="bsp",
    run=run,
    roles={COLLECTIVE_KERNELS[ALLGATHER]: "comm", GEMM_KERNELS: "compute"},
    needs_heap=False,
    fine_grained=False,
    description="all_gather_into_tensor (NCCL) into a buffer, then torch.matmul (cuBLAS)",
    prepare=prepare,
    graph_safe=True,  # a collective and a matmul on fixed buffers: nothing changes between iterations
)
