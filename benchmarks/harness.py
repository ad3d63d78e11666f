"""What every GPU benchmark script starts from: one rank context per torchrun process, the maximum
of a number over ranks (a step is as slow as its slowest rank), and the project's timer
(``taxmodel.runtime.timing``) set up for the ranks."""
from __future__ import annotations

import argparse
import os
from typing import Any

import torch.distributed as dist

from taxmodel.runtime.bootstrap import join_process_group, rank_device
from taxmodel.runtime.context import RankContext
from taxmodel.runtime.heap import disable_multicast
from taxmodel.runtime.timing import SampleTimer, max_over_ranks, rank_sample_timer


def init(args: argparse.Namespace) -> RankContext:
    """This process's RankContext (no heap yet): gloo and Triton's interpreter with ``args.cpu``,
    else NCCL on ``LOCAL_RANK``'s GPU with NVLink multicast off. The process group is created when
    started by torchrun (or with several ranks); ``args.spin_timeout`` bounds in-kernel waits."""
    disable_multicast()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    kind = "cpu" if args.cpu else "cuda"
    if world > 1 or "MASTER_ADDR" in os.environ:
        m = join_process_group(kind, rank=rank, world_size=world, local_rank=local)
        device, backend = m.device, m.backend
    else:
        device, backend = rank_device(kind, local)
    group = dist.group.WORLD if dist.is_initialized() else None
    return RankContext(rank=rank, world_size=world, local_rank=local, device=device, backend=backend, group=group,
                       heap=None, interpret=args.cpu, spin_timeout_s=args.spin_timeout)


def all_max(ctx: RankContext, value: float) -> float:
    """``value``'s maximum over the ranks (``value`` itself on one rank)."""
    return max_over_ranks(value, ctx.device, ctx.group)


def rank_timer(ctx: RankContext, iters: int, reps: int) -> SampleTimer:
    """``reps`` samples of ``iters`` iterations (eager batches or graph replays), ms per iteration:
    each sample after a barrier, the maximum over ranks; a graph capture failing on any rank fails
    on every rank."""
    return rank_sample_timer(ctx.device, iters, reps, between=ctx.barrier, group=ctx.group)


def recorded_batch(ctx: RankContext, timer: SampleTimer, variant: Any, state: Any, book: Any = None) -> tuple[float, Any]:
    """One sample of ``timer.calls`` back-to-back iterations of ``variant`` on ``state``: (ms per
    iteration, max over ranks; the drained records or None). With ``book`` (a RecordBook: in-kernel
    records) its per-iteration buffers are armed before the sample (allocated outside the timing),
    every iteration is told its index, and the records are drained after."""
    iters = timer.calls
    if book is not None:
        book.arm(iters)

    def steps() -> None:
        for i in range(iters):
            if book is not None:
                book.set_iteration(i)
            variant.run(state)

    ms = timer.sample(steps)
    return ms, (book.drain(ctx.rank) if book is not None else None)


def close(ctx: RankContext) -> None:
    """The end of a benchmark's run on every rank: a barrier, its symmetric heap freed, the process
    group destroyed (where there is one)."""
    ctx.barrier()
    if ctx.heap is not None:
        ctx.heap.close()
    if dist.is_initialized():
        dist.destroy_process_group()
