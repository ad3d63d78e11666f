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
import torch

from spawn import spawn_ranks

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
    res = spawn_ranks(_rank, (str(tmp / "init"), str(tmp), prepare), world, tmp, timeout_s)
    for r, item in enumerate(res):
        assert "error" not in item, f"rank {r}: {item['error']}"
    return [item["records"] for item in res]


def assert_delay_is_flag_wait(delayed: list[pd.DataFrame], wait_of: Callable[[pd.DataFrame, int], pd.Series]) -> pd.Series:
    """The delayed step's records on two ranks: the early rank's waiting CTAs (``wait_of(records,
    iteration)``: seconds of flag_wait per CTA) waited about the delay, the late rank hardly at all.
    Returns the early rank's waits in the delayed step."""
    early, late_rank = delayed
    waited = wait_of(early, 1)
    # the early rank waits for the late one, which started DELAY_S late, less the time the early
    # rank spent on its own work (which the late rank spends too, after its delay); a loaded
    # machine can delay the early rank too, shortening its wait: hence the loose lower bound
    assert waited.max() >= 0.25 * DELAY_S, waited
    assert waited.sum() <= DELAY_S + 30.0
    # the late rank finds every flag already set: it waits much less than the early one
    late = wait_of(late_rank, 1).sum()
    assert late < 0.3 * DELAY_S and late < waited.max(), late
    return waited
