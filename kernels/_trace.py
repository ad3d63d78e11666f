"""In-kernel trace records: what each CTA of a fused kernel did, and when.

A kernel-level trace sees a fused kernel as one opaque block: the time its CTAs spend waiting on
flags, or only moving data, is invisible. With ``INSTRUMENT`` set (a ``tl.constexpr``, so the
normal build compiles none of this), each CTA appends records ``(cta, phase id, start, end)`` to
a device buffer; the host (``taxmodel.runtime.records``) drains them and the ledger turns
flag waits and communication-only phases into bulk-synchronous tax.

Buffer layout (int64, allocated by ``taxmodel.runtime.records.RecordBuffer``)::

    buf[0]                      cursor: records appended so far (may exceed the capacity)
    buf[1]                      capacity in records
    buf[HEADER + 4*i + 0..3]    record i: cta, phase id, start, end

A record takes a slot with one atomic add on the cursor; a CTA whose slot lies past the capacity
drops its record (the host reports how many were dropped: ``cursor - capacity``).

Timestamps come from ``_sync.now(MODE)``: %globaltimer ns on NVIDIA, s_memrealtime 10-ns ticks on
AMD, the host's monotonic ns under Triton's interpreter. Phases are chained: a CTA reads the
clock once per boundary and each phase ends where the next starts, so a CTA's phases never
overlap and sum to its lifetime (first start to last end).

Device functions:
    begin(INSTRUMENT, MODE) -> t0                        first timestamp of a CTA (0 when off)
    mark(rec_ptr, cta, phase, t_start, INSTRUMENT, MODE) -> t_end
                                                         record [t_start, now) as ``phase``; returns now
"""
from __future__ import annotations

import triton
import triton.language as tl

from taxmodel.kernels import _sync

#: Phases a fused kernel can record, in id order (the id is what the kernel writes).
PHASES: tuple[str, ...] = ("flag_wait", "remote_load", "compute", "store_push", "combine")
PHASE_ID: dict[str, int] = {p: i for i, p in enumerate(PHASES)}
#: Phases in which a CTA only moves data between GPUs (no computation): bulk-synchronous tax.
COMM_PHASES: tuple[str, ...] = ("remote_load", "store_push")

FLAG_WAIT: tl.constexpr = tl.constexpr(PHASE_ID["flag_wait"])
REMOTE_LOAD: tl.constexpr = tl.constexpr(PHASE_ID["remote_load"])
COMPUTE: tl.constexpr = tl.constexpr(PHASE_ID["compute"])
STORE_PUSH: tl.constexpr = tl.constexpr(PHASE_ID["store_push"])
COMBINE: tl.constexpr = tl.constexpr(PHASE_ID["combine"])

#: int64 words before the first record; one record is RECORD_WORDS words.
HEADER = 2
RECORD_WORDS = 4
HEADER_C: tl.constexpr = tl.constexpr(HEADER)


@triton.jit
def begin(INSTRUMENT: tl.constexpr, MODE: tl.constexpr):
    """The CTA's first timestamp (a constant 0 when not instrumented, which the compiler drops)."""
    if INSTRUMENT:
        t = _sync.now(MODE)
    else:
        t = tl.full((), 0, tl.int64)
    return t


@triton.jit
def mark(rec_ptr, cta, phase, t_start, INSTRUMENT: tl.constexpr, MODE: tl.constexpr):
    """Append the record (cta, phase, t_start, now) and return now, the next phase's start.

    Every thread of the CTA must be done with the phase first (a barrier), so the end time covers
    the slowest thread; the slot is taken once per CTA (scalar atomic).
    """
    if INSTRUMENT:
        tl.debug_barrier()
        t_end = _sync.now(MODE)
        slot = tl.atomic_add(rec_ptr, tl.full((), 1, tl.int64), sem="relaxed", scope="gpu")
        cap = tl.load(rec_ptr + 1)
        if slot < cap:
            base = rec_ptr + HEADER_C + slot * 4
            tl.store(base, tl.cast(cta, tl.int64))
            tl.store(base + 1, tl.cast(phase, tl.int64))
            tl.store(base + 2, tl.cast(t_start, tl.int64))
            tl.store(base + 3, t_end)
    else:
        t_end = t_start
    return t_end
