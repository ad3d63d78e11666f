"""Bulk-synchronous flash decode: four steps, each a separate kernel, a collective in the middle.

1. ``flash_decode_split_kv``: partials (o, lse) per split of this rank's KV      -> HBM
2. ``flash_decode_combine_local``: combine this rank's splits into one partial per query row,
   packed as out [B*Hq, D] then lse [B*Hq] (fp32)                                   -> HBM
3. NCCL ``all_gather`` of the packed partials (gloo on CPU)                      -> HBM
4. ``flash_decode_combine_global``: LSE-rescale the W ranks' partials into the output.

Every arrow is an intermediate that round-trips HBM (declared in the workload's cost), and step 3
is a global synchronization: no rank's combine starts before the slowest rank's partials arrive.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import warnings

import torch

from taxmodel.errors import RunError
from taxmodel.kernels.flash_decode.combine import (combine_rows, launch_combine_global, launch_combine_local,
                                                   packed_size)
from taxmodel.kernels.flash_decode.split_kv import SplitKVArgs, launch_split_kv, partial_buffers
from taxmodel.kernels.names import FLASH_DECODE_COMBINE_GLOBAL, FLASH_DECODE_COMBINE_LOCAL, FLASH_DECODE_SPLIT

SPLIT_NAME = FLASH_DECODE_SPLIT
COMBINE_LOCAL_NAME = FLASH_DECODE_COMBINE_LOCAL
COMBINE_GLOBAL_NAME = FLASH_DECODE_COMBINE_GLOBAL

# torch 2.13 deprecates the name that torch 2.11 (the GPU machines) still needs; filtered once here
# rather than per call, so that the BSP launch path pays nothing for it.
warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.*deprecated", category=FutureWarning)


@dataclass
class BspState:
    args: SplitKVArgs
    out: torch.Tensor  # [B, Hq, D], the dtype of q
    part_out: torch.Tensor
    part_lse: torch.Tensor
    send: torch.Tensor  # packed partial of this rank
    gathered: torch.Tensor  # [W, packed]
    world_size: int
    group: Any
    combine_slices: int = 1  # combine programs per KV pair (each takes G / slices query rows)


def make_bsp_state(ctx: Any, args: SplitKVArgs, out: torch.Tensor, combine_slices: int = 1) -> BspState:
    part_out, part_lse = partial_buffers(args)
    n = packed_size(args.batch * args.q_heads, args.head_dim)
    dev = args.q.device
    send = torch.empty(n, dtype=torch.float32, device=dev)
    w = ctx.world_size
    gathered = send.view(1, n) if w == 1 else torch.empty(w, n, dtype=torch.float32, device=dev)
    combine_rows(args, combine_slices)  # fails early (InputError) unless the slices divide the group
    return BspState(args, out, part_out, part_lse, send, gathered, w, ctx.group, max(1, combine_slices))


def all_gather_partials(state: BspState) -> None:
    """Every rank's packed partial into ``gathered`` (NCCL on GPU, gloo on CPU)."""
    if state.world_size == 1:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RunError("flash_decode bsp: torch.distributed is not initialized; start the ranks with "
                       "torchrun or `taxmodel profile`")
    try:
        dist.all_gather_into_tensor(state.gathered.view(-1), state.send, group=state.group)
    except (RuntimeError, NotImplementedError):
        # Older gloo builds lack all_gather_into_tensor; the list form moves the same bytes.
        dist.all_gather(list(state.gathered.unbind(0)), state.send, group=state.group)


def run_bsp(state: BspState, ctx: Any) -> None:
    """Enqueue one decode step (no host sync)."""
    a = state.args
    with ctx.kernel(SPLIT_NAME):
        launch_split_kv(a, state.part_out, state.part_lse)
    with ctx.kernel(COMBINE_LOCAL_NAME):
        launch_combine_local(a, state.part_out, state.part_lse, state.send, slices=state.combine_slices)
    # No ctx.kernel range here: the collective shows up in traces by itself (NCCL kernel on GPU,
    # a gloo range that capture turns into a comm row on CPU).
    all_gather_partials(state)
    with ctx.kernel(COMBINE_GLOBAL_NAME):
        launch_combine_global(a, state.gathered, state.out, state.world_size, slices=state.combine_slices)
