"""`taxmodel calibrate`'s ll step: the fused flash decode's LL pushes and merges, measured on their own
with the kernel's own device functions (``flash_decode/fused.py``'s ``_push_rows`` and
``_combine_rows``), where the model took numbers fitted on the 4x H200 bundles before (issue 33).

Push (every rank at once, two ranks or more): ``P`` programs each push one head group's combined
partial (``R`` query rows x (D + 1) fp32 values as 8-byte LL words) into every rank's receive
buffer, ``reps`` times in a row inside one launch, as the fused kernel's pushing CTAs do once per
step. The time per push over two values of ``reps`` (the launch cancels) gives the GPU's bandwidth
for LL pushes with ``P`` CTAs pushing at once: ``ll_push_bytes_per_s`` (peers' bytes only).

Merge (one GPU): ``P`` programs each merge ``n`` ranks' partials of their rows from LL words that
already hold the epoch (``_combine_rows``: poll the words, then fold them in), for two values of
``n``; the difference per source is one merge step, ``ll_merge_step_s``, without any wait for a
peer (the model adds the wait for the slowest rank itself).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from taxmodel.kernels.flash_decode.fused import _combine_rows, _push_rows
from taxmodel.runtime.timing import kernel_seconds, median_seconds, on_gpu, synchronize

#: Rows per program (a head group of 32 query heads over 4 KV heads) and the head dimension.
ROWS, HEAD_DIM = 8, 128
#: Programs pushing or merging at once (the fused kernel's pushers at batch 16: 16 x 4 KV heads).
PROGRAMS = 64
#: Pushes per launch (short, long) and sources per merge (short, long).
PUSH_REPS = (4, 36)
MERGE_SOURCES = (2, 34)
#: Launches traced per point.
REPEATS = 7
#: Kernel id in the error record of a merge that gave up (a constexpr: a jit function reads it).
MERGE_KERNEL_ID: tl.constexpr = tl.constexpr(97)


@triton.jit(do_not_specialize=["rank"])
def ll_push_kernel(recv_ptr, flag_ptr, heap_bases, rank, world_size, rows_total, reps,
                   R: tl.constexpr, R_P2: tl.constexpr, D: tl.constexpr):
    """Program p pushes rows p*R .. p*R+R-1 (ones, lse 0) into every rank, ``reps`` times, epochs 1.."""
    pid = tl.program_id(0)
    slot = rows_total * (D + 1)
    out = tl.full([R_P2, D], 1.0, tl.float32)
    lse = tl.zeros([R_P2], tl.float32)
    recv = recv_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    for rep in range(reps):
        epoch = rep + 1
        _push_rows(recv, epoch % 2, pid * R, pid, out, lse, epoch, flag_ptr, rank, world_size, rows_total, slot,
                   heap_bases, R, R_P2, D, True)


@triton.jit
def ll_merge_kernel(recv_ptr, out_ptr, err_ptr, budget, sources, rows_total,
                    R: tl.constexpr, R_P2: tl.constexpr, D: tl.constexpr, MODE: tl.constexpr):
    """Program p merges ``sources`` ranks' partials of its rows, every LL word already at epoch 1."""
    pid = tl.program_id(0)
    slot = rows_total * (D + 1)
    no_out = tl.zeros([R_P2, D], tl.float32)
    no_lse = tl.zeros([R_P2], tl.float32)
    recv = recv_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    t = tl.full((), 0, tl.int64)
    _combine_rows(pid * R, pid, no_out, no_lse, False, recv, 1, out_ptr, err_ptr, 1, budget, err_ptr, 0, sources,
                  rows_total, slot, err_ptr, pid, t, R, R_P2, D, 1, True, MERGE_KERNEL_ID, MODE, False)


def _sizes(device: torch.device) -> tuple[int, int, int]:
    """(programs, rows per program, head dim): the workloads' on a GPU, tiny in the interpreter."""
    return (PROGRAMS, ROWS, HEAD_DIM) if on_gpu(device) else (2, 2, 16)


def measure_push(device: torch.device, heap, rank: int, world: int, barrier) -> dict:
    """Per ``reps``: the push kernel's median time (s); every rank pushes at once."""
    programs, rows, d = _sizes(device)
    rows_total = programs * rows
    recv = heap.zeros((2, world, rows_total * (d + 1)), torch.int64)
    dummy = torch.zeros(1, dtype=torch.int32, device=device)
    bases = heap.heap_bases
    runs = REPEATS if on_gpu(device) else 1

    def launch(reps: int) -> None:
        ll_push_kernel[(programs,)](recv, dummy, bases, rank, world, rows_total, reps, R=rows,
                                    R_P2=triton.next_power_of_2(rows), D=d, num_warps=4)

    out = {"programs": programs, "rows": rows, "head_dim": d, "world": world, "reps": list(PUSH_REPS), "push_s": []}
    for reps in PUSH_REPS:
        launch(reps)  # compiles (the same kernel for both: reps is a runtime value)
        synchronize(device)
        barrier()
        t = kernel_seconds(device, lambda reps=reps: [launch(reps) for _ in range(runs)], {"push": "ll_push_kernel"})
        out["push_s"].append(median_seconds(t, "push", "LL push"))
    barrier()
    return out


def ll_words(values: torch.Tensor, epoch: int) -> torch.Tensor:
    """fp32 ``values`` as LL words of ``epoch`` (``ll.pack`` on the host)."""
    bits = values.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return bits | (int(epoch) << 32)


def measure_merge(device: torch.device) -> dict:
    """Per number of sources: the merge kernel's median time (s) on words that all hold the epoch."""
    from taxmodel.kernels.device import sync

    programs, rows, d = _sizes(device)
    rows_total = programs * rows
    slot = rows_total * (d + 1)
    out = torch.empty((rows_total, d), dtype=torch.bfloat16 if on_gpu(device) else torch.float32, device=device)
    err = sync.new_error_buffer(device)
    mode = sync.sync_mode(device)
    budget = sync.spin_budget(5.0, mode)
    runs = REPEATS if on_gpu(device) else 1
    res = {"programs": programs, "rows": rows, "head_dim": d, "sources": list(MERGE_SOURCES), "merge_s": []}
    for n in MERGE_SOURCES:
        recv = torch.zeros((2, n, slot), dtype=torch.int64, device=device)  # [parity, source, words]
        recv[1].copy_(ll_words(torch.randn(n, slot, device=device) * 0.1, 1))  # epoch 1: odd parity

        def launch(n: int = n, recv: torch.Tensor = recv) -> None:
            ll_merge_kernel[(programs,)](recv, out, err, budget, n, rows_total, R=rows,
                                        R_P2=triton.next_power_of_2(rows), D=d, MODE=mode, num_warps=4)

        launch()
        synchronize(device)
        t = kernel_seconds(device, lambda: [launch() for _ in range(runs)], {"merge": "ll_merge_kernel"})
        res["merge_s"].append(median_seconds(t, "merge", "LL merge"))
    sync.check_errors(err, "calibration LL merge", None, mode)
    return res
