"""Combine partial attention outputs by log-sum-exp rescaling.

Given N partials of the same query row, each a normalized output o_n and a base-2 log-sum-exp
lse_n over its own keys, the attention over the union of their keys is

    m    = max_n lse_n
    w_n  = 2^{lse_n - m}
    o    = sum_n w_n o_n / sum_n w_n
    lse  = m + log2(sum_n w_n)

Partials with lse = -inf (empty splits, empty shards) get weight zero; if every partial is empty
the result is o = 0, lse = -inf, never NaN. The same device function serves three places:
the local combine over one rank's splits, the global combine over the ranks' partials (BSP),
and both combines inside the fused kernel (whose LL path merges one peer's partial at a time
with ``merge_partials`` as it arrives). It walks the partials in blocks of ``NB`` with an
online maximum, so a long list of splits costs no more registers than a short one.

Layout: the partial (n, r, d) of a group of R rows sits at ``out_base + n*stride_on + r*stride_or
+ d`` and its lse at ``lse_base + n*stride_ln + r*stride_lr``. Loads use ``.cg`` (L2, not L1):
the partials were written by other programs of the same launch or by peer GPUs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from taxmodel.kernels.flash_decode.split_kv import SplitKVArgs, check_runnable, next_pow2


@triton.jit
def merge_partials(m, wsum, acc, lse, o):
    """Fold N partials (lse [R, N], o [R, N, D]) into the running state of R rows: the maximum lse
    ``m`` [R], the weight sum ``wsum`` [R] and the weighted output sum ``acc`` [R, D] (weights
    relative to ``m``). Start from m = -inf, wsum = 0, acc = 0; end with ``finish_merge``.

    Rows first, partials second: Triton spreads the leading axis over warps and the last over a
    warp's lanes, so each thread holds all N partials of its (row, d) elements and the sum over N
    stays in registers. With partials first ([N, R, D], the first version) the sum crossed warps
    through 16 KB of shared memory (sm_90 build)."""
    m_new = tl.maximum(m, tl.max(lse, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    w = tl.exp2(lse - m_safe[:, None])
    acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o, 1)
    wsum = wsum * alpha + tl.sum(w, 1)
    return m_new, wsum, acc


@triton.jit
def finish_merge(m, wsum, acc):
    """(out [R, D], lse [R] base 2) of a merged state; rows with no weight give 0 and -inf."""
    has = wsum > 0.0
    safe_sum = tl.where(has, wsum, 1.0)
    out = acc / safe_sum[:, None]
    lse_out = tl.where(has, tl.where(m == float("-inf"), 0.0, m) + tl.log2(safe_sum), float("-inf"))
    return out, lse_out


@triton.jit
def combine_tile(out_base, lse_base, n_count, stride_on, stride_or, stride_ln, stride_lr,
                 R: tl.constexpr, R_P2: tl.constexpr, D: tl.constexpr, NB: tl.constexpr):
    """Combine ``n_count`` partials for R rows; returns (out [R_P2, D] fp32, lse [R_P2] base 2)."""
    r = tl.arange(0, R_P2)
    r_ok = r < R
    d = tl.arange(0, D)
    m = tl.full([R_P2], float("-inf"), tl.float32)
    wsum = tl.zeros([R_P2], tl.float32)
    acc = tl.zeros([R_P2, D], tl.float32)
    for n0 in range(0, n_count, NB):
        n = n0 + tl.arange(0, NB)
        ok = r_ok[:, None] & (n < n_count)[None, :]  # [R, NB]: rows first (see merge_partials)
        lse = tl.load(lse_base + r[:, None] * stride_lr + n[None, :] * stride_ln, mask=ok,
                      other=float("-inf"), cache_modifier=".cg")
        o = tl.load(out_base + r[:, None, None] * stride_or + n[None, :, None] * stride_on + d[None, None, :],
                    mask=ok[:, :, None], other=0.0, cache_modifier=".cg")
        m, wsum, acc = merge_partials(m, wsum, acc, lse, o)
    return finish_merge(m, wsum, acc)


@triton.jit
def flash_decode_combine_local(part_out_ptr, part_lse_ptr, send_ptr, num_splits, rows_total,
                               G: tl.constexpr, R: tl.constexpr, R_P2: tl.constexpr, D: tl.constexpr,
                               NB: tl.constexpr):
    """One program per R query rows (R divides the G rows of a KV pair): combine their splits into
    those rows of the send buffer.

    Send buffer (fp32, flat): out [B*Hq, D] then lse [B*Hq] (``rows_total`` = B*Hq).
    """
    row0 = tl.program_id(0) * R
    bk = row0 // G
    part = bk * num_splits * G + row0 % G  # the first row in split 0
    out, lse = combine_tile(part_out_ptr + part * D, part_lse_ptr + part,
                            num_splits, G * D, D, G, 1, R, R_P2, D, NB)
    r = tl.arange(0, R_P2)
    d = tl.arange(0, D)
    row = row0 + r
    tl.store(send_ptr + row[:, None] * D + d[None, :], out, mask=(r < R)[:, None])
    tl.store(send_ptr + rows_total * D + row, lse, mask=r < R)


@triton.jit
def flash_decode_combine_global(gathered_ptr, out_ptr, world_size, rows_total,
                                R: tl.constexpr, R_P2: tl.constexpr, D: tl.constexpr, NB: tl.constexpr):
    """One program per R query rows: combine the ranks' partials (gathered send buffers) into out."""
    row0 = tl.program_id(0) * R
    slot = rows_total * (D + 1)
    out, lse = combine_tile(gathered_ptr + row0 * D, gathered_ptr + rows_total * D + row0,
                            world_size, slot, D, slot, 1, R, R_P2, D, NB)
    r = tl.arange(0, R_P2)
    d = tl.arange(0, D)
    row = row0 + r
    tl.store(out_ptr + row[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=(r < R)[:, None])


def packed_size(rows_total: int, head_dim: int) -> int:
    """fp32 elements of one rank's packed partial: out [rows, D] then lse [rows]."""
    return rows_total * (head_dim + 1)


#: Partial rows one combine step holds in registers ([R, NB, D] with R * NB <= this): 32 rows of
#: D = 128 fp32 are 32 registers per thread of a 4-warp program. sm_90 builds of the fused kernel
#: (tests/kernels/test_flash_decode_compile.py): with 8 rows x 8 partials it took 96 registers per
#: thread with Triton 3.6 but 204 with Triton 3.9; with 8 x 4, 96 and 150, so it keeps 3 programs
#: per SM with either.
COMBINE_TILE_ROWS = 32


def combine_block(rows: int) -> int:
    """Partials per combine step (NB, a power of two >= 4) for a program combining ``rows`` rows."""
    return max(4, COMBINE_TILE_ROWS // next_pow2(rows))


def combine_rows(args: SplitKVArgs, slices: int) -> int:
    """Query rows per combine program when each KV pair's G rows are cut into ``slices`` programs
    (0 or 1: one program per pair). ``slices`` must divide G."""
    k = max(1, int(slices))
    if args.group % k:
        from taxmodel.errors import InputError

        raise InputError(f"flash_decode: {k} combine slices do not divide the {args.group} query heads per KV head")
    return args.group // k


def launch_combine_local(args: SplitKVArgs, part_out: torch.Tensor, part_lse: torch.Tensor,
                         send: torch.Tensor, slices: int = 1) -> None:
    check_runnable(flash_decode_combine_local, send.device)
    r = combine_rows(args, slices)
    rows = args.batch * args.q_heads
    flash_decode_combine_local[(rows // r,)](part_out, part_lse, send, args.plan.num_splits, rows,
                                             G=args.group, R=r, R_P2=next_pow2(r), D=args.head_dim,
                                             NB=combine_block(r),
                                             num_warps=4)


def launch_combine_global(args: SplitKVArgs, gathered: torch.Tensor, out: torch.Tensor, world_size: int,
                          slices: int = 1) -> None:
    check_runnable(flash_decode_combine_global, out.device)
    r = combine_rows(args, slices)
    rows = args.batch * args.q_heads
    flash_decode_combine_global[(rows // r,)](gathered, out, world_size, rows,
                                              R=r, R_P2=next_pow2(r), D=args.head_dim,
                                              NB=next_pow2(world_size), num_warps=4)
