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

Held records (why: a record must cost almost nothing on the critical path). ``mark`` reads the
clock and keeps the record in registers: the CTA's state ``(t, held, keys)`` holds ``t = (clock
low 48 bits << 16) | k`` (k: the CTA's record count; 2^48 ns is 78 hours) and a window of
``HOLD`` records. A full window is written out inside ``mark``; ``finish`` writes out the rest at
the end of the kernel, after its last release. Stored at each mark instead, a record made just
before a release (a flag signal, a counter's acq_rel add) made that release wait for the
record's store as well: on 2 H200s the fused flash decode step at batch 1, KV 1K (~12.4 us, five
records on its critical path) cost +10.3% instrumented with stores at each mark, +3.8% with the
barrier and clock read alone, and the same +9.8% with a quarter of the store instructions
(benchmarks/results/record_format_h200x2.md).

Fixed slots (the default). Logical CTA id ``cta`` owns the ``per_cta`` slots from
``cta * per_cta``; the CTA's k-th record goes to slot ``cta * per_cta + k``. Nothing is shared
between CTAs, so no atomic. A record with ``k >= per_cta`` or ``cta`` outside ``[0, ctas)`` is
dropped, never written out of bounds; each drop adds one to ``buf[0]`` (an atomic only on that
rare path). The bounds are constants: the ``INSTRUMENT`` constexpr is the layout's code
``ctas << 16 | per_cta`` (``RecordLayout.code``, sizes rounded up to powers of two so one build
serves a size class). Reading them from the header at every record (three loads) cost 14-16% on
a 14 us fused flash decode step on the H200s, against 3-8% with constants: the loads missed L1
after the KV stream. ``INSTRUMENT = 1`` (or True) reads the sizes and the mode from the header
when a window is written out: graph profiling's append mode needs it. A buffer holds the last
launch's records: a second launch into the same buffer rewrites the slots (a CUDA-graph replay
rewrites the same slots, so its overhead is the real cost), and slots a later launch did not
reach keep older records.

Append mode (``buf[3] = 1``; only ``taxmodel.runtime.graph.GraphRecordSlots``): one buffer
collects every replay of a captured graph over a repetition, which fixed slots cannot (each
replay would overwrite the previous one). A window of n held records takes the next n slots with
one atomic add on the cursor ``buf[0]``; records past ``ctas * per_cta`` are not written and the
host counts ``cursor - capacity`` as dropped.

Record words: ``end`` is the full clock at the mark, ``start`` the low 48 bits of the phase's start
(all ``t`` keeps); the host restores it as ``end - ((end - start) mod 2^48)``, exact for phases
shorter than 2^48 ticks, so every record carries absolute device times.

Timestamps come from ``_sync.now(MODE)``: %globaltimer ns on NVIDIA, s_memrealtime 10-ns ticks on
AMD, the host's monotonic ns under Triton's interpreter. Phases are chained: a CTA reads the
clock once per boundary and each phase ends where the next starts, so a CTA's phases never
overlap and sum to its lifetime (first start to last end).

Device functions (``state`` is what ``begin``/``mark`` return; pass it along, and through loops):
    begin(INSTRUMENT, MODE) -> state                    first timestamp of a CTA, k = 0, no records
                                                        (constant zeros when off)
    mark(rec_ptr, cta, phase, state, INSTRUMENT, MODE) -> state
                                                        record [previous mark, now) as ``phase``,
                                                        the CTA's k-th record, under id ``cta``
    finish(rec_ptr, state, INSTRUMENT, MODE)            write out the records still held; once at
                                                        the end of the kernel, on every path
"""
from __future__ import annotations

from dataclasses import dataclass

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
#: Records a CTA holds in registers before it writes them out (a power of two): the fused flash
#: decode's CTAs write at most 5 per launch, so they write theirs once, at the end.
HOLD = 8

_HEADER_C: tl.constexpr = tl.constexpr(HEADER)
_WORDS_C: tl.constexpr = tl.constexpr(RECORD_WORDS)
_HOLD_C: tl.constexpr = tl.constexpr(HOLD)
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
    """The CTA's record state: its first timestamp with record count k = 0, and an empty window of
    held records (constant zeros when not instrumented, which the compiler drops)."""
    if INSTRUMENT:
        t = _sync.now(MODE) << _K_BITS_C
        held = tl.zeros([_HOLD_C, _WORDS_C], tl.int64)
        keys = tl.zeros([_HOLD_C, _WORDS_C], tl.int64)
    else:
        t = tl.full((), 0, tl.int64)
        held = tl.full((), 0, tl.int64)
        keys = tl.full((), 0, tl.int64)
    return (t, held, keys)


@triton.jit
def mark(rec_ptr, cta, phase, state, INSTRUMENT: tl.constexpr, MODE: tl.constexpr):
    """Record (cta, phase, start, now) as the CTA's k-th record and return the next state (the
    next phase starts now). The record is held in registers; a full window (``HOLD`` records) is
    written out here, the rest by ``finish``.

    Every thread of the CTA must be done with the phase first (a barrier), so the end time covers
    the slowest thread. ``INSTRUMENT``: 0 (no code at all), a fixed-slot layout's ``code`` (the
    sizes are constants: a record out of its CTA's slots is counted as dropped here, and nothing
    waits on memory), or 1/True (the sizes and the append mode are read from the header when the
    window is written out).

    Why held (module docstring): a record stored just before a release (a flag signal, a counter's
    acq_rel add) makes that release wait for the record's store too.
    """
    if INSTRUMENT:
        t_start, held, keys = state
        tl.debug_barrier()
        now = _sync.now(MODE)
        k = t_start & _K_MASK
        start = (t_start >> _K_BITS_C) & _CLOCK_MASK
        cta64 = tl.cast(cta, tl.int64)
        if INSTRUMENT != 1:  # a layout's code (ctas << 16 | per_cta): bounds known now, drops counted now
            ok = (k < INSTRUMENT % 65536) & (cta64 >= 0) & (cta64 < INSTRUMENT // 65536)
            if not ok:
                tl.atomic_add(rec_ptr, tl.full((), 1, tl.int64), sem="relaxed", scope="gpu")
        row = tl.arange(0, _HOLD_C)[:, None]
        word = tl.arange(0, _WORDS_C)[None, :]
        j = k % _HOLD_C
        record = tl.where(word == 0, cta64,
                          tl.where(word == 1, tl.cast(phase, tl.int64) + 1, tl.where(word == 2, start, now)))
        held = tl.where(row == j, record, held)
        keys = tl.where(row == j, (cta64 << _K_BITS_C) | k, keys)
        if j == _HOLD_C - 1:
            _write_out(rec_ptr, held, keys, _HOLD_C, INSTRUMENT)
        state = ((now << _K_BITS_C) | tl.minimum(k + 1, _K_MASK), held, keys)
    return state


@triton.jit
def finish(rec_ptr, state, INSTRUMENT: tl.constexpr, MODE: tl.constexpr):
    """Write out the records the CTA still holds. Call once at the end of every instrumented
    kernel, on every path, after its last ``mark`` (records never written out are lost)."""
    if INSTRUMENT:
        t, held, keys = state
        n = (t & _K_MASK) % _HOLD_C
        if n > 0:
            _write_out(rec_ptr, held, keys, n, INSTRUMENT)


@triton.jit
def _write_out(rec_ptr, held, keys, n, INSTRUMENT: tl.constexpr):
    """Store the first ``n`` held records, each in its slot: CTA ``cta``'s k-th record in slot
    ``cta * per_cta + k`` (``keys`` = cta << 16 | k), or in append mode the next ``n`` slots after
    the cursor (one atomic for the window). Records outside the buffer are not written; in
    header mode the fixed-slot drops are counted here."""
    row = tl.arange(0, _HOLD_C)[:, None]
    word = tl.arange(0, _WORDS_C)[None, :]
    cta = keys >> _K_BITS_C
    k = keys & _K_MASK
    filled = row < n
    if INSTRUMENT == 1:  # header-reading mode (graph profiling's append mode needs it)
        ctas = tl.load(rec_ptr + 1)
        per_cta = tl.load(rec_ptr + 2)
        append = tl.load(rec_ptr + 3)
        if append != 0:
            first = tl.atomic_add(rec_ptr, tl.cast(n, tl.int64), sem="relaxed", scope="gpu")
            slot = first + row + word * 0
            ok = filled & (slot < ctas * per_cta)
        else:
            slot = cta * per_cta + k
            ok = filled & (k < per_cta) & (cta >= 0) & (cta < ctas)
            dropped = tl.sum(tl.sum(tl.where(filled & (word == 0) & ~ok, 1, 0), axis=1), axis=0)
            if dropped > 0:
                tl.atomic_add(rec_ptr, tl.cast(dropped, tl.int64), sem="relaxed", scope="gpu")
    else:  # a layout's code: the drops were counted by mark
        slot = cta * (INSTRUMENT % 65536) + k
        ok = filled & (k < INSTRUMENT % 65536) & (cta >= 0) & (cta < INSTRUMENT // 65536)
    tl.store(rec_ptr + _HEADER_C + slot * _WORDS_C + word, held, mask=ok)
