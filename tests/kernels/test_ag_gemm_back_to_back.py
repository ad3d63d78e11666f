"""Eager back-to-back iterations of the fine-grained AG+GEMM variants, the way bench_instrument runs
them: two states alive on one symmetric heap (different inputs), iterations interleaved between
them with no barrier in between, and one rank sleeping before some of its iterations so that its
peers run ahead of it.

What must hold (the double-buffer argument in push.py): no rank's push of a later iteration may
overwrite rows a slower peer still has to read, and every tile reads its rows only after their
flag holds its iteration. Push gets new A rows every iteration, so rows of the wrong iteration
show in the output; every tile is computed once per iteration of its state. (A single-buffered
push fails here: the slow rank's output holds its peers' next rows.)
"""
from __future__ import annotations

import os
import threading
from dataclasses import replace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from taxmodel.kernels.device.sync import check_errors
from taxmodel.kernels.ag_gemm import gemm_tiles, pull, push
from taxmodel.kernels.ag_gemm.state import make_shard
from taxmodel.kernels.ag_gemm.workload import AgGemm, heap_bytes
from taxmodel.runtime.context import RankContext, run_in_threads

pytestmark = pytest.mark.skipif(type(gemm_tiles.ag_gemm_kernel).__name__ != "InterpretedFunction",
                                reason="kernels were imported without TRITON_INTERPRET=1")

WORLD = 3
SHAPE = {**AgGemm.presets["tiny"], "M": 72}  # M_loc 24: a partial block per slab
#: Which state runs at each step (no barrier between steps). At each slow step the slow rank,
#: after its copy kernel, holds its GEMM back until every peer has run its copy kernel of the
#: next step, a step of the same state: the peers' next iteration lands in its buffers before it
#: reads this one (the furthest ahead a peer can get; in a single buffer the flags it waits on
#: would already hold the next iteration).
SCHEDULE = ["a", "a", "b", "b", "a", "b", "a", "a"]
SLOW_RANK, SLOW_STEPS = 1, {0, 2, 6}


@pytest.fixture
def slow_gemm_on_one_rank(monkeypatch):
    """Per thread-rank step counter (``.now``); rank ``SLOW_RANK`` waits before its GEMM at
    ``SLOW_STEPS`` until the peers' copy kernels of the next step have run."""
    step = threading.local()
    copies: set[tuple[int, int]] = set()  # (rank, step) of every copy-kernel launch done
    cond = threading.Condition()

    def rank_of_thread() -> int:
        return int(threading.current_thread().name.removeprefix("rank"))

    def patch(module):
        launch_gemm, launch_copy = module.launch_ag_gemm, module.launch_copy_blocks

        def copy_then_note(*args, **kwargs):
            out = launch_copy(*args, **kwargs)  # the interpreter runs it to completion
            with cond:
                copies.add((rank_of_thread(), step.now))
                cond.notify_all()
            return out

        def held_back(*args, **kwargs):
            if rank_of_thread() == SLOW_RANK and step.now in SLOW_STEPS:
                def peers_ahead() -> bool:
                    return all((r, step.now + 1) in copies for r in range(WORLD) if r != SLOW_RANK)

                with cond:
                    assert cond.wait_for(peers_ahead, timeout=240), "peers never ran their next copy kernel"
            return launch_gemm(*args, **kwargs)

        monkeypatch.setattr(module, "launch_ag_gemm", held_back)
        monkeypatch.setattr(module, "launch_copy_blocks", copy_then_note)

    patch(push)
    patch(pull)
    return step


def _inputs_of(variant: str, seed: int, run: int) -> int:
    """The seed of a state's A rows in its ``run``-th iteration. Push: new rows every iteration
    (each rank rewrites its own shard between its iterations, which push allows without a barrier:
    only its own copy kernel and GEMM read that shard), so a peer's push of the next iteration
    landing in the rows a rank is still to read shows as a wrong output. Pull: fixed rows (peers
    read the shard itself, so changing it needs a barrier)."""
    return seed * 100 + run if variant == "push" else seed


@pytest.mark.parametrize("variant", ["push", "pull"])
def test_two_states_back_to_back_with_a_rank_behind(variant: str, slow_gemm_on_one_rank) -> None:
    cfg = replace(gemm_tiles.CPU_CONFIG, transport="sm", push_chunk_k=32)  # two K pieces per block
    wl = AgGemm(cfg)
    seeds = {"a": 11, "b": 12}
    dtype = torch.float32
    nbytes = 2 * heap_bytes(SHAPE, WORLD, variant, dtype, cfg)

    def body(ctx: RankContext):
        v = wl.variants()[variant]
        states = {k: wl.setup(ctx, {**SHAPE, "seed": s}, v) for k, s in seeds.items()}  # same heap, in order
        for st in states.values():
            st.enable_debug_counters()
        ctx.barrier()
        runs = {k: 0 for k in states}
        seen = []
        for step, key in enumerate(SCHEDULE):
            st = states[key]
            slow_gemm_on_one_rank.now = step
            seed = _inputs_of(variant, seeds[key], runs[key] + 1)
            shards = [make_shard(seed, r, st.m_loc, st.k, st.dtype, st.c.device) for r in range(WORLD)]
            st.a_local.copy_(shards[ctx.rank])  # no-op for pull (same seed as at setup)
            st.poison()
            st.seen.fill_(-1)
            v.run(st)  # the interpreter runs the launches to completion: C is final here
            runs[key] += 1
            check_errors(st.err, variant, ctx)
            ref = torch.cat(shards).float() @ st.b.float()
            torch.testing.assert_close(st.c.float(), ref, rtol=1e-4, atol=1e-4)
            seen.append((runs[key], st.seen.clone()))
        counts = {k: (runs[k], st.count.clone()) for k, st in states.items()}
        ctx.barrier()
        return seen, counts

    results = run_in_threads(WORLD, body, heap_bytes=nbytes + (1 << 16), timeout_s=300, spin_timeout_s=60)
    for seen, counts in results:
        for epoch, s in seen:
            assert s.tolist() == [epoch] * s.numel()  # every tile's flag held its iteration before it read
        for runs, count in counts.values():
            assert count.tolist() == [runs] * count.numel()  # every tile once per iteration of its state
