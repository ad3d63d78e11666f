"""A late producer on CPU ranks, for the in-kernel record tests of every fused workload: two ranks
(processes, gloo, a shared-memory heap, Triton's interpreter) run two instrumented steps; before
the second, rank ``LATE_RANK`` sleeps ``DELAY_S`` on the host. The records of both steps come
back per rank, so a test can check that the consumers' flag_wait grew by about the delay.
"""
from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp

DELAY_S = 2.0  # long against the interpreter's own jitter on a loaded 2-core machine
LATE_RANK = 1

#: ``prepare(ctx)`` (a module-level function, so that spawned ranks can import it) sets a variant up
#: on the rank and returns (step, finish): one instrumented step, and a check run after both steps
#: (raising if a kernel gave up waiting).
Prepare = Callable[[Any], "tuple[Callable[[], None], Callable[[], None]]"]


def _rank(rank: int, world: int, init_file: str, out_dir: str, prepare: Prepare) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    from taxmodel.runtime.context import RankContext
    from taxmodel.runtime.heap import SharedMemoryHeap

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    heap = SharedMemoryHeap(rank, world, 1 << 20)
    ctx = RankContext(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"), backend="gloo",
                      group=None, heap=heap, interpret=True, spin_timeout_s=60.0, instrument=True)
    out: dict = {}
    try:
        step, finish = prepare(ctx)
        ctx.records.arm(2)
        for it in range(2):  # step 0: no delay; step 1: the late rank starts DELAY_S after the others
            ctx.barrier()
            ctx.records.set_iteration(it)
            if it == 1 and rank == LATE_RANK:
                time.sleep(DELAY_S)
            step()
        finish()
        out["records"] = ctx.records.drain(rank)
        ctx.barrier()
    except Exception as exc:  # noqa: BLE001 - reported by the test
        out["error"] = traceback.format_exc() + str(exc)
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def late_producer_records(prepare: Prepare, tmp: Path, world: int = 2, timeout_s: float = 150.0) -> list[pd.DataFrame]:
    """Run the two steps on ``world`` spawned ranks; every rank's drained records (both steps)."""
    pc = mp.start_processes(_rank, args=(world, str(tmp / "init"), str(tmp), prepare), nprocs=world, join=False,
                            start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not pc.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in pc.processes:
                p.kill()
            pytest.fail(f"ranks still running after {timeout_s:.0f} s")
    res = [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(world)]
    for r, item in enumerate(res):
        assert "error" not in item, f"rank {r}: {item['error']}"
    return [item["records"] for item in res]
