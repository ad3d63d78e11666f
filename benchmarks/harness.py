"""What every GPU benchmark script starts from: one rank context per torchrun process, and the
maximum of a number over ranks (a step is as slow as its slowest rank)."""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from taxmodel.runtime.bootstrap import join_process_group, rank_device
from taxmodel.runtime.context import RankContext
from taxmodel.runtime.heap import disable_multicast


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
    if not dist.is_initialized() or ctx.world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return float(t.item())
