"""A device gate: every rank's GPU starts a profiled step at (nearly) the same time.

Why: the profiler's ranks leave their host barrier at different times (tens of microseconds
apart, up to ~100 us on the 4x H200 machine: the Python and profiler overhead between the barrier
and the first launch differs per rank), so each traced step starts skewed. Fine-grained kernels
then wait that skew out on their flags, and bulk-synchronous ones in their collectives, and the
trace shows a rank-skew tax the workload would not pay in a loop that runs ahead of its GPUs.
The model cannot predict the host harness's skew; it can predict a gate's.

How: before a step, each rank enqueues ``gate_kernel`` (one program) on its stream. The kernel
adds one to an arrival counter on every rank's symmetric heap (release, system scope; the adds
to all ranks at once, one thread each), waits until
its own counter reaches ``world_size x epoch`` (a bounded ``sync.wait_geq``: a missing peer is
reported, never waited for forever), then holds for ``hold`` more (its own clock). The hold is
what lets every host enqueue the step (a CUDA graph launch, or eager launches for that long)
behind the gate before its GPU is released, so a rank whose host arrived last does not start
later by its own launch cost. Release spread: one flag's one-way latency between GPUs (each rank
sees the last arrival when that rank's add lands), plus the spread of the ranks' clocks'
reading of it.

Counters only grow (epochs), so the gate needs no reset between steps; a new ``DeviceGate``
(fresh zeroed counter on the heap) per variant, allocated in the same order on every rank.

Host side: ``DeviceGate(heap, rank, world_size, device, spin_timeout_s, hold_s)``; call it before
each step (``gate()``); ``check()`` after the traced loop (a host sync: raises ``RunError`` if a
gate gave up).
"""
from __future__ import annotations

from typing import Any

import iris
import torch
import triton
import triton.language as tl

from taxmodel.kernels.device import sync
from taxmodel.kernels.names import GATE_KERNEL

#: The kernel as traces name it (``taxmodel.trace.capture_meta.GATE_ROLES`` gives it the role "other").
KERNEL_NAME = GATE_KERNEL
#: Kernel id in the error record (``sync.check_errors``).
GATE_KERNEL_ID: tl.constexpr = tl.constexpr(90)


@triton.jit
def taxmodel_gate_kernel(counter_ptr, heap_bases, err_ptr, rank, world_size, target, budget, hold,
                         MODE: tl.constexpr, W_P2: tl.constexpr):
    """Arrive at every rank's counter, wait until all ``world_size`` ranks arrived ``target //
    world_size`` times, then spin ``hold`` more (``sync.spin_budget`` units: 10-ns ticks on AMD, else ns)."""
    # One add per rank, all in flight at once (one thread each): added one after another, each
    # release-add waited for the previous one (~1 us over NVLink), so on 4 H200s the ranks were
    # released in the adder's loop order, 0, ~1 and ~2 us apart.
    peers = tl.arange(0, W_P2)
    tl.debug_barrier()
    iris.atomic_add(counter_ptr + peers * 0, tl.full([W_P2], 1, tl.int32), rank, peers, heap_bases,
                    mask=peers < world_size, sem="release", scope="sys")
    ok = sync.wait_geq(counter_ptr, target, budget, err_ptr, rank, -1, 0, GATE_KERNEL_ID, MODE)
    if ok:
        start = sync.now(MODE)
        held = tl.full((), 0, tl.int64)
        while held < hold:
            held = sync.now(MODE) - start


class DeviceGate:
    """One variant's gate on the symmetric heap (see the module docstring)."""

    def __init__(self, heap: Any, rank: int, world_size: int, device: torch.device | str, spin_timeout_s: float,
                 hold_s: float) -> None:
        if hold_s < 0:
            raise ValueError(f"the gate's hold must be 0 or more seconds, got {hold_s}")
        self.rank, self.world_size = int(rank), int(world_size)
        device = torch.device(device)
        self.mode = sync.sync_mode(device)
        self.counter = heap.zeros(1, torch.int32)  # same offset on every rank: allocated in the same order
        self.heap_bases = heap.heap_bases.to(device)
        self.err = sync.new_error_buffer(device)
        self.budget = sync.spin_budget(spin_timeout_s, self.mode)
        self.hold = sync.spin_budget(hold_s, self.mode) if hold_s > 0 else 0
        self.epoch = 0

    def __call__(self) -> None:
        """Enqueue the gate for the next step on the current stream (returns at once)."""
        self.epoch += 1
        taxmodel_gate_kernel[(1,)](self.counter, self.heap_bases, self.err, self.rank, self.world_size,
                                   self.world_size * self.epoch, self.budget, self.hold, MODE=self.mode,
                                   W_P2=triton.next_power_of_2(self.world_size), num_warps=1)

    def check(self) -> None:
        """Raise ``RunError`` if a gate gave up waiting (a host sync; call it outside traced steps)."""
        sync.check_errors(self.err, f"{KERNEL_NAME} (device alignment before a step: a rank never reached it)",
                           mode=self.mode)
