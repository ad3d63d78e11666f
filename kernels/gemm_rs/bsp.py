"""Bulk-synchronous GEMM + Reduce-Scatter: cuBLAS writes the whole partial product, then one
collective reduces and scatters it.

What a user writes first: ``torch.matmul`` into a partial C [M, N] (an intermediate: written to
HBM by the GEMM, read back by the collective), then ``reduce_scatter_tensor`` (NCCL on GPUs, gloo
for CPU processes). On CPU ranks that are threads of one process (no process group) the collective
is emulated through the symmetric heap: every rank's partial lives there, and after a barrier each
rank sums its rows of every peer's partial (the same data movement, done by the host).

CUDA graphs (``graph_safe``): ``run`` enqueues the same two operations on the same buffers every
iteration (the matmul into ``partial``, the collective from ``partial`` into ``out``) and keeps
nothing per iteration on the host, so one captured iteration replays as any other; NCCL
collectives can be captured (the runtime captures with ``capture_error_mode="thread_local"`` for
NCCL's watchdog thread). Thread ranks (CPU, the host-emulated collective with its host barriers)
are never captured: the runtime's graph backend refuses CPU devices
(``taxmodel.runtime.graph.eager_reason``).
"""
from __future__ import annotations

import torch

from taxmodel.vocabulary import COLLECTIVE_KERNELS, GEMM_KERNELS, REDUCE_SCATTER

from .state import GemmRsState, GemmRsVariant, heap_bytes, symmetric_heap


def prepare(st: GemmRsState) -> None:
    if st.ctx.backend == "threads" and st.world > 1:
        heap = symmetric_heap(st, heap_bytes(st.shape, st.world, "bsp", st.dtype, st.cfg))
        st.partial = heap.empty((st.m, st.n), st.dtype)
    else:
        st.partial = torch.empty(st.m, st.n, dtype=st.dtype, device=st.out.device)


def _thread_reduce_scatter(st: GemmRsState) -> None:
    heap = st.heap or st.ctx.heap
    off = heap.offset_of(st.partial)
    nbytes = st.partial.numel() * st.partial.element_size()
    rows = slice(st.rank * st.m_loc, (st.rank + 1) * st.m_loc)
    heap.barrier()  # every rank's partial is written
    acc = torch.zeros(st.m_loc, st.n, dtype=torch.float32)
    for r in range(st.world):
        acc += heap.peer(r)[off:off + nbytes].view(st.dtype).view(st.m, st.n)[rows].float()
    st.out.copy_(acc)
    heap.barrier()  # nobody overwrites its partial while a peer still reads it


def run(st: GemmRsState) -> None:
    ctx = st.ctx
    with ctx.kernel("matmul"):
        torch.matmul(st.a, st.b, out=st.partial)
    with ctx.kernel("reduce_scatter"):
        if st.world == 1:
            st.out.copy_(st.partial)
        elif ctx.backend == "threads":
            _thread_reduce_scatter(st)
        else:
            import torch.distributed as dist

            dist.reduce_scatter_tensor(st.out, st.partial, group=ctx.group)


VARIANT = GemmRsVariant(
    name="bsp",
    run=run,
    roles={COLLECTIVE_KERNELS[REDUCE_SCATTER]: "comm", GEMM_KERNELS: "compute"},
    needs_heap=False,
    fine_grained=False,
    description="torch.matmul (cuBLAS) into a partial C [M, N], then reduce_scatter_tensor (NCCL)",
    prepare=prepare,
    graph_safe=True,  # a matmul and a collective on fixed buffers, nothing per iteration on the host (see above)
)
