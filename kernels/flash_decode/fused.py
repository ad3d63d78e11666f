"""Fine-grained flash decode: one kernel per decode step, no collective, no global barrier.

One launch per step on every rank (so one kernel per step: the split, both combines and the
exchange between ranks all live in it; a second kernel would cost a launch plus a kernel boundary,
~2 us in a CUDA graph and ~15 us eager, which at short KV is more than the attention itself).
The grid is ``B*Hkv*S + C`` programs:

1. Programs ``0 .. B*Hkv*S-1`` are split-KV workers (``attend_split``, the same code as the BSP
   split kernel), ordered by (batch, KV head) pair first so that a pair's splits finish together.
   Each writes its partial, then bumps the pair's arrival counter (acq_rel, GPU scope).
2. The worker that arrives last for a pair (counter == S-1) resets the counter, combines the
   pair's S partials locally (``combine_tile``) and pushes the combined [G, D] output and its
   log-sum-exp into slot ``rank`` of every rank's receive buffer (``_push_pair``).
3. The ranks' W partials of the pair are combined (``_combine_pair``) either by that same last
   worker (``num_combiners == 0``, the default: it merges its own partial from registers and polls
   the peers'), or by ``C`` dedicated combiner programs at the end of the grid (combiner c takes
   pairs c, c+C, ...). Every finished pair bumps a done counter; the last one advances the epoch.
4. "Spread" (``FusedConfig.slices`` = K > 0, LL or flags): the pair's last worker only publishes
   that the pair's partials are complete (``ready[pair] = epoch``, a GPU-scope release). C slice
   combiner programs at the end of the grid (one per (pair, row slice) unit by default, at most
   half the SMs; combiner c takes units c, c+C, ...) each wait for their pair's ready word, combine
   the splits of their G/K rows, push those rows (``_push_rows``) and combine the ranks' partials
   of them (``_combine_rows``). The two combines and the push, which at short KV are most of the
   step, run on K programs per pair instead of one: at batch 1 on 4x H200 this is the fastest
   structure (14.2 us per step at KV 1K per rank with K = 2 against 16.5 us with the last worker
   combining);
   at batch 16 the 64 pairs already give the last workers enough parallelism and the capped
   combiners would have to loop (benchmarks/results/flash_decode_h200x4.md).

Push protocols (``LL`` constexpr; ``FusedConfig.protocol``):
- ``ll`` (default): LL words (``ll.py``): each fp32 value travels with its epoch in one 8-byte
  store; the receiver polls the words until all hold the epoch. No fence, no flag, no atomic on
  the critical path: the step's cross-rank latency is one NVLink store plus the poll.
- ``flags``: fp32 stores, then per peer a system-scope
  release-exchange of flag [pair, rank] (``sync.signal``); the receiver waits on each peer's flag
  (``sync.wait_geq``: poll, then a system-scope acquire). That is W system-scope releases
  serialized behind remote atomics, and W acquires, per pair: measured 0.82x of BSP at b1-kv1k
  in CUDA graphs, with dedicated combiners.

Why the last worker combines by default: dedicated combiners spin from the kernel's start on SM
slots the workers share, for the whole KV stream (at long KV ~1-2% of the step, which is the margin
between fused and BSP there); the last worker only waits at the end, for peers that finish at
about the same time. Every wait is bounded (``spin_timeout``): a waiter that gives up records the
peer and flag index in the error buffer and every later wait of the launch returns at once
(``check_errors`` turns it into a RunError), so nothing hangs.

Why it cannot deadlock: workers never wait before their push (nor at all in the spread
structure, whose combiners, like dedicated ones, hold at most half the SMs and wait only on
their own pair's workers, then on peers' rows of the same unit, which every rank's combiner c
reaches in the same order). With dedicated combiners (at most
half the SMs, the highest program ids) the workers always have SMs. With the last worker combining,
a program waits on pair p only after pushing p; the plan sizes the grid to one wave, so normally all
programs are resident; if not, GPUs dispatch a 1-D grid in id order (pair-major), so the lowest
pair not yet pushed on some rank has all lower pairs pushed everywhere: their waiters finish, free
their SMs, and that pair's workers run. Triton's interpreter runs programs in id order, one at a
time, per rank process: a waiter on pair p waits for peers that run pairs <= p, which by the same
argument finish.

Epochs instead of resets: the epoch lives in device memory (``epoch[0]``, read by every program
at its start, advanced after the last pair), so a captured CUDA graph replays correctly. Flags and
LL words hold epochs, and a waiter accepts only the current one, so nothing is reset. The receive
buffer is double-buffered by epoch parity: a peer can run at most one step ahead (its step e+1
cannot finish before this rank's step e+1 pushes, which starts after this rank's step e ended),
so its step-e+1 pushes land in the other half while this rank still reads step e's half.

In-kernel records (``ctx.instrument``; kernels/device/trace.py): workers record ``compute`` (their split),
and the last worker of a pair ``combine`` (the split combine) and ``store_push``; the combine of the
ranks' partials records ``flag_wait`` and ``combine`` under the combiner's id (a dedicated
combiner's program id, or ``n_workers + pair`` when the last worker combines, so those records
read as one logical combiner per pair). In the LL path ``flag_wait`` also covers the per-peer merges,
which overlap the waits. Without instrumentation the kernel is compiled with ``INSTRUMENT=False``
and holds no record code.

Data locality: the workers' partials round-trip memory inside the kernel (written by S workers,
read once by the pair's last worker; usually L2 hits); the combined partials go straight into
the peers' heaps. Link bytes: each rank receives (W-1) * B*Hq*(D+1) values per step, 8 bytes each
with LL words, 4 with flags.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import iris
import torch
import triton
import triton.language as tl

from taxmodel.kernels.device import sync, trace
from taxmodel.kernels.flash_decode import ll
from taxmodel.kernels.flash_decode.combine import (combine_block, combine_rows, combine_tile, finish_merge,
                                                   merge_partials, packed_size)
from taxmodel.kernels.flash_decode.split_kv import SplitKVArgs, attend_split, check_runnable, next_pow2
from taxmodel.kernels.names import FLASH_DECODE_FUSED

#: Kernel id written into the error buffer by a combiner that gave up waiting.
FUSED_KERNEL_ID = 1
KERNEL_NAME = FLASH_DECODE_FUSED


#: Push protocols (the ``LL`` constexpr): LL words (value and epoch in one 8-byte store, no fences)
#: or the flag protocol (fp32 stores, then a system-scope release-set of a flag per peer).
PROTOCOLS = {"ll": True, "flags": False}


@triton.jit
def _as_fp32(recv):
    """The receive buffer as fp32 values (the flag protocol's view of the int64 heap buffer)."""
    return recv.to(tl.pointer_type(tl.float32), bitcast=True)


@triton.jit
def _push_rows(recv, half, row0, unit, out, lse, epoch, flag_ptr, rank, world_size, rows_total, slot, heap_bases,
               R: tl.constexpr, R_P2: tl.constexpr, D: tl.constexpr, LL: tl.constexpr):
    """Store the combined partial of rows ``row0 .. row0+R-1`` ([R, D] and their lse) into slot
    ``rank`` of every rank's receive buffer (this rank's included): LL words, or fp32 values then
    one flag per rank (flag [unit, rank]; ``unit`` is the pair when a whole pair is pushed)."""
    r = tl.arange(0, R_P2)
    r_ok = r < R
    d = tl.arange(0, D)
    row = row0 + r
    if LL:
        mine_w = recv + (half * world_size + rank) * slot
        ll.push(mine_w, row[:, None] * D + d[None, :], ll.pack(out, epoch), r_ok[:, None], rank, world_size, heap_bases)
        ll.push(mine_w, rows_total * D + row, ll.pack(lse, epoch), r_ok, rank, world_size, heap_bases)
    else:
        mine_f = _as_fp32(recv) + (half * world_size + rank) * slot
        for dst in range(world_size):
            iris.store(mine_f + row[:, None] * D + d[None, :], out, rank, dst, heap_bases, mask=r_ok[:, None])
            iris.store(mine_f + rows_total * D + row, lse, rank, dst, heap_bases, mask=r_ok)
        tl.debug_barrier()  # all threads' pushes precede the flags
        for dst in range(world_size):
            sync.signal(flag_ptr + unit * world_size + rank, epoch, rank, dst, heap_bases)


@triton.jit
def _combine_rows(row0, unit, own_out, own_lse, HAVE_OWN: tl.constexpr, recv, half, out_ptr, flag_ptr, epoch, budget,
                  err_ptr, rank, world_size, rows_total, slot, rec_ptr, cta, t,
                  R: tl.constexpr, R_P2: tl.constexpr, D: tl.constexpr, W_P2: tl.constexpr, LL: tl.constexpr,
                  KERNEL_ID: tl.constexpr, MODE: tl.constexpr, INSTRUMENT: tl.constexpr):
    """Wait for every rank's partial of rows ``row0 .. row0+R-1`` (bounded), combine them, write
    the output rows. ``unit`` names the rows in flags and give-up records (the pair, or the pair's
    row slice).

    ``HAVE_OWN``: this program computed this rank's partial itself (``own_out``, ``own_lse``) and
    merges it from registers instead of reading it back (LL only). Every rank merges in rank
    order, so all ranks produce the same output. Records ``flag_wait`` (in the LL path it also
    covers the per-peer merges, which overlap the waits) and ``combine``; returns the clock.
    """
    r = tl.arange(0, R_P2)
    r_ok = r < R
    d = tl.arange(0, D)
    row = row0 + r
    if LL:
        words = recv + half * world_size * slot
        tile_ok = r_ok[:, None] & (d[None, :] < D)
        m = tl.full([R_P2], float("-inf"), tl.float32)
        wsum = tl.zeros([R_P2], tl.float32)
        acc = tl.zeros([R_P2, D], tl.float32)
        for src in range(world_size):
            base = words + src * slot
            if HAVE_OWN:
                if src == rank:
                    o, lse = own_out, own_lse
                else:
                    o, lse, _ = ll.wait_rows(base + row[:, None] * D + d[None, :], tile_ok, base + rows_total * D + row,
                                             r_ok, epoch, budget, err_ptr, rank, src, unit * world_size + src,
                                             KERNEL_ID, MODE)
            else:
                o, lse, _ = ll.wait_rows(base + row[:, None] * D + d[None, :], tile_ok, base + rows_total * D + row,
                                         r_ok, epoch, budget, err_ptr, rank, src, unit * world_size + src,
                                         KERNEL_ID, MODE)
            m, wsum, acc = merge_partials(m, wsum, acc, lse[:, None], o[:, None, :])
        t = trace.mark(rec_ptr, cta, trace.FLAG_WAIT, t, INSTRUMENT, MODE)
        out, lse_all = finish_merge(m, wsum, acc)
    else:
        for src in range(world_size):
            flag_index = unit * world_size + src
            sync.wait_geq(flag_ptr + flag_index, epoch, budget, err_ptr, rank, src, flag_index, KERNEL_ID, MODE)
        tl.debug_barrier()
        t = trace.mark(rec_ptr, cta, trace.FLAG_WAIT, t, INSTRUMENT, MODE)
        vals = _as_fp32(recv) + half * world_size * slot
        out, lse_all = combine_tile(vals + row0 * D, vals + rows_total * D + row0,
                                    world_size, slot, D, slot, 1, R, R_P2, D, W_P2)
    tl.store(out_ptr + row[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=r_ok[:, None])
    t = trace.mark(rec_ptr, cta, trace.COMBINE, t, INSTRUMENT, MODE)
    return t


@triton.jit
def _unit_done(done_ptr, epoch_ptr, epoch, units):
    """Count a finished unit (a pair, or one row slice of a pair); the last unit of the launch
    advances the epoch for the next one.

    Every program read the epoch before this count can reach ``units`` (each unit's combine
    follows all of its pair's workers), so no program of this launch sees the new value."""
    tl.debug_barrier()
    finished = tl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
    if finished == units - 1:
        tl.store(done_ptr, 0)
        tl.atomic_xchg(epoch_ptr, epoch, sem="release", scope="gpu")


@triton.jit
def flash_decode_fused(q_ptr, k_ptr, v_ptr, out_ptr, part_out_ptr, part_lse_ptr, counter_ptr,
                       recv_ptr, flag_ptr, epoch_ptr, done_ptr, ready_ptr, err_ptr, heap_bases,
                       kv_len, chunk, num_splits, kv_heads, qk_scale,
                       stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                       rank, world_size, rows_total, num_combiners, budget, rec_ptr,
                       G: tl.constexpr, G_DOT: tl.constexpr, G_P2: tl.constexpr, D: tl.constexpr,
                       BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, DOT_F32: tl.constexpr,
                       NB: tl.constexpr, W_P2: tl.constexpr, MODE: tl.constexpr, KERNEL_ID: tl.constexpr,
                       INSTRUMENT: tl.constexpr = False, LL: tl.constexpr = True,
                       SLICES: tl.constexpr = 0, RS: tl.constexpr = 1, RS_P2: tl.constexpr = 1):
    pid = tl.program_id(0)
    t = trace.begin(INSTRUMENT, MODE)  # in-kernel records (kernels/device/trace.py); nothing when off
    pairs = (rows_total // G)
    n_workers = pairs * num_splits
    epoch = tl.load(epoch_ptr) + 1
    slot = rows_total * (D + 1)
    # The receive buffer [2, W, slot] is int64 on the heap: LL words, or fp32 values in its first
    # half (the helpers re-type it); the half is the epoch's parity.
    recv = recv_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    half = epoch % 2
    if pid < n_workers:
        bk = pid // num_splits
        attend_split(q_ptr, k_ptr, v_ptr, part_out_ptr, part_lse_ptr, bk, pid % num_splits,
                     kv_len, chunk, num_splits, kv_heads, qk_scale,
                     stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                     G, G_DOT, D, BLOCK_N, NUM_STAGES, DOT_F32)
        tl.debug_barrier()  # every thread's partial stores precede the release below
        t = trace.mark(rec_ptr, pid, trace.COMPUTE, t, INSTRUMENT, MODE)
        arrived = tl.atomic_add(counter_ptr + bk, 1, sem="acq_rel", scope="gpu")
        if arrived == num_splits - 1:
            tl.store(counter_ptr + bk, 0)  # ready for the next launch (same stream, so no race)
            if SLICES > 0:
                # Slice combiners take it from here: publish the pair's partials (cumulative
                # release: the acq_rel count above observed every worker's stores).
                tl.atomic_xchg(ready_ptr + bk, epoch, sem="release", scope="gpu")
            else:
                out, lse = combine_tile(part_out_ptr + bk * num_splits * G * D, part_lse_ptr + bk * num_splits * G,
                                        num_splits, G * D, D, G, 1, G, G_P2, D, NB)
                t = trace.mark(rec_ptr, pid, trace.COMBINE, t, INSTRUMENT, MODE)
                _push_rows(recv, half, bk * G, bk, out, lse, epoch, flag_ptr, rank, world_size, rows_total, slot,
                           heap_bases, G, G_P2, D, LL)
                t = trace.mark(rec_ptr, pid, trace.STORE_PUSH, t, INSTRUMENT, MODE)
                if num_combiners == 0:
                    # This program is the pair's combiner too; its records carry the combiner id a
                    # dedicated combiner of this pair would have (n_workers + pair).
                    t = _combine_rows(bk * G, bk, out, lse, True, recv, half, out_ptr, flag_ptr, epoch, budget,
                                      err_ptr, rank, world_size, rows_total, slot, rec_ptr, n_workers + bk, t,
                                      G, G_P2, D, W_P2, LL, KERNEL_ID, MODE, INSTRUMENT)
                    _unit_done(done_ptr, epoch_ptr, epoch, pairs)
    elif SLICES > 0:
        # Slice combiners: unit u is row slice u % SLICES (RS rows) of pair u // SLICES. Each waits
        # for its pair's workers, combines the splits of its rows, pushes them, and combines the
        # ranks' partials of its rows: both combines and the push spread over SLICES CTAs per pair.
        units = pairs * SLICES
        for u in range(pid - n_workers, units, num_combiners):
            bk = u // SLICES
            row0 = bk * G + (u % SLICES) * RS
            sync.wait_geq(ready_ptr + bk, epoch, budget, err_ptr, rank, rank, bk, KERNEL_ID, MODE, True)
            t = trace.mark(rec_ptr, pid, trace.FLAG_WAIT, t, INSTRUMENT, MODE)
            part = bk * num_splits * G + (u % SLICES) * RS  # first row of the slice in split 0
            out, lse = combine_tile(part_out_ptr + part * D, part_lse_ptr + part,
                                    num_splits, G * D, D, G, 1, RS, RS_P2, D, NB)
            t = trace.mark(rec_ptr, pid, trace.COMBINE, t, INSTRUMENT, MODE)
            _push_rows(recv, half, row0, u, out, lse, epoch, flag_ptr, rank, world_size, rows_total, slot, heap_bases,
                       RS, RS_P2, D, LL)
            t = trace.mark(rec_ptr, pid, trace.STORE_PUSH, t, INSTRUMENT, MODE)
            t = _combine_rows(row0, u, out, lse, True, recv, half, out_ptr, flag_ptr, epoch, budget, err_ptr,
                              rank, world_size, rows_total, slot, rec_ptr, pid, t,
                              RS, RS_P2, D, W_P2, LL, KERNEL_ID, MODE, INSTRUMENT)
            _unit_done(done_ptr, epoch_ptr, epoch, units)
    else:
        no_out = tl.zeros([G_P2, D], tl.float32)  # unused: dedicated combiners read every partial
        no_lse = tl.zeros([G_P2], tl.float32)
        for bk in range(pid - n_workers, pairs, num_combiners):
            t = _combine_rows(bk * G, bk, no_out, no_lse, False, recv, half, out_ptr, flag_ptr, epoch, budget,
                              err_ptr, rank, world_size, rows_total, slot, rec_ptr, pid, t,
                              G, G_P2, D, W_P2, LL, KERNEL_ID, MODE, INSTRUMENT)
            _unit_done(done_ptr, epoch_ptr, epoch, pairs)


def heap_bytes(batch: int, q_heads: int, kv_heads: int, head_dim: int, world_size: int) -> int:
    """Symmetric-heap bytes the fused variant allocates (receive buffers of 8-byte words, big
    enough for either protocol, and flags), with slack for the heap's alignment."""
    recv = 2 * world_size * packed_size(batch * q_heads, head_dim) * 8
    flags = batch * q_heads * world_size * 4  # one per (row slice, rank); a slice has >= 1 row
    return recv + flags + 4096


@dataclass(frozen=True)
class FusedConfig:
    """The fused kernel's structural choices (the benchmark sweeps them).

    ``protocol``: "ll" (LL words) or "flags" (fp32 pushes, a system-scope release-set flag per
    peer, an acquire per peer). ``combiners``: 0 = each pair's last worker also combines the
    ranks' partials of its pair (no CTA spins while the KV streams); N > 0 = N dedicated combiner
    CTAs at the end of the grid, each waiting on pairs c, c+N, ... from the kernel's start.
    ``slices``: 0 = off; K > 0 (a divisor of the GQA group) = "spread": each pair's rows are cut
    into K slices, and slice combiner CTAs (``combiners`` of them, default one per slice, at most
    half the SMs) each wait for the pair's workers, combine the splits of their slice, push it
    and combine the ranks' partials of it: the two combines and the push run on K CTAs per pair
    instead of one (at short KV they are most of the step).
    """

    protocol: str = "ll"
    combiners: int = 0
    slices: int = 0

    def label(self) -> str:
        if self.slices > 0:
            return f"{self.protocol}-s{self.slices}"
        return f"{self.protocol}-{'last' if self.combiners == 0 else f'c{self.combiners}'}"


def combiner_count(config: FusedConfig, pairs: int, num_sms: int) -> int:
    """Combiner CTAs at the end of the grid (0: each pair's last worker combines). Dedicated and
    slice combiners hold at most half the SMs, so the workers (which never wait) always progress;
    slice combiners default to one per slice (a unit: a pair, or one row slice of a pair)."""
    units = pairs * config.slices if config.slices > 0 else pairs
    wanted = config.combiners or (units if config.slices > 0 else 0)
    return 0 if wanted == 0 else max(1, min(units, wanted, num_sms // 2))


def slice_constexprs(slices: int, rows: int) -> dict[str, int]:
    """The kernel's row-slice constexprs: SLICES (0 = off), rows per slice RS and its power of two."""
    if slices <= 0:
        return dict(SLICES=0, RS=1, RS_P2=1)
    return dict(SLICES=slices, RS=rows, RS_P2=next_pow2(rows))


@dataclass
class FusedState:
    """Buffers of the fused variant on one rank (receive buffer and flags on the symmetric heap)."""

    args: SplitKVArgs
    out: torch.Tensor
    part_out: torch.Tensor
    part_lse: torch.Tensor
    counters: torch.Tensor
    recv: torch.Tensor  # heap: [2, W, B*Hq*(D+1)] int64 (LL words; fp32 values in the first half for flags)
    flags: torch.Tensor  # heap: [B*Hq, W] int32, flag [unit, src] holds src's last epoch (flags protocol;
    #                      a unit is a pair, or a row slice of a pair)
    epoch: torch.Tensor  # [1] int32, last finished step
    done: torch.Tensor  # [1] int32
    ready: torch.Tensor  # [B*Hkv] int32: the last epoch whose partials of the pair are complete (slices)
    err: torch.Tensor
    heap_bases: torch.Tensor
    rank: int
    world_size: int
    num_combiners: int  # 0: the pair's last worker combines; with slices: slice combiner CTAs
    budget: int
    mode: int
    config: FusedConfig = FusedConfig()
    records: Any = None  # taxmodel.runtime.records.RecordBuffer when instrumented

    def kernel_args(self) -> tuple[tuple, dict]:
        """Positional and keyword launch arguments (fixed for the state's lifetime, so built once),
        without the trailing record pointer (``record_arg``, which changes per traced iteration)."""
        cached = self.__dict__.get("_launch_args")
        if cached is not None:
            return cached
        a = self.args
        pos = (a.q, a.k, a.v, self.out, self.part_out, self.part_lse, self.counters, self.recv, self.flags,
               self.epoch, self.done, self.ready, self.err, self.heap_bases, *a.scalars(),
               self.rank, self.world_size, a.batch * a.q_heads, self.num_combiners, self.budget)
        rows = combine_rows(a, self.config.slices)  # per local combine
        kw = dict(a.constexprs(), G_P2=next_pow2(a.group), NB=combine_block(rows), W_P2=next_pow2(self.world_size),
                  MODE=self.mode, KERNEL_ID=FUSED_KERNEL_ID, INSTRUMENT=trace.instrument_code(self.records),
                  LL=PROTOCOLS[self.config.protocol], num_warps=a.cfg.num_warps,
                  **slice_constexprs(self.config.slices, rows))
        self.__dict__["_launch_args"] = (pos, kw)
        return pos, kw

    def record_arg(self) -> torch.Tensor:
        """The record buffer of this launch (the error buffer stands in, unused, when not instrumented)."""
        return self.records.tensor() if self.records is not None else self.err

    @property
    def record_layout(self) -> trace.RecordLayout:
        """Record slots of one launch (kernels/device/trace.py: logical CTA ids, records per id).

        Ids: workers 0 .. n_workers-1, then either the logical combiner ids n_workers + pair (the
        pair's last worker combines; its chain continues there, so its combine records are its 4th
        and 5th) or the dedicated / slice combiners' program ids n_workers + c (room is left for
        logical ids n_workers + unit too, unit < pairs x slices). Records per id: a worker at most
        5 along its chain, a dedicated combiner 2 per pair it takes, a slice combiner 5 per slice
        (ready wait, combine, push, flag_wait, combine), units taken with stride C."""
        a = self.args
        pairs = a.batch * a.kv_heads
        n_workers = pairs * a.plan.num_splits
        c = self.num_combiners
        if self.config.slices > 0:
            per_cta = 5 * -(-pairs * self.config.slices // c)
        elif c > 0:
            per_cta = 2 * -(-pairs // c)
        else:
            per_cta = 0
        units = pairs * max(1, self.config.slices)
        return trace.RecordLayout(n_workers + max(c, units), max(trace.RECORDS_PER_CTA, per_cta))

    @property
    def grid(self) -> tuple[int]:
        a = self.args
        return (a.batch * a.kv_heads * a.plan.num_splits + self.num_combiners,)

    def arrived_epochs(self) -> torch.Tensor:
        """[pairs, W] int: the last epoch at which rank src's partial of each pair reached this
        rank (a test hook; for LL the oldest epoch among the pair's words, so a single word
        missing shows)."""
        a = self.args
        pairs, g, d, w = a.batch * a.kv_heads, a.group, a.head_dim, self.world_size
        if self.config.protocol != "ll":
            k = max(1, self.config.slices)
            return self.flags[:pairs * k].view(pairs, k, w).min(1).values.contiguous()
        rows = a.batch * a.q_heads
        ep = (self.recv >> 32).view(2, w, -1)
        out = ep[:, :, :rows * d].reshape(2, w, pairs, g * d)
        lse = ep[:, :, rows * d:].reshape(2, w, pairs, g)
        oldest = torch.minimum(out.min(-1).values, lse.min(-1).values)  # [2, W, pairs]
        return oldest.max(0).values.t().contiguous()


def make_fused_state(ctx: Any, args: SplitKVArgs, out: torch.Tensor, num_sms: int,
                     config: FusedConfig = FusedConfig()) -> FusedState:
    """Allocate the fused variant's buffers (heap allocations in the same order on every rank)."""
    from taxmodel.errors import InputError

    if config.protocol not in PROTOCOLS:
        raise InputError(f"flash_decode fused: unknown protocol '{config.protocol}'; choose one of "
                         f"{', '.join(PROTOCOLS)}")
    if config.slices < 0:
        raise InputError(f"flash_decode fused: slices={config.slices} must be 0 (off) or a divisor of the "
                         f"{args.group} query heads per KV head")
    combine_rows(args, config.slices)  # InputError unless the slices divide the group
    heap = ctx.heap
    w = ctx.world_size
    pairs = args.batch * args.kv_heads
    dev = args.q.device
    recv = heap.zeros((2, w, packed_size(args.batch * args.q_heads, args.head_dim)), torch.int64)
    flags = heap.zeros((args.batch * args.q_heads, w), torch.int32)
    part_out = torch.empty(pairs, args.plan.num_splits, args.group, args.head_dim, dtype=torch.float32, device=dev)
    part_lse = torch.empty(pairs, args.plan.num_splits, args.group, dtype=torch.float32, device=dev)
    mode = sync.sync_mode(dev)
    combiners = combiner_count(config, pairs, num_sms)
    state = FusedState(
        args=args, out=out, part_out=part_out, part_lse=part_lse,
        counters=torch.zeros(pairs, dtype=torch.int32, device=dev),
        recv=recv, flags=flags,
        epoch=torch.zeros(1, dtype=torch.int32, device=dev),
        done=torch.zeros(1, dtype=torch.int32, device=dev),
        ready=torch.zeros(pairs, dtype=torch.int32, device=dev),
        err=sync.new_error_buffer(dev), heap_bases=heap.heap_bases.to(dev),
        rank=ctx.rank, world_size=w, num_combiners=combiners,
        budget=sync.spin_budget(ctx.spin_timeout_s, mode), mode=mode, config=config,
    )
    state.records = ctx.record_buffer(KERNEL_NAME, state.record_layout, dev)
    return state


def warmup_fused(state: FusedState) -> None:
    """Compile the fused kernel without running it, so no peer waits on our JIT compilation."""
    if state.args.q.device.type != "cuda":
        return
    pos, kw = state.kernel_args()
    flash_decode_fused.warmup(*pos, state.record_arg(), grid=state.grid, **kw)


def launch_fused(state: FusedState) -> None:
    """Enqueue one decode step: the single fused kernel."""
    check_runnable(flash_decode_fused, state.out.device)
    pos, kw = state.kernel_args()
    flash_decode_fused[state.grid](*pos, state.record_arg(), **kw)


def check_fused(state: FusedState, ctx: Any = None) -> None:
    """Raise RunError if a combiner gave up waiting (reads the error buffer: a host sync)."""
    sync.check_errors(state.err, KERNEL_NAME, ctx, state.mode)
