"""A tiny fine-grained protocol for heap tests: rank r pushes a block into rank r+1's heap with
``iris.store`` and raises a flag there with ``iris.atomic_xchg`` (release); then it waits, with a
bounded number of polls, for the flag that rank r-1 raises in its own heap.

Import this module only with ``TRITON_INTERPRET=1`` set on CPU (the heaps are CPU memory).
"""
from __future__ import annotations

import iris
import torch
import triton
import triton.language as tl


@triton.jit
def ring_push_kernel(src, dst, flag, status, heap_bases, rank, world_size, max_polls,
                     BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    nxt = (rank + 1) % world_size
    vals = tl.load(src + offs)
    iris.store(dst + offs, vals, rank, nxt, heap_bases)
    iris.atomic_xchg(flag, 1, rank, nxt, heap_bases, sem="release", scope="sys")
    # Bounded wait for our predecessor's flag in our own heap.
    seen = tl.atomic_cas(flag, 1, 1, sem="acquire", scope="sys")
    polls = 0
    while (seen != 1) & (polls < max_polls):
        seen = tl.atomic_cas(flag, 1, 1, sem="acquire", scope="sys")
        polls += 1
    tl.store(status, tl.where(seen == 1, 1, -1))


def ring_exchange(heap, rank: int, world_size: int, block: int = 16, max_polls: int = 200_000) -> tuple[torch.Tensor, int]:
    """Allocate, run the ring push, return (what arrived from rank-1, status 1 ok / -1 gave up)."""
    src = heap.empty(block, torch.float32)
    src.copy_(torch.arange(block, dtype=torch.float32) + 100.0 * rank)
    dst = heap.zeros(block, torch.float32)
    flag = heap.zeros(1, torch.int32)
    status = torch.zeros(1, dtype=torch.int32)
    heap.barrier()
    ring_push_kernel[(1,)](src, dst, flag, status, heap.heap_bases, rank, world_size, max_polls, BLOCK=block)
    heap.barrier()
    return dst.clone(), int(status.item())
