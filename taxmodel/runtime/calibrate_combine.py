"""`taxmodel calibrate`'s combine step: the serial step of the flash decode combine, measured.

A combine program for R query rows folds its S partials NB at a time, each fold waiting for its
loads (``kernels/flash_decode/combine.py``), so with few programs the kernel is a chain of
latency-bound steps and the model needs the time of one (``ModelParams.combine_step_s``). That time
depends on where the partials are when the combine reads them; on one H200 the same local combine
kernel took 0.22-0.70 us a step on partials it had just read itself, 1.2-1.8 us after 512 MB were
written over the L2, and 0.42-1.29 us queued right after the split-KV kernel that wrote them, as
the bsp variant runs it (more after longer K/V; why is not established). So the step is measured
in that last setting: the split-KV kernel and then the local combine (one program per KV head,
``bsp_slices`` 1), over a grid of batch sizes and K/V lengths, each kernel's duration from a
profiler trace; ``taxmodel.model.calibration.combine_step_seconds`` turns the rows into the step. One GPU, a few seconds; rank 0 runs it.
"""
from __future__ import annotations

import statistics

import torch

from taxmodel.kernels.names import FLASH_DECODE_COMBINE_LOCAL, FLASH_DECODE_SPLIT

#: (batch, keys per rank) of the grid, with 32 query heads, 4 KV heads, head dim 128, bf16.
GRID: tuple[tuple[int, int], ...] = tuple((b, kv) for b in (1, 16) for kv in (1024, 4096, 16384, 65536, 262144))
Q_HEADS, KV_HEADS, HEAD_DIM = 32, 4, 128
#: Split + combine pairs traced per grid point (after a warm-up that compiles both kernels).
ITERATIONS = 20
#: A grid point is skipped when its K and V would take more than this share of the free memory.
MEMORY_SHARE = 0.25


def measure(device: torch.device, grid: tuple[tuple[int, int], ...] = GRID, iterations: int = ITERATIONS) -> dict:
    """Per grid point: the splits, the combine's serial steps and both kernels' median durations (s)."""
    rows, skipped = [], []
    for batch, kv_len in grid:
        kv_bytes = 2 * batch * KV_HEADS * kv_len * HEAD_DIM * 2
        free, _ = torch.cuda.mem_get_info(device)
        if kv_bytes > MEMORY_SHARE * free:
            skipped.append([batch, kv_len])
            continue
        rows.append(_point(device, batch, kv_len, iterations))
        torch.cuda.empty_cache()
    return {"q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "rows": rows, "skipped": skipped}


def _point(device: torch.device, batch: int, kv_len: int, iterations: int) -> dict:
    """One grid point: split-KV then the local combine, traced ``iterations`` times."""
    from taxmodel.kernels.flash_decode.combine import combine_block, launch_combine_local, packed_size
    from taxmodel.kernels.flash_decode.split_kv import (SplitConfig, SplitKVArgs, cdiv, device_sm_count,
                                                         launch_split_kv, partial_buffers, plan_splits)
    from taxmodel.runtime.timing import kernel_seconds

    cfg = SplitConfig()
    group = Q_HEADS // KV_HEADS
    q = torch.randn(batch, Q_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    k = torch.randn(batch, KV_HEADS, kv_len, HEAD_DIM, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    args = SplitKVArgs(q, k, v, kv_len, plan_splits(batch, KV_HEADS, kv_len, device_sm_count(device), cfg), cfg)
    part_out, part_lse = partial_buffers(args)
    send = torch.empty(packed_size(batch * Q_HEADS, HEAD_DIM), dtype=torch.float32, device=device)

    def step() -> None:  # queued back to back, as the bsp variant enqueues them
        launch_split_kv(args, part_out, part_lse)
        launch_combine_local(args, part_out, part_lse, send)

    for _ in range(3):
        step()
    torch.cuda.synchronize(device)

    def body() -> None:
        for _ in range(iterations):
            step()
            torch.cuda.synchronize(device)

    durations = kernel_seconds(device, body, {"split": FLASH_DECODE_SPLIT, "combine": FLASH_DECODE_COMBINE_LOCAL})
    split, comb = durations["split"], durations["combine"]
    if not comb or not split:
        raise RuntimeError("the profiler trace has no flash decode kernels (no GPU profiler?)")
    return {"batch": batch, "kv_len": kv_len, "splits": args.plan.num_splits, "rows": group,
            "steps": cdiv(args.plan.num_splits, combine_block(group)), "kernels": int(len(comb)),
            "split_s": float(statistics.median(split)), "combine_s": float(statistics.median(comb))}
