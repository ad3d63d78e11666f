"""Fine-grained flash decode: one kernel, no collective, no global barrier.

One launch per decode step, on every rank, with ``B*Hkv*S + C`` programs in a 1-D grid:

1. Programs ``0 .. B*Hkv*S-1`` are split-KV workers (``attend_split``, the same code as the BSP
   split kernel), ordered by (batch, KV head) first so that a pair's splits finish together.
   Each writes its partial, then bumps the pair's arrival counter (acq_rel, GPU scope).
2. The worker that arrives last for a pair (counter == S-1) resets the counter, combines the
   pair's S partials locally (``combine_tile``), stores the combined [G, D] output and its
   log-sum-exp into slot ``rank`` of every rank's receive buffer with ``iris.store`` (itself
   included), and release-sets flag [pair, rank] on every rank to the epoch (``_sync.signal``).
   Workers never wait on anything.
3. The last ``C`` programs are combiners. Combiner c takes pairs c, c+C, ...; for each it waits
   (``_sync.wait_geq``, bounded) until flag [pair, src] >= epoch for every rank src, then combines
   the W partials (LSE rescaling) and writes the output rows. The last combiner to finish (a
   second counter) advances the epoch.

Why one kernel, and why it cannot deadlock:
- Only combiners wait, and they are the highest program ids. Triton's interpreter runs programs
  one after another in id order, so on CPU every worker of a rank has finished before its first
  combiner waits; the workers a combiner waits on in other ranks run in other processes and never
  wait. On a GPU, workers never wait either, and C <= SMs / 2, so even if combiners were
  dispatched first (GPUs dispatch a 1-D grid in id order in practice, so they come last) they hold
  at most half the SMs and the workers progress on the rest. A combiner that waits longer than
  the spin timeout records the flag in the error buffer and stops waiting instead of hanging
  (``check_errors`` turns it into a RunError).
- So the CPU path and the GPU path are the same single kernel; nothing is split on CPU only.

Epochs instead of resets: the epoch lives in device memory (``epoch[0]``, read by every program
at its start, advanced by the last combiner), so a captured CUDA graph replays correctly. Flags
hold epochs and a waiter accepts any flag >= its epoch, so flags are never reset. The receive
buffer is double-buffered by epoch parity: a peer can run at most one step ahead (its step e+1
cannot finish before this rank's step e+1 pushes, which starts after this rank's step e ended),
so its step-e+1 pushes land in the other half while this rank still reads step e's half.

In-kernel records (``ctx.instrument``; kernels/_trace.py): workers record ``compute`` (their split),
and the last worker of a pair ``combine`` (the split combine) and ``store_push`` (pushes and
flags); combiners record ``flag_wait`` (waiting on a pair's W flags) and ``combine`` per pair.
Without instrumentation the kernel is compiled with ``INSTRUMENT=False`` and holds no record code.

Data locality: the workers' partials round-trip memory inside the kernel (written by S workers,
read once by the pair's last worker; usually L2 hits); the combined partials go straight into
the peers' heaps. Link bytes: each rank receives (W-1) * B*Hq*(D+1) fp32 values per step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import iris
import torch
import triton
import triton.language as tl

from taxmodel.kernels import _sync, _trace
from taxmodel.kernels.flash_decode.combine import combine_tile, packed_size
from taxmodel.kernels.flash_decode.split_kv import SplitKVArgs, attend_split, check_runnable, next_pow2

#: Kernel id written into the error buffer by a combiner that gave up waiting.
FUSED_KERNEL_ID = 1
KERNEL_NAME = "flash_decode_fused"


@triton.jit
def flash_decode_fused(q_ptr, k_ptr, v_ptr, out_ptr, part_out_ptr, part_lse_ptr, counter_ptr,
                       recv_ptr, flag_ptr, epoch_ptr, done_ptr, err_ptr, heap_bases,
                       kv_len, chunk, num_splits, kv_heads, qk_scale,
                       stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                       rank, world_size, rows_total, num_combiners, budget, rec_ptr,
                       G: tl.constexpr, G_DOT: tl.constexpr, G_P2: tl.constexpr, D: tl.constexpr,
                       BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, DOT_F32: tl.constexpr,
                       NB: tl.constexpr, W_P2: tl.constexpr, MODE: tl.constexpr, KERNEL_ID: tl.constexpr,
                       INSTRUMENT: tl.constexpr = False):
    pid = tl.program_id(0)
    t = _trace.begin(INSTRUMENT, MODE)  # in-kernel records (kernels/_trace.py); nothing when off
    pairs = (rows_total // G)
    n_workers = pairs * num_splits
    epoch = tl.load(epoch_ptr) + 1
    slot = rows_total * (D + 1)
    recv = recv_ptr + (epoch % 2) * world_size * slot
    r = tl.arange(0, G_P2)
    r_ok = r < G
    d = tl.arange(0, D)
    if pid < n_workers:
        bk = pid // num_splits
        attend_split(q_ptr, k_ptr, v_ptr, part_out_ptr, part_lse_ptr, bk, pid % num_splits,
                     kv_len, chunk, num_splits, kv_heads, qk_scale,
                     stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                     G, G_DOT, D, BLOCK_N, NUM_STAGES, DOT_F32)
        tl.debug_barrier()  # every thread's partial stores precede the release below
        t = _trace.mark(rec_ptr, pid, _trace.COMPUTE, t, INSTRUMENT, MODE)
        arrived = tl.atomic_add(counter_ptr + bk, 1, sem="acq_rel", scope="gpu")
        if arrived == num_splits - 1:
            tl.store(counter_ptr + bk, 0)  # ready for the next launch (same stream, so no race)
            out, lse = combine_tile(part_out_ptr + bk * num_splits * G * D, part_lse_ptr + bk * num_splits * G,
                                    num_splits, G * D, D, G, 1, G, G_P2, D, NB)
            t = _trace.mark(rec_ptr, pid, _trace.COMBINE, t, INSTRUMENT, MODE)
            row = bk * G + r
            mine = recv + rank * slot
            for dst in range(world_size):
                iris.store(mine + row[:, None] * D + d[None, :], out, rank, dst, heap_bases, mask=r_ok[:, None])
                iris.store(mine + rows_total * D + row, lse, rank, dst, heap_bases, mask=r_ok)
            tl.debug_barrier()  # all threads' pushes precede the flags
            for dst in range(world_size):
                _sync.signal(flag_ptr + bk * world_size + rank, epoch, rank, dst, heap_bases)
            t = _trace.mark(rec_ptr, pid, _trace.STORE_PUSH, t, INSTRUMENT, MODE)
    else:
        for bk in range(pid - n_workers, pairs, num_combiners):
            for src in range(world_size):
                flag_index = bk * world_size + src
                _sync.wait_geq(flag_ptr + flag_index, epoch, budget, err_ptr, rank, src, flag_index,
                               KERNEL_ID, MODE)
            tl.debug_barrier()
            t = _trace.mark(rec_ptr, pid, _trace.FLAG_WAIT, t, INSTRUMENT, MODE)
            out, lse = combine_tile(recv + bk * G * D, recv + rows_total * D + bk * G,
                                    world_size, slot, D, slot, 1, G, G_P2, D, W_P2)
            row = bk * G + r
            tl.store(out_ptr + row[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=r_ok[:, None])
            t = _trace.mark(rec_ptr, pid, _trace.COMBINE, t, INSTRUMENT, MODE)
        tl.debug_barrier()
        finished = tl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
        if finished == num_combiners - 1:
            tl.store(done_ptr, 0)
            tl.atomic_xchg(epoch_ptr, epoch, sem="release", scope="gpu")


def heap_bytes(batch: int, q_heads: int, kv_heads: int, head_dim: int, world_size: int) -> int:
    """Symmetric-heap bytes the fused variant allocates (receive buffers and flags), with slack
    for the heap's alignment."""
    recv = 2 * world_size * packed_size(batch * q_heads, head_dim) * 4
    flags = batch * kv_heads * world_size * 4
    return recv + flags + 4096


@dataclass
class FusedState:
    """Buffers of the fused variant on one rank (receive buffer and flags on the symmetric heap)."""

    args: SplitKVArgs
    out: torch.Tensor
    part_out: torch.Tensor
    part_lse: torch.Tensor
    counters: torch.Tensor
    recv: torch.Tensor  # heap: [2, W, B*Hq*(D+1)] fp32
    flags: torch.Tensor  # heap: [B*Hkv, W] int32, flag [pair, src] holds src's last epoch
    epoch: torch.Tensor  # [1] int32, last finished step
    done: torch.Tensor  # [1] int32
    err: torch.Tensor
    heap_bases: torch.Tensor
    rank: int
    world_size: int
    num_combiners: int
    budget: int
    mode: int
    records: Any = None  # taxmodel.runtime.records.RecordBuffer when instrumented

    def kernel_args(self) -> tuple[tuple, dict]:
        """Positional and keyword launch arguments (fixed for the state's lifetime, so built once),
        without the trailing record pointer (``record_arg``, which changes per traced iteration)."""
        cached = self.__dict__.get("_launch_args")
        if cached is not None:
            return cached
        a = self.args
        pos = (a.q, a.k, a.v, self.out, self.part_out, self.part_lse, self.counters, self.recv, self.flags,
               self.epoch, self.done, self.err, self.heap_bases, *a.scalars(),
               self.rank, self.world_size, a.batch * a.q_heads, self.num_combiners, self.budget)
        kw = dict(a.constexprs(), G_P2=next_pow2(a.group), NB=8, W_P2=next_pow2(self.world_size),
                  MODE=self.mode, KERNEL_ID=FUSED_KERNEL_ID, INSTRUMENT=self.records is not None,
                  num_warps=a.cfg.num_warps)
        self.__dict__["_launch_args"] = (pos, kw)
        return pos, kw

    def record_arg(self) -> torch.Tensor:
        """The record buffer of this launch (the error buffer stands in, unused, when not instrumented)."""
        return self.records.tensor() if self.records is not None else self.err

    @property
    def record_capacity(self) -> int:
        """Records one launch writes: 1 per worker, 2 more per pair (its last worker), 2 per pair
        (its combiner)."""
        a = self.args
        pairs = a.batch * a.kv_heads
        return pairs * a.plan.num_splits + 4 * pairs

    @property
    def grid(self) -> tuple[int]:
        a = self.args
        return (a.batch * a.kv_heads * a.plan.num_splits + self.num_combiners,)


def make_fused_state(ctx: Any, args: SplitKVArgs, out: torch.Tensor, num_sms: int) -> FusedState:
    """Allocate the fused variant's buffers (heap allocations in the same order on every rank)."""
    heap = ctx.heap
    w = ctx.world_size
    pairs = args.batch * args.kv_heads
    dev = args.q.device
    recv = heap.zeros((2, w, packed_size(args.batch * args.q_heads, args.head_dim)), torch.float32)
    flags = heap.zeros((pairs, w), torch.int32)
    part_out = torch.empty(pairs, args.plan.num_splits, args.group, args.head_dim, dtype=torch.float32, device=dev)
    part_lse = torch.empty(pairs, args.plan.num_splits, args.group, dtype=torch.float32, device=dev)
    mode = _sync.sync_mode(dev)
    state = FusedState(
        args=args, out=out, part_out=part_out, part_lse=part_lse,
        counters=torch.zeros(pairs, dtype=torch.int32, device=dev),
        recv=recv, flags=flags,
        epoch=torch.zeros(1, dtype=torch.int32, device=dev),
        done=torch.zeros(1, dtype=torch.int32, device=dev),
        err=_sync.new_error_buffer(dev), heap_bases=heap.heap_bases.to(dev),
        rank=ctx.rank, world_size=w, num_combiners=max(1, min(pairs, num_sms // 2)),
        budget=_sync.spin_budget(ctx.spin_timeout_s, mode), mode=mode,
    )
    from taxmodel.runtime.records import record_buffer  # the runtime's side of kernels/_trace.py

    state.records = record_buffer(ctx, KERNEL_NAME, state.record_capacity, dev)
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
    _sync.check_errors(state.err, KERNEL_NAME, ctx, state.mode)
