"""kernels/device/gate.py: the device gate releases no rank before every rank arrived, reports a rank
that never arrives, and compiles for sm_90 to the code it claims (system-scope arrivals, a hold
timed on the global timer; the hold's length itself is only visible on a GPU)."""
from __future__ import annotations

import os
import threading
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest

from aot import compile_report
from taxmodel.errors import RunError
from taxmodel.kernels.device import gate as device_gate
from taxmodel.runtime.context import run_in_threads

interpreted = pytest.mark.skipif(type(device_gate.taxmodel_gate_kernel).__name__ != "InterpretedFunction",
                                 reason="kernels were imported without TRITON_INTERPRET=1")


@interpreted
def test_no_rank_passes_the_gate_before_the_last_arrives() -> None:
    """Three thread-ranks, three steps; in each step a different rank arrives 0.3 s late. Under the
    interpreter a gate returns when its kernel finished, so every rank's return time must follow
    the late rank's arrival; the counters end at world x steps."""
    world, steps, late_s = 3, 3, 0.3
    arrived = [[0.0] * world for _ in range(steps)]
    passed = [[0.0] * world for _ in range(steps)]
    lock = threading.Lock()

    def rank_fn(ctx):
        gate = device_gate.DeviceGate(ctx.heap, ctx.rank, world, "cpu", spin_timeout_s=30.0, hold_s=20e-6)
        ctx.heap.barrier()
        for step in range(steps):
            if ctx.rank == step % world:
                time.sleep(late_s)
            with lock:
                arrived[step][ctx.rank] = time.perf_counter()
            gate()
            with lock:
                passed[step][ctx.rank] = time.perf_counter()
            ctx.heap.barrier()
        gate.check()
        return int(gate.counter.item()), gate.epoch

    results = run_in_threads(world, rank_fn)
    assert results == [(world * steps, steps)] * world
    for step in range(steps):
        last = max(arrived[step])
        assert arrived[step][step % world] == last  # the late rank was the last to arrive
        assert min(passed[step]) >= last, f"step {step}: a rank passed the gate before the last rank arrived"


@interpreted
def test_a_rank_that_never_arrives_is_reported_not_waited_for() -> None:
    """Rank 1 never calls its gate: rank 0's gate gives up after the spin timeout and check() says so."""

    def rank_fn(ctx):
        gate = device_gate.DeviceGate(ctx.heap, ctx.rank, 2, "cpu", spin_timeout_s=0.05, hold_s=0.0)
        ctx.heap.barrier()
        if ctx.rank == 0:
            gate()
            with pytest.raises(RunError, match="taxmodel_gate_kernel.*gave up waiting") as info:
                gate.check()
            return str(info.value)
        return None

    msg = run_in_threads(2, rank_fn)[0]
    assert "rank 0" in msg and "expected epoch >= 2 and saw 1" in msg


def test_a_negative_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="hold"):
        device_gate.DeviceGate(None, 0, 2, "cpu", spin_timeout_s=1.0, hold_s=-1e-6)


SCRIPT = r'''
from taxmodel.kernels.device import gate as device_gate

PATTERNS = {"sys_release_add": r"(?:atom|red)(?=[\w.]*\.sys)(?=[\w.]*\.release)[\w.]*\.add",
            "globaltimer": r"%globaltimer"}
BODY_PATTERNS = {}
args = [("counter_ptr", "*i32", 0), ("heap_bases", "*i64", 0), ("err_ptr", "*i64", 0), ("rank", "i32", 3),
        ("world_size", "i32", 4), ("target", "i32", 8), ("budget", "i64", 30_000_000_001), ("hold", "i64", 30_000)]
print(json.dumps(dict(gate=build(device_gate.taxmodel_gate_kernel, args, dict(MODE=1, W_P2=4), 1, 1, "gate"))))
'''


@pytest.mark.slow
def test_gate_compiles_for_sm90_with_system_scope_arrivals_and_a_timed_hold(tmp_path_factory) -> None:
    r = compile_report(SCRIPT, tmp_path_factory)["gate"]
    assert r["local"] == 0
    assert r["sys_release_add"] >= 1, r  # arrivals are system-scope release adds to the peers' counters
    # the bounded wait reads the global timer twice (its start, each poll), the hold twice more
    assert r["globaltimer"] >= 4, r
