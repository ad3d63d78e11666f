"""`taxmodel calibrate`'s fused_combine step: the fused flash decode kernel's in-kernel local combine,
measured on the workload's own kernels (issue 33).

In the fused kernel (``kernels/flash_decode/fused.py``) the last worker of each (batch, KV head)
pair folds the pair's S split partials (``combine_tile``, ceil(S / NB) serial steps), then pushes
and merges. The combine step (``calibrate_combine``) times the same fold in the *separate* local
combine kernel queued after the split kernel, and inside the fused kernel it runs at another rate
(in-sample records on 2-8 H200s: 22 steps in 15.1-15.4 us, 0.69 us a step against the combine
step's 0.87; 2 steps with 64 pairs at once in 2.7-4.0 us): so this step times the fused kernel
itself. At world size 1 (a one-rank heap, ``microbench.LocalHeap``, as ``taxmodel profile -n 1``
runs it: the push goes to the rank's own memory, no wait has a peer) the fused kernel is the split
work plus the tail after a pair's last split: its local combine, the push to itself, the merge of its
own partial and the output rows. The split-KV kernel alone on the same inputs and the same plan (the
workload's planner and tile config) is the split work, so per shape the difference of the two
kernels' median traced durations is the tail; ``taxmodel.model.calibration.fused_combine_fit`` fits
tail = fixed + steps x step over the grid (``fused_local_combine_fixed_s``,
``fused_local_combine_step_s``).

The grid is not the validated presets (batch 1 at KV 16K, batch 16 at KV 1K): batch 1 (4 pairs at
once) at KV 512-128K gives 2-25 steps on a 132-SM GPU; batches 4-16 (16-64 pairs at once) at short
KV give 1-6 steps. Each shape runs the split kernel and then the fused kernel, ``ITERATIONS`` times
(each kernel preceded by a read of the same K/V, as in the workload's steps), after a warm-up that
compiles both; kernel durations from a profiler trace (``timing.kernel_seconds``), as the
combine step times its kernels. One GPU, rank 0, a few seconds after the compiles.
"""
from __future__ import annotations

import statistics

import torch

from taxmodel.kernels.names import FLASH_DECODE_FUSED, FLASH_DECODE_SPLIT
from taxmodel.runtime.microbench import LocalHeap
from taxmodel.runtime.timing import kernel_seconds, on_gpu, synchronize

#: (batch, keys) of the GPU grid, with 32 query heads, 4 KV heads, head dim 128, bf16: not the
#: validated presets' shapes (b1-kv16k, b16-kv1k), so the model is checked on shapes it was not fit on.
GRID: tuple[tuple[int, int], ...] = ((1, 512), (1, 2048), (1, 8192), (1, 32768), (1, 131072),
                                     (4, 4096), (8, 2048), (16, 512), (16, 4096))
Q_HEADS, KV_HEADS, HEAD_DIM = 32, 4, 128
#: Tiny shapes for Triton's interpreter (CPU tests): the same code paths, a few programs.
CPU_GRID: tuple[tuple[int, int], ...] = ((1, 64), (2, 48))
CPU_DIMS = (8, 2, 16)
#: Split + fused pairs traced per grid point.
ITERATIONS = 20
#: A grid point is skipped when its K and V would take more than this share of the free memory.
MEMORY_SHARE = 0.25
#: Bound of the fused kernel's waits (there is no peer at world size 1; a wait that never ends is a bug).
SPIN_TIMEOUT_S = 10.0


def measure(device: torch.device, grid: tuple[tuple[int, int], ...] | None = None,
            iterations: int | None = None) -> dict:
    """Per grid point: the plan (splits, pairs, rows, the local combine's steps), both kernels'
    median durations (s) and their difference (``tail_s``). On CPU (interpreter) the tiny grid,
    one iteration, and host times that say nothing about a GPU."""
    gpu = on_gpu(device)
    hq, hkv, d = (Q_HEADS, KV_HEADS, HEAD_DIM) if gpu else CPU_DIMS
    grid = grid if grid is not None else (GRID if gpu else CPU_GRID)
    iterations = iterations or (ITERATIONS if gpu else 1)
    rows, skipped = [], []
    for batch, kv_len in grid:
        if torch.device(device).type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            if 2 * batch * hkv * kv_len * d * 2 > MEMORY_SHARE * free:
                skipped.append([batch, kv_len])
                continue
        rows.append(_point(device, batch, kv_len, (hq, hkv, d), iterations))
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return {"q_heads": hq, "kv_heads": hkv, "head_dim": d, "world_size": 1, "rows": rows, "skipped": skipped}


def fused_state(device: torch.device, batch: int, kv_len: int, dims: tuple[int, int, int]):
    """The workload's fused kernel at world size 1 on its own inputs (seed 0, rank 0) and plan:
    (the fused state, its split-KV args). ``fused.launch_fused`` runs one step."""
    from taxmodel.kernels.flash_decode import fused
    from taxmodel.kernels.flash_decode.reference import make_kv_shard, make_query
    from taxmodel.kernels.flash_decode.split_kv import SplitKVArgs, plan_splits
    from taxmodel.kernels.flash_decode.workload import planner_sm_count, split_config
    from taxmodel.runtime.context import RankContext

    hq, hkv, d = dims
    q = make_query(0, batch, hq, d, torch.bfloat16, device)
    k, v = make_kv_shard(0, 0, batch, hkv, kv_len, d, torch.bfloat16, device)
    cfg = split_config({}, device)
    sms = planner_sm_count(device)
    args = SplitKVArgs(q, k, v, kv_len, plan_splits(batch, hkv, kv_len, sms, cfg), cfg)
    out = torch.full((batch, hq, d), float("nan"), dtype=q.dtype, device=device)
    heap = LocalHeap(fused.heap_bytes(batch, hq, hkv, d, 1), device)
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device(device), backend="none", heap=heap,
                      spin_timeout_s=SPIN_TIMEOUT_S)
    state = fused.make_fused_state(ctx, args, out, sms, fused.FusedConfig())
    fused.warmup_fused(state)
    return state, args


def _point(device: torch.device, batch: int, kv_len: int, dims: tuple[int, int, int], iterations: int) -> dict:
    """One grid point: the split-KV kernel then the fused kernel, traced ``iterations`` times."""
    from taxmodel.kernels.flash_decode import fused
    from taxmodel.kernels.flash_decode.combine import combine_block
    from taxmodel.kernels.flash_decode.split_kv import cdiv, launch_split_kv, partial_buffers

    state, args = fused_state(device, batch, kv_len, dims)
    part_out, part_lse = partial_buffers(args)  # the split kernel's own (the fused kernel keeps its)

    def step() -> None:
        launch_split_kv(args, part_out, part_lse)
        fused.launch_fused(state)

    for _ in range(3):
        step()
    synchronize(device)
    fused.check_fused(state)

    def body() -> None:
        for _ in range(iterations):
            step()
            synchronize(device)

    durations = kernel_seconds(device, body, {"split": FLASH_DECODE_SPLIT, "fused": FLASH_DECODE_FUSED})
    fused.check_fused(state)  # no wait gave up (a RunError naming the kernel otherwise)
    split, whole = durations["split"], durations["fused"]
    if not split or not whole:
        raise RuntimeError("the profiler trace has no flash decode split or fused kernels (no GPU profiler?)")
    if not bool(torch.isfinite(state.out.float()).all()):
        raise RuntimeError(f"the fused kernel left non-finite output rows at batch {batch}, KV {kv_len}")
    split_s, fused_s = float(statistics.median(split)), float(statistics.median(whole))
    group = args.group
    return {"batch": batch, "kv_len": kv_len, "splits": args.plan.num_splits, "pairs": batch * args.kv_heads,
            "rows": group, "steps": cdiv(args.plan.num_splits, combine_block(group)), "kernels": int(len(whole)),
            "split_s": split_s, "fused_s": fused_s, "tail_s": fused_s - split_s}
