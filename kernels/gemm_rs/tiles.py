"""The fine-grained GEMM + Reduce-Scatter kernels: a persistent GEMM that pushes finished tiles to
their owners, and the owner-side reduction.

Math: rank ``rank`` computes its partial product P = A_r @ B_r [M, N] tile by tile (``BLOCK_M x
BLOCK_N``). Rows of P come in ``WORLD`` slabs of ``M_loc`` rows; slab ``o`` belongs to rank ``o``
(its rows of C = sum over sources of their P). An M-block never straddles two slabs (the last
block of a slab is partial when ``M_loc`` is not a multiple of ``BLOCK_M``), so every tile has
exactly one owner.

Push (``gemm_rs_kernel``): each finished tile goes straight into its owner's receive buffer on the
symmetric heap, into the slot of this source rank (``recv[src, rows of the owner's slab, cols]``,
``iris.store``; own tiles with a plain store), then a release-set of the flag
``flags[tile, src]`` on the owner to the epoch (``sync.signal``). Each slot is written by one
source only, so no atomics on data are needed and the sum is deterministic.

Tile order (why), ``RsConfig.spread``: spread (the default, kernel revision 6): in rounds, round
``i`` holding block ``i`` of every peer's slab (rank+1 first) and own block ``i - lag``, taken
``GROUP_M`` rows at a time for L2 (``tile_gemm.rs_spread_coords``), so that every wave pushes
(W-1)/W of its tiles and the links keep up with the pushes (4x H200, against peers first: 6-7%
faster at M >= 4096 with the rows one at a time, in two runs, 6-10% at N=16384 with them grouped;
2x H200: 3%; benchmarks/results/gemm_rs_order_h200x4.md). Peers first (``spread=False``, revision 5 and
before): peers' tiles first, own tiles last, peers interleaved block by block and staggered per
rank (rank r sends block 0 to r+1, r+2, ..., then block 1, ...); consecutive positions grouped
``GROUP_M`` M-blocks at a time (``ag_gemm``'s L2 grouping), separately for the peers' segment and
the own segment, so that own tiles stay last. Either way the reduction of a tile runs after the
GEMM's flags are released (each program's, once, after its last tile).

Reduce (``reduce_tile``): for one of this rank's output tiles, wait (acquire, bounded) until all
``WORLD`` flags of the tile hold the epoch, then sum the ``WORLD`` slots in fp32, in source order
(deterministic), ``ROWS`` rows at a time, and store this rank's rows of C. It runs either

- in ``rs_reduce_kernel`` (``reduce="kernel"``), one program per output tile, launched after the
  GEMM on the same stream: the GEMM never waits, the reduce kernel waits only on other ranks' GEMMs,
  so no program ever waits on a program of its own launch, on a GPU or in Triton's interpreter
  (which runs a launch's programs one after another);
- or at the tail of the GEMM (``reduce="tail"``): after its compute tiles, program ``pid`` reduces
  own tiles ``pid, pid + NUM_PROGS, ...``. On a GPU every program of the persistent grid is
  resident (``NUM_PROGS`` <= SMs), so the waits can only be on programs that are running. In the
  interpreter program 0 would wait on tiles that a peer computes in its program 1, which runs
  only after the peer's program 0 (itself waiting on us) ends: the host therefore launches the
  tail variant with ONE program under the interpreter, where every program computes all of its
  tiles before it waits.

Epochs: flags hold the iteration number (counting from 1) and are never reset. The epoch lives in
device memory, not in a kernel argument, so that a captured CUDA graph replays correctly: the
GEMM's epoch slots (``epoch_ptr``, ``GemmRsState.epochs``; ``kernels/device/epochs.py``). GEMM
program ``pid`` takes ``slot[pid] + 1`` as its epoch at its start and stores it back as its last
step (after its tail reductions, if any), so every launch on one state must use the same grid.
The reduce kernel, launched after the GEMM on the same stream, reads slot 0 as it is (every slot
holds the same value then): both kernels of an iteration use the same epoch, the next
iteration's GEMM the next one, and the values are the ones a host count would give (every rank
runs the same iterations). Each kernel picks the epoch's half of the receive buffer itself
(``_epoch_half``). The receive buffer is double-buffered by epoch parity: a peer's pushes of
epoch e+1 may land while this rank still reduces epoch e (the peer finished its own epoch-e
reduction), but its pushes of e+2 need this rank's epoch-e+1 pushes, which come after this
rank's epoch-e reduction (stream order). A flag that already holds e+1 when epoch e is reduced
is fine: the epoch-e data landed before it.

``COUNT`` (debug): per own output tile, how many times it was reduced and the least flag value
it saw after its waits and before reading any slot, so tests can check the protocol.

In-kernel records (``INSTRUMENT``, a constexpr; kernels/device/trace.py, docs/records.md): per tile the
GEMM records ``compute`` (the MMA loop), then ``store_push`` for a tile pushed to a peer (the
remote store and its flag release, which waits for the stores to drain) or ``compute`` for an
own tile (a local epilogue store); a reduction records ``flag_wait`` (its ``WORLD`` flags) and
``combine`` (the sum). A GEMM program writes 2 records per tile it computes (plus 2 per tile it
reduces with ``TAIL_REDUCE``), a reduce program 2 for its own output tile (``gemm_record_layout``,
``reduce_record_layout``). With
``INSTRUMENT=False`` none of it is compiled.
"""
from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from taxmodel.kernels.device import trace
from taxmodel.kernels.device.epochs import check_grid, launch_epoch, publish_epoch
from taxmodel.kernels.device.sync import interpreting, wait_geq
from taxmodel.kernels.device.tile_gemm import ROLE_RS, flatten_ok, persistent_gemm
from taxmodel.kernels.ag_gemm.gemm_tiles import GemmConfig, cached_descriptor, num_programs, tile_counts, tma_available
from taxmodel.kernels.names import GEMM_RS_KERNEL, RS_REDUCE_KERNEL

#: Kernel ids written into the error buffer by a reduction that gave up waiting.
GEMM_KERNEL_ID = 1
REDUCE_KERNEL_ID = 2
KERNEL_NAMES = {GEMM_KERNEL_ID: GEMM_RS_KERNEL, REDUCE_KERNEL_ID: RS_REDUCE_KERNEL}


@triton.jit
def _epoch_half(recv_ptr, epoch, M_loc, ldr, WORLD: tl.constexpr):
    """This epoch's half of the receive buffer [2, WORLD, M_loc, ldr] (``ldr``: a slot's row stride,
    ``slot_row_stride``; 64-bit offset: both halves together may pass 2^31 elements where one
    does not)."""
    return recv_ptr + (epoch % 2).to(tl.int64) * WORLD * M_loc * ldr


@triton.jit
def reduce_tile(recv_ptr, out_ptr, flags_ptr, err_ptr, count_ptr, seen_ptr, tile, n_tiles, M_loc, N, ldr, stride_om,
                rank, epoch, budget, kernel_id, rec_ptr, cta, t,
                WORLD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                SYNC_MODE: tl.constexpr, COUNT: tl.constexpr, INSTRUMENT: tl.constexpr):
    """Sum the ``WORLD`` received slots of own output tile ``tile`` once all its flags hold ``epoch``.

    ``t`` is the start of this phase for in-kernel records (``cta`` the recording program); returns
    the end of the last phase recorded (``t`` unchanged when not instrumented)."""
    j = tile // n_tiles
    pid_n = tile % n_tiles
    # Distinct names for the runtime peer (a tensor: depends on ``rank``) and the compile-time slot
    # index below: Triton (3.6 and 3.9 compilers, not the interpreter) rejects a name that is a
    # tensor before a loop and a constexpr inside it ("loop carried variable changed type").
    for i in tl.static_range(WORLD):
        peer = (rank + 1 + i) % WORLD  # peers in the order they push to us first, our own tile last
        wait_geq(flags_ptr + tile * WORLD + peer, epoch, budget, err_ptr, rank, peer, tile * WORLD + peer,
                 kernel_id, SYNC_MODE)
    t = trace.mark(rec_ptr, cta, trace.FLAG_WAIT, t, INSTRUMENT, SYNC_MODE)
    if COUNT:
        least = tl.load(flags_ptr + tile * WORLD, volatile=True)
        for s in tl.static_range(1, WORLD):
            least = tl.minimum(least, tl.load(flags_ptr + tile * WORLD + s, volatile=True))
        tl.store(seen_ptr + tile, least)
        tl.atomic_add(count_ptr + tile, 1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_n < N
    slot = M_loc * ldr
    for r0 in range(0, BLOCK_M, ROWS):
        rows = j * BLOCK_M + r0 + tl.arange(0, ROWS)
        mask = (rows < M_loc)[:, None] & col_ok[None, :]
        off = rows[:, None] * ldr + offs_n[None, :]
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(WORLD):  # source order: deterministic sum
            acc += tl.load(recv_ptr + s * slot + off, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)
    t = trace.mark(rec_ptr, cta, trace.COMBINE, t, INSTRUMENT, SYNC_MODE)
    return t


# The epoch is read from device memory (``epoch_ptr``), never passed by value: a launch's arguments
# are the same every iteration (what a CUDA graph replays), so no iteration can hit a new integer
# specialization (Triton specializes integers equal to 1 or divisible by 16) and compile while
# peers wait on its flags. ``rank`` and ``budget`` stay unspecialized: every rank compiles one and
# the same kernel whatever its rank and spin timeout.
@triton.jit(do_not_specialize=["rank", "budget"])
def gemm_rs_kernel(
    a_ptr, b_ptr, a_desc, b_desc, recv_ptr, out_ptr, flags_ptr, heap_bases, err_ptr, count_ptr, seen_ptr,
    M_loc, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om, ldr,
    rank, epoch_ptr, budget, rec_ptr,
    WORLD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_PROGS: tl.constexpr, NUM_STAGES: tl.constexpr, USE_TMA: tl.constexpr,
    VEC_HINT: tl.constexpr, TAIL_REDUCE: tl.constexpr, ROWS: tl.constexpr, SYNC_MODE: tl.constexpr,
    COUNT: tl.constexpr, INSTRUMENT: tl.constexpr = False, FLATTEN: tl.constexpr = False,
    SPREAD: tl.constexpr = False, lag=1,
):
    pid = tl.program_id(0)
    t_rec = trace.begin(INSTRUMENT, SYNC_MODE)  # in-kernel records (kernels/device/trace.py); nothing when off
    blocks_per_rank = tl.cdiv(M_loc, BLOCK_M)
    n_tiles = tl.cdiv(N, BLOCK_N)
    epoch = launch_epoch(epoch_ptr, pid)  # this program's slot, published by its previous launch
    recv = _epoch_half(recv_ptr, epoch, M_loc, ldr, WORLD)
    mine = recv + rank * M_loc * ldr  # this source's slot (same offset in every owner's heap)

    t_rec = persistent_gemm(
        pid, a_ptr, b_ptr, mine, a_desc, b_desc, err_ptr, flags_ptr, heap_bases, err_ptr, count_ptr, seen_ptr,
        rec_ptr, t_rec, M_loc, N, K, stride_am, stride_ak, stride_bk, stride_bn, ldr, 1,
        0, rank, epoch, budget, 1,
        ROLE_RS, WORLD, 0, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGS, NUM_STAGES, USE_TMA, SYNC_MODE,
        False, False, 1, 1, 1, INSTRUMENT, FLATTEN, VEC_HINT, RS_SPREAD=SPREAD, rs_lag=lag)

    if TAIL_REDUCE:
        for tile in range(pid, blocks_per_rank * n_tiles, NUM_PROGS):
            t_rec = reduce_tile(recv, out_ptr, flags_ptr, err_ptr, count_ptr, seen_ptr, tile, n_tiles, M_loc, N,
                                ldr, stride_om, rank, epoch, budget, 1, rec_ptr, pid, t_rec, WORLD, BLOCK_M, BLOCK_N, ROWS,
                                SYNC_MODE, COUNT, INSTRUMENT)
    # Last, after this program's pushes and tail reductions: its slot holds the epoch for the reduce
    # kernel of this iteration and the next iteration's GEMM.
    publish_epoch(epoch_ptr, pid, epoch, SYNC_MODE)


@triton.jit(do_not_specialize=["rank", "budget"])
def rs_reduce_kernel(recv_ptr, out_ptr, flags_ptr, err_ptr, count_ptr, seen_ptr, M_loc, N, ldr, stride_om,
                     rank, epoch_ptr, budget, rec_ptr,
                     WORLD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                     SYNC_MODE: tl.constexpr, COUNT: tl.constexpr, INSTRUMENT: tl.constexpr = False):
    """One program per own output tile (no program waits on another of this launch). The epoch is
    the one this iteration's GEMM published (it ran before on this stream: slot 0 of its epoch
    slots, which all hold it); this kernel never changes it."""
    pid = tl.program_id(0)
    t_rec = trace.begin(INSTRUMENT, SYNC_MODE)
    n_tiles = tl.cdiv(N, BLOCK_N)
    epoch = tl.load(epoch_ptr)  # slot 0
    recv = _epoch_half(recv_ptr, epoch, M_loc, ldr, WORLD)
    t_rec = reduce_tile(recv, out_ptr, flags_ptr, err_ptr, count_ptr, seen_ptr, pid, n_tiles, M_loc, N,
                        ldr, stride_om, rank, epoch, budget, 2, rec_ptr, pid, t_rec, WORLD, BLOCK_M, BLOCK_N, ROWS,
                        SYNC_MODE, COUNT, INSTRUMENT)


# --- host side -----------------------------------------------------------------------------------


def own_tiles(m_loc: int, n: int, cfg: GemmConfig) -> int:
    """Output tiles of one rank's rows of C (the reduce grid counts these)."""
    bpr, n_tiles = tile_counts(m_loc, n, 1, cfg)
    return bpr * n_tiles


def flag_rows(m_loc: int, n: int, cfg: GemmConfig) -> int:
    """Rows of the flags array ([rows, world] int32 on the heap): one per own output tile, plus the
    scratch row that takes the release of each program's flags (kernels/device/tile_gemm.py)."""
    return own_tiles(m_loc, n, cfg) + 1


def gemm_record_layout(m_loc: int, n: int, world: int, cfg: GemmConfig, tail: bool,
                       device: torch.device) -> trace.RecordLayout:
    """Record slots of one ``gemm_rs_kernel`` launch (the grid ``gemm_programs`` gives for
    ``device``): a program writes 2 records per tile of the partial product it computes (compute,
    then store_push or the own tile's epilogue), and 2 per own tile it reduces in the tail; tiles
    are taken with stride ``programs``."""
    bpr, n_tiles = tile_counts(m_loc, n, world, cfg)
    tiles = world * bpr * n_tiles
    programs = gemm_programs(cfg, device, tiles, tail)
    per_cta = 2 * triton.cdiv(tiles, programs) + (2 * triton.cdiv(own_tiles(m_loc, n, cfg), programs) if tail else 0)
    return trace.RecordLayout(programs, per_cta)


def reduce_record_layout(m_loc: int, n: int, cfg: GemmConfig) -> trace.RecordLayout:
    """Record slots of one ``rs_reduce_kernel`` launch: one program per own tile, flag_wait and combine."""
    return trace.RecordLayout(own_tiles(m_loc, n, cfg), 2)


def records_per_iteration(m_loc: int, n: int, world: int, cfg: GemmConfig) -> int:
    """Records one iteration of the fused variant writes, either reduction placement: 2 per tile of
    the partial product, 2 per own output tile reduced."""
    return 2 * (world + 1) * own_tiles(m_loc, n, cfg)


def slot_row_stride(n: int) -> int:
    """Elements per row of a receive slot: N rounded up to 16, so that every row of a slot starts
    16-element aligned and the pushes store whole 16-byte vectors (at N = 1000 on 4x H200, unaligned
    rows made every push a 2-byte store: 102 us a tile against the whole GEMM's 16 us at N = 1008)."""
    return triton.cdiv(n, 16) * 16


def spread_lag(m_loc: int, cfg: GemmConfig, lag: int) -> int:
    """The spread order's lag in rounds, kept within 1 .. the blocks of a slab."""
    return max(1, min(lag, triton.cdiv(m_loc, cfg.block_m)))


def reduce_rows(block_m: int, rows: int) -> int:
    """Rows summed at a time: a power of two dividing ``block_m``."""
    r = min(triton.next_power_of_2(max(rows, 1)), block_m)
    while block_m % r:
        r //= 2
    return max(r, 1)


def use_tma(cfg: GemmConfig, a: torch.Tensor, b: torch.Tensor) -> bool:
    """TMA loads need Hopper+, Triton's host descriptors and 16-byte aligned row strides."""
    if not (cfg.use_tma and tma_available()):
        return False
    return (a.stride(0) * a.element_size()) % 16 == 0 and (b.stride(0) * b.element_size()) % 16 == 0 \
        and a.stride(1) == 1 and b.stride(1) == 1


def gemm_programs(cfg: GemmConfig, device: torch.device, num_tiles: int, tail: bool) -> int:
    """Persistent grid size; one program for the tail reduction under the interpreter (see above)."""
    if tail and interpreting():
        return 1
    return num_programs(cfg, device, num_tiles)


def launch_gemm_rs(a: torch.Tensor, b: torch.Tensor, recv: torch.Tensor, out: torch.Tensor, flags: torch.Tensor,
                   heap_bases: torch.Tensor, err: torch.Tensor, *, rank: int, world: int, m_loc: int,
                   epochs: torch.Tensor, budget: int, sync: int, cfg: GemmConfig, tail: bool, rows: int,
                   spread: bool = True, lag: int = 1,
                   count: torch.Tensor | None = None, seen: torch.Tensor | None = None,
                   records: Any = None, warmup_only: bool = False) -> None:
    """Enqueue ``gemm_rs_kernel`` (``tail``: with the reduction in the same launch; ``spread``: the
    spread tile order with own blocks ``lag`` rounds behind, ``spread_lag``, as ``RsConfig`` ships it;
    ``False``: every peer's tile first); no host sync.

    ``recv`` is the whole receive buffer ([2, world, m_loc, row stride] on the heap, the row stride
    at least N: ``slot_row_stride`` where the workload allocates it; the kernel picks the epoch's
    half); ``epochs`` the GEMM's epoch slots (``GemmRsState.epochs``), which the launch
    advances; every launch on them must have the same grid (else ``ValueError``). The arguments
    are the same every iteration (graph-capturable). ``records``: an in-kernel record buffer
    (``gemm_record_layout``; compiles ``INSTRUMENT=True``).
    """
    k, n = b.shape
    bpr, n_tiles = tile_counts(m_loc, n, world, cfg)
    progs = gemm_programs(cfg, out.device, world * bpr * n_tiles, tail)
    if not warmup_only:
        check_grid(epochs, progs, "launch_gemm_rs")
    tma = use_tma(cfg, a, b)
    a_desc = cached_descriptor(a, [cfg.block_m, cfg.block_k]) if tma else None
    b_desc = cached_descriptor(b, [cfg.block_k, cfg.block_n]) if tma else None
    args = (a, b, a_desc, b_desc, recv, out, flags, heap_bases, err,
            count if count is not None else err, seen if seen is not None else err,
            m_loc, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), recv.shape[-1],
            rank, epochs, budget, trace.record_pointer(records, err))
    kw = dict(SPREAD=spread, lag=spread_lag(m_loc, cfg, lag),
              WORLD=world, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
              NUM_PROGS=progs, NUM_STAGES=cfg.num_stages, USE_TMA=tma, VEC_HINT=recv.shape[-1] % 16 == 0,
              TAIL_REDUCE=tail,
              ROWS=reduce_rows(cfg.block_m, rows), SYNC_MODE=sync, COUNT=count is not None,
              INSTRUMENT=trace.instrument_code(records),
              FLATTEN=cfg.flatten and flatten_ok(1, bool(trace.instrument_code(records)), tma), num_warps=cfg.num_warps)
    if warmup_only:
        gemm_rs_kernel.warmup(*args, grid=(progs,), **kw)
    else:
        gemm_rs_kernel[(progs,)](*args, **kw)


def launch_rs_reduce(recv: torch.Tensor, out: torch.Tensor, flags: torch.Tensor, err: torch.Tensor, *, rank: int,
                     world: int, m_loc: int, epochs: torch.Tensor, budget: int, sync: int, cfg: GemmConfig, rows: int,
                     warps: int, count: torch.Tensor | None = None, seen: torch.Tensor | None = None,
                     records: Any = None, warmup_only: bool = False) -> None:
    """Enqueue ``rs_reduce_kernel`` (one program per own output tile) after this iteration's
    ``launch_gemm_rs`` on the same stream (it reads the epoch that launch published, slot 0 of
    ``epochs``; ``recv`` and ``epochs`` as there); no host sync. ``records``: an in-kernel record buffer
    (``reduce_record_layout``)."""
    n = out.shape[1]
    grid = (own_tiles(m_loc, n, cfg),)
    args = (recv, out, flags, err, count if count is not None else err, seen if seen is not None else err,
            m_loc, n, recv.shape[-1], out.stride(0), rank, epochs, budget, trace.record_pointer(records, err))
    kw = dict(WORLD=world, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ROWS=reduce_rows(cfg.block_m, rows),
              SYNC_MODE=sync, COUNT=count is not None, INSTRUMENT=trace.instrument_code(records), num_warps=warps)
    if warmup_only:
        rs_reduce_kernel.warmup(*args, grid=grid, **kw)
    else:
        rs_reduce_kernel[grid](*args, **kw)

