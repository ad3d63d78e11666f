"""`taxmodel calibrate`'s sync step: what one flag wait costs a program when the flag is already set.

``kernels/device/sync.py``'s ``wait_geq`` polls the flag, then every thread meets at a barrier, one
thread re-reads the flag with an acquire atomic (system scope, or GPU scope for flags only this
GPU's programs release) and all meet again. A program that waits on several flags one after
another (the fused flash decode's flags protocol waits on every rank's flag of its head group)
pays that fixed cost per flag even when every flag landed long ago. Measured on one GPU: one
4-warp program waits on ``n`` flags that are all set, for two values of ``n``; the difference of
the kernel times over the difference of ``n`` is the cost of one wait (the launch cancels). Rank
0 runs it, in a second.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from taxmodel.kernels.device import sync
from taxmodel.runtime.timing import median_ms

#: Waits per launch of the short and the long run.
WAITS = (16, 1040)
REPETITIONS = 7


@triton.jit
def _wait_set_flags_kernel(flags_ptr, err_ptr, out_ptr, n, budget, GPU_SCOPE: tl.constexpr, MODE: tl.constexpr):
    """Wait on flags 0 .. n-1 in order (each already 1): n fixed costs of one wait."""
    ok = tl.full((), 0, tl.int32)
    for i in range(n):
        ok += sync.wait_geq(flags_ptr + i, 1, budget, err_ptr, 0, 0, i, 0, MODE, GPU_SCOPE).to(tl.int32)
    tl.store(out_ptr, ok)


def measure(device: torch.device) -> dict:
    """Seconds per wait on a set flag, system and GPU scope, with the kernel times behind them."""
    mode = sync.sync_mode(device)
    budget = sync.spin_budget(5.0, mode)
    flags = torch.ones(max(WAITS), dtype=torch.int64, device=device)
    err = sync.new_error_buffer(device)
    out = torch.zeros(1, dtype=torch.int32, device=device)
    res: dict = {"waits": list(WAITS)}
    for name, gpu_scope in (("sys", False), ("gpu", True)):
        ms = {}
        for n in WAITS:
            def launch() -> None:
                _wait_set_flags_kernel[(1,)](flags, err, out, n, budget, GPU_SCOPE=gpu_scope, MODE=mode, num_warps=4)

            ms[str(n)] = median_ms(launch, device=device, reps=REPETITIONS, warmup=3)
            if int(out.item()) != n:
                raise RuntimeError(f"the set-flag probe saw {int(out.item())} of {n} flags set")
        sync.check_errors(err, "calibration flag waits", None, mode)
        res[f"{name}_ms"] = ms
        res[f"flag_wait_{name}_s"] = (ms[str(WAITS[1])] - ms[str(WAITS[0])]) * 1e-3 / (WAITS[1] - WAITS[0])
    return res
