"""In-kernel trace records: what each CTA of a fused kernel did, and when.

A kernel-level trace sees a fused kernel as one opaque block: the time its CTAs spend waiting on
flags, or only moving data, is invisible. With ``INSTRUMENT`` set (a ``tl.constexpr``, so the
normal build compiles none of this), each CTA writes records ``(cta, phase id, start, end)`` to
a device buffer; the host (``taxmodel.runtime.records``) drains them and the ledger turns
flag waits and communication-only phases into bulk-synchronous tax.

Buffer layout (int64, allocated by ``taxmodel.runtime.records.new_buffer``)::

    buf[0]                      records dropped (fixed slots) / cursor (append mode)
    buf[1]                      logical CTA ids (``ctas``)
    buf[2]                      records per CTA id (``per_cta``)
    buf[3]                      0: fixed slots, 1: append mode
    buf[4 .. HEADER-1]          unused (the header fills one 128-byte line of its own)
    buf[HEADER + 4*s + 0..3]    slot s: cta, phase id + 1 (0: never written), start (low 48 bits), end

Fixed slots (the default; why: a record must cost almost nothing on the critical path). Logical
CTA id ``cta`` owns the ``per_cta`` slots from ``cta * per_cta``; the CTA's k-th record goes to
slot ``cta * per_cta + k``. Nothing is shared between CTAs, so no atomic: the slot index comes
from the CTA's own count, threaded through the clock value ``t`` that ``begin``/``mark`` already
pass along (``t = (clock low 48 bits << 16) | k``; 2^48 ns is 78 hours). A record with
``k >= per_cta`` or ``cta`` outside ``[0, ctas)`` is dropped, never written out of bounds; each
drop adds one to ``buf[0]`` (an atomic only on that rare path). The bounds are constants: the
``INSTRUMENT`` constexpr is the layout's code ``ctas << 16 | per_cta`` (``RecordLayout.code``,
sizes rounded up to powers of two so one build serves a size class). Reading them from the
header instead (three loads per record) cost 14-16% on a 14 us fused flash decode step on the
H200s, against 3-8% with constants: the loads missed L1 after the KV stream (see ``mark``).
``INSTRUMENT = 1`` (or True) still reads the sizes and the mode from the header: graph profiling's
append mode needs it. A buffer holds the last launch's records: a second
launch into the same buffer rewrites the slots (a CUDA-graph replay rewrites the same slots, so
its overhead is the real cost), and slots a later launch did not reach keep older records.

Append mode (``buf[3] = 1``; only ``taxmodel.runtime.graph.GraphRecordSlots``): one buffer
collects every replay of a captured graph over a repetition, which fixed slots cannot (each
replay would overwrite the previous one). A record takes the next slot with one atomic add on
the cursor ``buf[0]`` (a round trip to L2 on the critical path: the old cost) and is dropped
when the cursor passes ``ctas * per_cta``; the host counts ``cursor - capacity`` as dropped.

Record words: ``end`` is the full clock at the mark, ``start`` the low 48 bits of the phase's start
(all ``t`` keeps); the host restores it as ``end - ((end - start) mod 2^48)``, exact for phases
shorter than 2^48 ticks, so every record carries absolute device times.

Timestamps come from ``sync.now(MODE)``: %globaltimer ns on NVIDIA, s_memrealtime 10-ns ticks on
AMD, the host's monotonic ns under Triton's interpreter. Phases are chained: a CTA reads the
clock once per boundary and each phase ends where the next starts, so a CTA's phases never
overlap and sum to its lifetime (first start to last end).

Device functions:
    begin(INSTRUMENT, MODE) -> t0                        first timestamp of a CTA, k = 0 (0 when off)
    mark(rec_ptr, cta, phase, t_start, INSTRUMENT, MODE) -> t_end
                                                         record [t_start, now) as ``phase`` in the
                                                         CTA's slot k; returns (now, k + 1)
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from taxmodel.kernels.device import sync

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

#: int64 words before the first slot: the header has a 128-byte cache line to itself (record
#: stores never touch the line every mark reads), and every 4-word record is one 32-byte sector.
HEADER = 16
RECORD_WORDS = 4
#: Header words.
DROPPED_WORD, CTAS_WORD, PER_CTA_WORD, APPEND_WORD = 0, 1, 2, 3
#: Bits of ``t`` below the clock: the CTA's record count k (saturates at K_MAX).
K_BITS = 16  # mark() decodes a layout's code with the literal 65536 = 1 << K_BITS
K_MAX = (1 << K_BITS) - 1
#: Bits of the clock a record's start keeps (the host unwraps modulo 2^48).
CLOCK_BITS = 64 - K_BITS
#: Default records per logical CTA id, for kernels whose CTAs write a handful of records each
#: (the fused flash decode: a worker 3, a pair's last worker 5 along its chain, a combiner 2).
RECORDS_PER_CTA = 8

_HEADER_C: tl.constexpr = tl.constexpr(HEADER)
_K_MASK: tl.constexpr = tl.constexpr(K_MAX)
_K_BITS_C: tl.constexpr = tl.constexpr(K_BITS)
_CLOCK_MASK: tl.constexpr = tl.constexpr((1 << CLOCK_BITS) - 1)


@dataclass(frozen=True)
class RecordLayout:
    """The slots a kernel's record buffer needs: ``ctas`` logical CTA ids (the ids the kernel
    passes to ``mark``, 0 .. ctas-1) with ``per_cta`` records each (the most one id writes per
    launch)."""

    ctas: int
    per_cta: int = RECORDS_PER_CTA

    def __post_init__(self) -> None:
        if self.ctas < 1 or self.per_cta < 1:
            raise ValueError(f"a record layout needs at least one CTA id and one record each, got {self}")
        if self.per_cta >= K_MAX:
            raise ValueError(f"at most {K_MAX - 1} records per CTA id (k is {K_BITS} bits of the clock value), "
                             f"got {self.per_cta}")

    @property
    def slots(self) -> int:
        return self.ctas * self.per_cta

    def union(self, other: "RecordLayout") -> "RecordLayout":
        """A layout with room for both (kernels read the sizes from the header)."""
        return RecordLayout(max(self.ctas, other.ctas), max(self.per_cta, other.per_cta))

    def rounded(self) -> "RecordLayout":
        """Both sizes rounded up to powers of two: a kernel compiled for this layout (``code``)
        then serves every layout up to it, so instrumented builds compile once per size class."""
        p2 = lambda n: 1 << max(0, int(n) - 1).bit_length()  # noqa: E731
        return RecordLayout(p2(self.ctas), min(p2(self.per_cta), K_MAX - 1))

    @property
    def code(self) -> int:
        """The kernel's ``INSTRUMENT`` constexpr for fixed slots of this layout, so ``mark`` needs no
        header loads: ``ctas << 16 | per_cta`` (1 is the header-reading mode; see ``mark``)."""
        return (self.ctas << K_BITS) | self.per_cta


def instrument_code(records) -> int:
    """A launch's ``INSTRUMENT`` constexpr: 0 without records, else the record buffer's code
    (``RecordBuffer.code``: a fixed-slot layout, or 1 to read the layout and mode from the header)."""
    return 0 if records is None else int(records.code)


def record_pointer(records, fallback):
    """A launch's record pointer: the buffer's current tensor (``RecordBuffer.tensor()``), or any
    tensor standing in (never written) when the kernel is compiled without records."""
    return fallback if records is None else records.tensor()


@triton.jit
def begin(INSTRUMENT: tl.constexpr, MODE: tl.constexpr):
    """The CTA's first timestamp with record count k = 0 (a constant 0 when not instrumented,
    which the compiler drops)."""
    if INSTRUMENT:
        t = sync.now(MODE) << _K_BITS_C
    else:
        t = tl.full((), 0, tl.int64)
    return t


@triton.jit
def mark(rec_ptr, cta, phase, t_start, INSTRUMENT: tl.constexpr, MODE: tl.constexpr):
    """Record (cta, phase, t_start, now) in the CTA's slot k and return (now, k + 1), the next
    phase's start.

    Every thread of the CTA must be done with the phase first (a barrier), so the end time covers
    the slowest thread. ``INSTRUMENT``: 0 (no code at all), a fixed-slot layout's ``code`` (the
    sizes are constants: nothing waits on memory, the stores are fire-and-forget), or 1/True
    (the sizes and the append mode are read from the header at every record).

    Why constants: on 4x H200 the fused flash decode step at batch 1, KV 1K (13-15 us, five records
    on its critical path) was 14.3% slower instrumented with the header loads, 3.5% with the same
    records and constant sizes, and -0.6% with the barrier alone (graph replays, medians of 9
    interleaved batches, one run each): the loads missed L1 after the KV stream. What the records
    still cost is mostly their stores (on one H200 all of it; on 4 the clock reads a few percent
    too: benchmarks/results/instrument_h200x1.md).
    """
    if INSTRUMENT:
        if INSTRUMENT == 1:  # header-reading mode (graph profiling's append mode needs it)
            ctas = tl.load(rec_ptr + 1)
            per_cta = tl.load(rec_ptr + 2)
            append = tl.load(rec_ptr + 3)
        else:  # a layout's code, ctas << 16 | per_cta (a literal, so it folds compiled and interpreted)
            ctas = INSTRUMENT // 65536
            per_cta = INSTRUMENT % 65536
            append = 0
        tl.debug_barrier()
        now = sync.now(MODE)
        k = t_start & _K_MASK
        start = (t_start >> _K_BITS_C) & _CLOCK_MASK
        cta64 = tl.cast(cta, tl.int64)
        if append != 0:
            slot = tl.atomic_add(rec_ptr, tl.full((), 1, tl.int64), sem="relaxed", scope="gpu")
            ok = slot < ctas * per_cta
        else:
            slot = cta64 * per_cta + k
            ok = (k < per_cta) & (cta64 >= 0) & (cta64 < ctas)
        if ok:
            base = rec_ptr + _HEADER_C + slot * 4
            tl.store(base, cta64)
            tl.store(base + 1, tl.cast(phase, tl.int64) + 1)
            tl.store(base + 2, start)
            tl.store(base + 3, now)
        elif append == 0:
            tl.atomic_add(rec_ptr, tl.full((), 1, tl.int64), sem="relaxed", scope="gpu")  # count the drop
        t_end = (now << _K_BITS_C) | tl.minimum(k + 1, _K_MASK)
    else:
        t_end = t_start
    return t_end
