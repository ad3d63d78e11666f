"""Harness for the multi-rank flash decode tests (no tests here): CPU ranks as processes
(gloo + SharedMemoryHeap), kernels in Triton's interpreter.

Ranks are processes, not threads: Triton's interpreter keeps the program index and its patches
of ``triton.language`` in process-global state, so two thread-ranks running multi-program
kernels at once corrupt each other. Each world size is spawned once and runs a list of
scenarios; every rank saves its results, and the tests check them in the parent.
"""
from __future__ import annotations

import os
import random
import time
import traceback
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from spawn import spawn_ranks

HEAP_BYTES = 1 << 20
JOIN_TIMEOUT_S = 150


def _scenario(ctx, name: str, variant: str, shape_over: dict, steps: int, seeds: list[int]) -> dict:
    from taxmodel.workload import get_workload

    wl = get_workload("flash_decode")
    v = wl.variants()[variant]
    shape = wl.shape("tiny", **shape_over)
    state = wl.setup(ctx, shape, v)
    errors = []
    jitter = random.Random(seeds[0] + ctx.rank)
    for step in range(steps):
        # No barrier between steps: ranks run free (a fast rank may start step e+1 while a slow one
        # still combines step e), shaken by a random delay; only the protocol keeps them in order.
        state.reseed(seeds[step])
        state.poison()
        time.sleep(jitter.uniform(0.0, 0.05))
        v.run(state)
        got = wl.output(state).float()
        want = wl.reference(ctx, shape, state)
        errors.append(dict(nan=bool(torch.isnan(got).any()), max_err=float((got - want).abs().max()),
                           max_ref=float(want.abs().max()), close=bool(torch.allclose(got, want, rtol=2e-2, atol=2e-2))))
    extra = {}
    if variant == "fused":
        extra = dict(epoch=int(state.impl.epoch.item()), arrived=state.impl.arrived_epochs(),
                     config=state.impl.config.label(),
                     counters=state.impl.counters.clone(), splits=state.args.plan.num_splits)
    ctx.barrier()
    return dict(name=name, steps=errors, kv_lens=state.kv_lens, **extra)


def _timeout_scenario(ctx) -> dict:
    """Rank 1 never launches its step: the others' combiners must give up and name rank 1's flag."""
    from taxmodel.errors import RunError
    from taxmodel.workload import get_workload

    wl = get_workload("flash_decode")
    v = wl.variants()["fused"]
    shape = wl.shape("tiny")
    ctx.spin_timeout_s = 0.5
    state = wl.setup(ctx, shape, v)
    message = ""
    started = time.monotonic()
    if ctx.rank != 1:
        v.run(state)
        try:
            wl.output(state)
        except RunError as exc:
            message = str(exc)
    elapsed = time.monotonic() - started
    ctx.barrier()
    return dict(name="timeout", message=message, elapsed=elapsed)


def _rank_main(rank: int, world: int, init_file: str, plan: list, out_dir: str) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    from taxmodel.runtime.context import RankContext
    from taxmodel.runtime.heap import SharedMemoryHeap

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    heap = SharedMemoryHeap(rank, world, HEAP_BYTES)
    ctx = RankContext(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"), backend="gloo",
                      group=None, heap=heap, interpret=True, spin_timeout_s=60.0)
    results = []
    try:
        for item in plan:
            heap.reset()
            if item[0] == "timeout":
                results.append(_timeout_scenario(ctx))
            else:
                results.append(_scenario(ctx, *item))
    except Exception:  # reported by the test with the rank's traceback
        results.append(dict(name="crash", traceback=traceback.format_exc()))
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _spawn(world: int, plan: list, tmp_path: Path) -> list[list[dict]]:
    results = spawn_ranks(_rank_main, (str(tmp_path / "init"), plan, str(tmp_path)), world, tmp_path, JOIN_TIMEOUT_S)
    for r, res in enumerate(results):
        for item in res:
            assert item["name"] != "crash", f"rank {r} crashed:\n{item['traceback']}"
    return results


def _seeds(n: int) -> list[int]:
    return [random.randrange(2**31 - 1) for _ in range(n)]


def _assert_matches(results: list[list[dict]], name: str) -> dict:
    found = None
    for r, res in enumerate(results):
        (item,) = [i for i in res if i["name"] == name]
        for step, e in enumerate(item["steps"]):
            assert not e["nan"], f"{name}: rank {r} step {step} left NaN in the output"
            assert e["close"], f"{name}: rank {r} step {step} error {e['max_err']:.3g} (output scale {e['max_ref']:.3g})"
            assert e["max_ref"] > 0.05  # the reference is not trivially ~0
        found = found or item
    return found


