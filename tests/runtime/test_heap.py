"""Symmetric heaps: allocation offsets, and a ring of peer pushes + flags through Iris's device
functions in Triton's interpreter, with ranks as threads (ThreadHeap) and as processes
(SharedMemoryHeap)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

sys.path.insert(0, str(Path(__file__).parent))

from taxmodel.errors import RunError  # noqa: E402
from taxmodel.runtime.context import run_in_threads  # noqa: E402
from taxmodel.runtime.heap import ALIGNMENT, ThreadHeap  # noqa: E402
from taxmodel.runtime.launcher import run_local_processes  # noqa: E402

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="needs TRITON_INTERPRET=1 (CPU heaps)")


def test_allocations_are_aligned_and_symmetric():
    heaps = ThreadHeap.group(2, 4096)
    for h in heaps:
        a = h.empty((3,), torch.float32)
        b = h.zeros((2, 5), torch.bfloat16)
        c = h.empty(7, torch.int64)
        assert [h.offset_of(t) for t in (a, b, c)] == [0, ALIGNMENT, 2 * ALIGNMENT]
        assert b.shape == (2, 5) and b.dtype == torch.bfloat16 and bool((b == 0).all())
    assert heaps[0].heap_bases.tolist() == [heaps[0].peer(0).data_ptr(), heaps[0].peer(1).data_ptr()]
    assert heaps[0].heap_bases.dtype == torch.int64


def test_heap_full_is_a_clear_error():
    (h,) = ThreadHeap.group(1, 1024)
    h.empty(200, torch.float32)
    with pytest.raises(RunError, match="symmetric heap full"):
        h.empty(100, torch.float32)


def _expected_from(prev: int, block: int = 16) -> torch.Tensor:
    return torch.arange(block, dtype=torch.float32) + 100.0 * prev


def _ring_rank(ctx, block):
    from ring_kernel import ring_exchange

    return ring_exchange(ctx.heap, ctx.rank, ctx.world_size, block)


@needs_interpreter
@pytest.mark.parametrize("world_size", [2, 3])
def test_ring_push_threads(world_size):
    results = run_in_threads(world_size, lambda ctx: _ring_rank(ctx, 16), timeout_s=60)
    for rank, (got, status) in enumerate(results):
        assert status == 1, f"rank {rank} gave up waiting on its flag"
        torch.testing.assert_close(got, _expected_from((rank - 1) % world_size), rtol=0, atol=0)


@needs_interpreter
def test_ring_push_processes():
    world_size = 2
    results = run_local_processes(world_size, _ring_rank, 16, timeout_s=240)  # a bound, not a timing
    for rank, (got, status) in enumerate(results):
        assert status == 1, f"rank {rank} gave up waiting on its flag"
        torch.testing.assert_close(got, _expected_from((rank - 1) % world_size), rtol=0, atol=0)


@needs_interpreter
def test_missing_peer_makes_the_wait_give_up():
    """World size 2 but only rank 0 runs the kernel: its bounded spin must end with status -1."""
    from ring_kernel import ring_push_kernel

    (h0, h1) = ThreadHeap.group(2, 4096)
    src, dst, flag = h0.empty(16, torch.float32), h0.zeros(16, torch.float32), h0.zeros(1, torch.int32)
    src.fill_(1.0)
    status = torch.zeros(1, dtype=torch.int32)
    ring_push_kernel[(1,)](src, dst, flag, status, h0.heap_bases, 0, 2, 50, BLOCK=16)
    assert int(status.item()) == -1
    # The push still reached rank 1's heap at the same offset.
    assert h1.peer(1)[h0.offset_of(dst):h0.offset_of(dst) + 64].view(torch.float32).tolist() == [1.0] * 16


def test_failing_thread_rank_is_named():
    def body(ctx):
        if ctx.rank == 1:
            raise ValueError("boom")
        ctx.barrier()

    with pytest.raises(RunError, match=r"rank 1: ValueError: boom"):
        run_in_threads(2, body, timeout_s=30)


def test_shared_memory_heap_leaves_no_file_behind():
    from taxmodel.runtime.heap import SharedMemoryHeap

    heap = SharedMemoryHeap(0, 1, 4096)
    t = heap.zeros(16, torch.int32)
    t += 7
    assert heap.peer(0)[:64].view(torch.int32).tolist() == [7] * 16
    assert heap.heap_bases.tolist() == [heap.peer(0).data_ptr()]
    assert not any(p.exists() for p in heap.paths)
    del t
    heap.close()


def test_bench_reports_ordered_statistics():
    from taxmodel.runtime.timing import bench

    calls = []
    res = bench(lambda: calls.append(1), reps=5, inner=3, warmup=2)
    assert len(calls) == 2 + 5 * 3
    assert res.reps == 5 and res.inner == 3 and res.device == "cpu"
    assert 0 <= res.min_s <= res.p10_s <= res.median_s <= res.p90_s
