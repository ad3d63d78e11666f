"""Spawned CPU ranks for the kernel tests: ``world`` processes, a bounded wait, and what each rank
saved to ``<out_dir>/rank<r>.pt``."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.multiprocessing as mp


def spawn_ranks(fn: Callable[..., None], args: tuple, world: int, out_dir: Path, timeout_s: float) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned processes; fail the test (killing them)
    if any still runs after ``timeout_s``; return each rank's saved result, in rank order."""
    pc = mp.start_processes(fn, args=(world, *args), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not pc.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in pc.processes:
                p.kill()
            pytest.fail(f"ranks still running after {timeout_s:.0f} s")
    return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world)]
