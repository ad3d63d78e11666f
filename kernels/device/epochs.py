"""Per-program epoch slots: how the fine-grained kernels count their launches on the device.

Why on the device: a captured CUDA graph replays every launch with the arguments of its capture,
so an epoch passed as a kernel argument would be frozen into the graph. Each kernel that waits on
or sets epoch flags (AG+GEMM's ``ag_gemm_kernel`` in ``A_WAIT``, the SM copy kernel of
``ag_gemm/transport.py``, GEMM+RS's ``gemm_rs_kernel``) therefore keeps its own epoch words in
device memory: int32 [``EPOCH_SLOTS``], one slot per program. Program ``pid`` takes
``slots[pid] + 1`` as this launch's epoch at its start (``launch_epoch``) and stores that epoch
into ``slots[pid]`` at its end (``publish_epoch``): a CTA barrier (so that no thread stores the
new epoch before every thread of the program has read the old one), then a plain store, no
atomic. The next launch on the same stream reads it (the kernel boundary orders it). Within a
launch every program reads and writes only its own slot, so no program can take this launch's
epoch for the last one. After a launch every
slot of its grid holds the same value, so a reader that runs after it on the same stream
(``rs_reduce_kernel``, the host) reads slot 0.

Why slots, not one shared word: the earlier protocol ([last finished epoch, done counter]; after
its last tile every program passed a CTA barrier and an acq_rel add on the one counter, and the
last one stored and exchanged the epoch) was, with the epoch-dependent row offset of the first
loads (now ``gemm_tiles``' ``DOUBLE_BUFFER``), what cost the AG GEMM 0.7-3.0 points of cuBLAS
speed at the short shapes on an H100 without a remote tile (1024 x 2048 x 8192: 0.995x alone,
0.965x with the epoch; benchmarks/results/gemm_notes.md). A slot costs one load, a CTA barrier and one store.

The same-grid rule: every launch on one slots buffer must use the same grid, since a program
that did not run in an earlier launch would hold a stale epoch. The launch functions check it on
the host (``check_grid``: a ``ValueError``; no device sync, so it is fine under graph capture);
slots come from ``new_epoch_slots``, one buffer per kernel and configuration.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from taxmodel.kernels.device.sync import cta_barrier

#: Slots per kernel: at least any persistent grid (one program per SM, the copy kernel's programs).
EPOCH_SLOTS = 1024

#: data_ptr of a kernel's slots -> the grid its launches use (``check_grid``).
_GRIDS: dict[int, int] = {}


@triton.jit
def launch_epoch(slots_ptr, pid):
    """This launch's epoch for program ``pid``: the one its slot says finished last, plus one."""
    return tl.load(slots_ptr + pid) + 1


@triton.jit
def publish_epoch(slots_ptr, pid, epoch, MODE: tl.constexpr):
    """Program ``pid``'s last step: its slot holds ``epoch`` for the next launch (plain store:
    only this program touches the slot within the launch). The CTA barrier first: no thread of
    the program may store the new epoch before every thread has read the old one (``MODE``: the
    ``sync`` mode, an explicit ``bar.sync`` on NVIDIA)."""
    cta_barrier(MODE)
    tl.store(slots_ptr + pid, epoch)


def new_epoch_slots(device: torch.device | str, kernels: int = 1) -> torch.Tensor:
    """Zeroed epoch slots on ``device`` (no launch yet): int32 [EPOCH_SLOTS] for one kernel, or
    [kernels, EPOCH_SLOTS] (row ``i`` for kernel ``i``), bound to no grid yet (``check_grid``; the
    address of a freed buffer may come back here)."""
    shape = (EPOCH_SLOTS,) if kernels == 1 else (kernels, EPOCH_SLOTS)
    slots = torch.zeros(shape, dtype=torch.int32, device=device)
    start, end = slots.data_ptr(), slots.data_ptr() + slots.numel() * slots.element_size()
    for ptr in [p for p in _GRIDS if start <= p < end]:
        del _GRIDS[ptr]
    return slots


def check_grid(slots: torch.Tensor, grid: int, kernel: str) -> None:
    """Bind ``slots`` to ``grid`` programs at its first launch; raise ``ValueError`` when a later
    launch on the same slots uses another grid, or when they have fewer than ``grid`` slots."""
    if slots.numel() < grid:
        raise ValueError(f"{kernel}: {grid} programs need {grid} epoch slots, the buffer holds {slots.numel()} "
                         "(allocate it with new_epoch_slots)")
    bound = _GRIDS.setdefault(slots.data_ptr(), grid)
    if bound != grid:
        raise ValueError(f"{kernel}: launched with {grid} programs on epoch slots that earlier launches used with "
                         f"{bound}: every launch on one epochs buffer needs the same grid (a program that did not "
                         "run before holds a stale epoch); allocate new slots (new_epoch_slots) per configuration")
