"""The persistent tile GEMM engine every fine-grained GEMM variant computes with (issue 34).

Math: tile (row block, column block) of P = A @ B, ``BLOCK_M x BLOCK_N`` at a time, fp32 accumulate,
where the rows of A and of the output come in ``WORLD`` slabs of ``M_loc`` rows (an M-block never
straddles two slabs: the last block of a slab is partial when ``M_loc`` is not a multiple of
``BLOCK_M``). Two roles share the engine, picked by the constexpr ``ROLE``:

- ``ROLE_AG`` (All-Gather + GEMM: pull, push, the copy-engine transport): slab ``src`` of A is rank
  ``src``'s shard; the tile of slab ``src`` is stored into this rank's C. ``A_MODE`` says how A's
  rows get here: ``A_LOCAL`` (all in ``a_ptr``: the GEMM alone), ``A_PULL`` (each tile loads remote
  rows straight from the peer's heap with ``iris.load``), ``A_WAIT`` (rows land in ``a_ptr`` from
  elsewhere; before its first K-step a remote tile waits (acquire) until its block's flag holds the
  epoch, or piece by piece along K with ``K_PIECES`` > 1; with ``FLAG_CHUNK`` > 1 blocks land in
  groups of that many, one copy-engine copy each, and a block's flag is its group's last block's,
  ``flag_block``).
- ``ROLE_RS`` (GEMM + Reduce-Scatter): slab ``o`` of the output belongs to rank ``o``; the finished
  tile goes to the owner's receive slot of this source (``iris.store``; an own tile's pointer
  translates to itself). The tiles' flags on their owners are set to the epoch once the program's
  last tile is stored: one release (a system-scope fence) orders every store of the program, then
  relaxed sets of its tiles' flags (``release_tiles``). Why not a release per tile: the fence
  waits until the program's stores are visible system-wide, and per tile it cost GEMM+RS's kernel
  6% against the engine alone at K=2048 on one H100 (3% at K=8192), deferred by one tile or not;
  the reduction that waits on the flags runs after the GEMM in any case (``rs_reduce_kernel`` on
  the same stream, or the tail). The flags array has one scratch row past the last tile
  (``flag_rows``) that takes the release.

Tile order (``tile_coords``, why): AG takes its own slab first (no communication needed) and then
the peers' blocks in the order they are delivered: interleaved (block 0 of every peer, then block
1: the order the copy kernel delivers them, and the pushes of the copy engines, where every source
pushes at once) or, for pulls on the copy engines (``ORDER_CHUNK``: the blocks a copy moves), copy
by copy (rank+1's first copy, rank+2's, ..., then every peer's second: one engine runs a rank's
pulls one after another, as a 4x H200 trace shows, so a copy's blocks are the next to arrive).
RS takes the peers' blocks first (staggered per rank, so every owner gets block 0 from all peers
early) and its own slab last (its own contribution costs no link time), or, with ``RS_SPREAD``
(GEMM+RS's default), in rounds that each hold one block of every peer and, a round behind, one
own block (``rs_spread_coords``), so that the pushes spread over the whole kernel. Within a
segment, tiles are grouped ``GROUP_M`` M-blocks at a time so that concurrently running programs
share A and B tiles in L2 (in the spread order, ``GROUP_M`` rows of its rounds at a time).

Schedule (why it reaches cuBLAS speed): one program per SM loops over tiles with stride
``NUM_PROGS`` (a launch never needs more programs than fit at once, so no program waits on one that
is not running). With ``FLATTEN`` the tile loop and the K loop are one software-pipelined loop
(Triton's ``tl.range(..., flatten=True)``): the TMA loads of the next tile's first K-steps are in
flight while this tile's epilogue stores, so the epilogue no longer stalls the tensor cores between
tiles (the short-K shapes lost 4-6% to it). Flattening needs the K loop to be one loop per tile,
so ``K_PIECES`` > 1 (waits between K pieces) and in-kernel records (whose CTA barriers mark phase
boundaries) use the nested schedule; the host picks (``flatten_ok``). ``USE_TMA`` loads A and B
through tensor descriptors (Hopper TMA); otherwise through pointers (the interpreter, ``A_PULL``).
``TMA_STORE`` stores AG's C tile through a descriptor, in ``EPI_SPLIT`` column parts (less shared
memory beside the load pipeline). ``tl.range(..., warp_specialize=True)`` is not used: Triton 3.6
compiles it on sm_90 without partitioning the loop (no ``ttg.warp_specialize`` in the IR), so it
changes nothing there (benchmarks/results/gemm_notes.md).

Ordering under ``A_WAIT``: the wait's acquire is followed by ``fence.proxy.async`` before the TMA
loads of the guarded rows, and the row offset the loads use is computed from the wait's outcome
(``wait_piece``), so no compiler schedule (the flattened loop's pipeliner included) can issue the
loads of a tile before its wait. ``WAIT_VOTE`` (on a GPU, ``GemmConfig.wait_vote``): a flag that
already holds the epoch costs one acquire load per thread and one voting barrier
(``sync.wait_geq``'s ``VOTE``) instead of the bounded spin's two L2 trips and two barriers.

The ready horizon (``WAIT_HORIZON``, ``GemmConfig.wait_horizon``; one flag per block): remote
blocks arrive in the order the tile order takes them (block 0 of every peer, then block 1, ...),
so a program keeps ``horizon``, the number of remote blocks in that order that it has seen ready
without a gap. A remote tile below the horizon waits on nothing; one at or past it scans up to
``HORIZON_SCAN`` flags from the horizon on (``ready_prefix``: an acquire load per flag, a
CTA-wide minimum), advances the horizon and fences once for TMA; only if its own block is still
past the horizon does it wait on its flag as before. When the blocks are all in (the GEMM alone,
or a late program), a program scans once instead of waiting per tile; while they stream in, one
scan covers every block that arrived since the last. The loads' row is selected by the tile's
coverage, so they depend on the scan as on a wait.

Records (``INSTRUMENT``, kernels/device/trace.py) at phase changes only (a record costs a CTA
barrier and a clock read): AG records ``compute`` before a wait that will spin and ``flag_wait``
after it, and one last ``compute``; RS records ``compute`` after each tile's MMA loop and then
``store_push`` (peer tile: its stores) or ``compute`` (own tile's epilogue).

``COUNT`` (debug, AG ``A_WAIT`` and RS) counts per output tile how often it was computed and (AG)
the least flag value it saw, so tests can check the flag protocol.
"""
from __future__ import annotations

import iris
import triton
import triton.language as tl

from taxmodel.kernels.device import trace
from taxmodel.kernels.device.sync import acquire_load, fence_tma_after_acquire, signal, wait_geq

#: The engine's roles (constexpr globals: kernels pass them as ``ROLE``).
ROLE_AG: tl.constexpr = tl.constexpr(0)
ROLE_RS: tl.constexpr = tl.constexpr(1)

A_LOCAL = 0
A_PULL = 1
A_WAIT = 2


@triton.jit
def _grouped(seg_t, seg_first, seg_blocks, n_tiles, GROUP_M: tl.constexpr):
    """Tile ``seg_t`` of a segment of ``seg_blocks`` M-blocks starting at sequence position
    ``seg_first`` -> (sequence position of its M-block, N-tile), ``GROUP_M`` M-blocks per group."""
    tiles_per_group = GROUP_M * n_tiles
    first = (seg_t // tiles_per_group) * GROUP_M
    group_size = tl.minimum(seg_blocks - first, GROUP_M)
    within = seg_t % tiles_per_group
    return seg_first + first + within % group_size, within // group_size


@triton.jit
def peer_block(r, rank, blocks_per_rank, WORLD: tl.constexpr, CHUNK: tl.constexpr = 1):
    """Position ``r`` of the peers' blocks in delivery order -> (the peer's rank, the block within
    its slab). ``WORLD`` > 1. ``CHUNK`` 1: interleaved block by block (block 0 of rank+1, rank+2,
    ..., then block 1, ...). ``CHUNK`` > 1 (AG on the copy engines, ``CHUNK`` blocks a copy): copy
    by copy, as the engine delivers them (the blocks of rank+1's first copy, then rank+2's first,
    ..., then every peer's second copy; a slab's last copy may hold fewer blocks)."""
    if CHUNK == 1:
        return (rank + r % (WORLD - 1) + 1) % WORLD, r // (WORLD - 1)
    per_round = (WORLD - 1) * CHUNK
    c = r // per_round
    first, size = _copy_round(c, blocks_per_rank, CHUNK)
    w = r - c * per_round
    return (rank + w // size + 1) % WORLD, first + w % size


@triton.jit
def peer_position(slab, j, rank, blocks_per_rank, WORLD: tl.constexpr, CHUNK: tl.constexpr = 1):
    """``peer_block``'s inverse: block ``j`` of peer ``slab`` -> its position in the delivery order."""
    p = (slab - rank - 1 + WORLD) % WORLD
    if CHUNK == 1:
        return j * (WORLD - 1) + p
    c = j // CHUNK
    first, size = _copy_round(c, blocks_per_rank, CHUNK)
    return c * (WORLD - 1) * CHUNK + p * size + (j - first)


@triton.jit
def _copy_round(c, blocks_per_rank, CHUNK: tl.constexpr):
    """Round ``c`` of the copies (every peer's ``c``-th copy of ``CHUNK`` blocks) -> (its first block,
    the blocks in each peer's copy of it: fewer in a slab's last copy; at least 1, so that positions
    past the last one, which callers mask, never divide by 0)."""
    first = c * CHUNK
    return first, tl.maximum(tl.minimum(blocks_per_rank - first, CHUNK), 1)


@triton.jit
def tile_coords(t, rank, blocks_per_rank, n_tiles, ROLE: tl.constexpr, WORLD: tl.constexpr, GROUP_M: tl.constexpr,
                CHUNK: tl.constexpr = 1):
    """Tile number ``t`` -> (slab rank, block within the slab, N-tile index) in the role's order
    (``CHUNK``: the peers' blocks in ``peer_block``'s order for copies of that many blocks; AG only)."""
    if ROLE == 0:
        own_tiles = blocks_per_rank * n_tiles
        in_first = t < own_tiles
        first_blocks = blocks_per_rank
        rest_blocks = (WORLD - 1) * blocks_per_rank
    else:
        peer_tiles = (WORLD - 1) * blocks_per_rank * n_tiles
        in_first = t < peer_tiles
        first_blocks = (WORLD - 1) * blocks_per_rank
        rest_blocks = blocks_per_rank
    seg_t = tl.where(in_first, t, t - first_blocks * n_tiles)
    seg_first = tl.where(in_first, 0, first_blocks)
    seg_blocks = tl.where(in_first, first_blocks, rest_blocks)
    s, pid_n = _grouped(seg_t, seg_first, seg_blocks, n_tiles, GROUP_M)
    if ROLE == 0:
        # Own slab first, then the peers' blocks interleaved (rank+1, rank+2, ... for each block).
        is_own = s < blocks_per_rank
        r = s - blocks_per_rank
        if WORLD > 1:
            peer, peer_j = peer_block(r, rank, blocks_per_rank, WORLD, CHUNK)
            slab = tl.where(is_own, rank, peer)
            j = tl.where(is_own, s, peer_j)
        else:
            slab = rank + 0 * s
            j = s
    else:
        # Peers interleaved block by block (rank+1 first), own slab last.
        peer_blocks = (WORLD - 1) * blocks_per_rank
        if WORLD > 1:
            peer, peer_j = peer_block(s, rank, blocks_per_rank, WORLD)
            slab = tl.where(in_first, peer, rank)
            j = tl.where(in_first, peer_j, s - peer_blocks)
        else:
            slab = rank + 0 * s
            j = s
    return slab, j, pid_n


@triton.jit
def rs_spread_coords(t, rank, blocks_per_rank, n_tiles, lag, WORLD: tl.constexpr, GROUP_M: tl.constexpr):
    """RS in the spread order (``RS_SPREAD``): tile number ``t`` -> (slab rank, block within the slab,
    N-tile index). The M-blocks are taken in rounds: round ``i`` holds block ``i`` of every peer's
    slab (rank+1 first) and, ``lag`` rounds behind, this rank's own block ``i - lag``. As rows in a
    row: a head of ``lag`` rounds of peers only, a middle of W rows a round (the peers' block, then
    the own block ``lag`` behind), a tail of the last ``lag`` own blocks (``B`` blocks a slab; the
    host keeps ``1 <= lag <= B``). Each of the three is taken ``GROUP_M`` rows at a time, every
    N-tile of those rows before the next rows (``_grouped``: concurrently running programs share
    A's rows and B's columns in L2), so a wave holds (W-1)/W peers' tiles wherever the rounds are
    whole. Why: the peers-first order pushes (W-1)/W of the tiles in the first (W-1)/W of the kernel,
    faster than the links take them (4x H200, M=8192: 96 MiB in ~280 us, and the pushes' store time
    doubled while they queued); spread, every wave pushes (W-1)/W of its tiles and the links keep up."""
    if WORLD == 1:
        s, pid_n = _grouped(t, 0, blocks_per_rank, n_tiles, GROUP_M)
        return rank + 0 * t, s, pid_n
    rows_head = lag * (WORLD - 1)
    rows_mid = (blocks_per_rank - lag) * WORLD
    tiles_head = rows_head * n_tiles
    tiles_mid = rows_mid * n_tiles
    in_head = t < tiles_head
    in_mid = (t >= tiles_head) & (t < tiles_head + tiles_mid)
    seg_t = tl.where(in_head, t, tl.where(in_mid, t - tiles_head, t - tiles_head - tiles_mid))
    seg_first = tl.where(in_head, 0, tl.where(in_mid, rows_head, rows_head + rows_mid))
    seg_rows = tl.where(in_head, rows_head, tl.where(in_mid, rows_mid, lag))
    r, pid_n = _grouped(seg_t, seg_first, seg_rows, n_tiles, GROUP_M)
    r_mid = tl.maximum(r - rows_head, 0)
    # head: peer r % (W-1) of block r // (W-1); middle: W rows a round, the own block last;
    # tail: the last lag own blocks
    peer_s = tl.where(in_head, r % (WORLD - 1), r_mid % WORLD)
    is_own = (~in_head) & ((~in_mid) | (peer_s == WORLD - 1))
    block = tl.where(in_head, r // (WORLD - 1),
                     tl.where(in_mid, lag + r_mid // WORLD - tl.where(is_own, lag, 0),
                              blocks_per_rank - lag + (r - rows_head - rows_mid)))
    slab = tl.where(is_own, rank, (rank + 1 + peer_s) % WORLD)
    return slab, block, pid_n


@triton.jit
def k_steps(acc, a_ptr, b_ptr, a_desc, b_desc, a_row0, rows, row_ok, offs_n, col_ok, col0, kt0, kt1, K,
            stride_am, stride_ak, stride_bk, stride_bn, rank, src, heap_bases,
            BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, USE_TMA: tl.constexpr, A_REMOTE: tl.constexpr):
    """``acc`` += A[rows, kt0*BK : kt1*BK] @ B[same K, offs_n]: TMA (rows ``a_row0 ..`` whole, the
    descriptor zero-fills past the tensor's end) or masked pointer loads (``A_REMOTE``: A from rank
    ``src``'s heap through ``iris.load``)."""
    if USE_TMA:
        for kt in tl.range(kt0, kt1, num_stages=NUM_STAGES):
            a = a_desc.load([a_row0, kt * BLOCK_K])
            b = b_desc.load([kt * BLOCK_K, col0])
            acc = tl.dot(a, b, acc)
    else:
        offs_k = tl.arange(0, BLOCK_K)
        a_rows = a_ptr + rows[:, None] * stride_am
        b_cols = b_ptr + offs_n[None, :] * stride_bn
        for kt in tl.range(kt0, kt1, num_stages=NUM_STAGES):
            ks = kt * BLOCK_K + offs_k
            k_ok = ks < K
            a_mask = row_ok[:, None] & k_ok[None, :]
            if A_REMOTE:
                a = iris.load(a_rows + ks[None, :] * stride_ak, rank, src, heap_bases, mask=a_mask, other=0.0)
            else:
                a = tl.load(a_rows + ks[None, :] * stride_ak, mask=a_mask, other=0.0)
            b = tl.load(b_cols + ks[:, None] * stride_bk, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def store_local(acc, c_ptr, c_desc, row0, rows, row_ok, offs_n, col_ok, col0, stride_cm, stride_cn,
                BLOCK_N: tl.constexpr, TMA_STORE: tl.constexpr, EPI_SPLIT: tl.constexpr):
    """Store a finished tile into local memory: a TMA store of whole rows ``row0 ..`` in ``EPI_SPLIT``
    column parts, or a masked pointer store of ``rows`` x ``offs_n``."""
    out_dtype = c_ptr.dtype.element_ty
    if TMA_STORE:
        if EPI_SPLIT == 2:
            acc3 = tl.permute(tl.reshape(acc, (acc.shape[0], 2, BLOCK_N // 2)), (0, 2, 1))
            acc_lo, acc_hi = tl.split(acc3)
            c_desc.store([row0, col0], acc_lo.to(out_dtype))
            c_desc.store([row0, col0 + BLOCK_N // 2], acc_hi.to(out_dtype))
        else:
            c_desc.store([row0, col0], acc.to(out_dtype))
    else:
        c_ptrs = c_ptr + rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(out_dtype), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def wait_piece(flags_ptr, flag, waits, a_row0, seen_min, rec_ptr, pid, t_rec, err_ptr, rank, src, epoch, budget,
               kernel_id, SYNC_MODE: tl.constexpr, USE_TMA: tl.constexpr, COUNT: tl.constexpr,
               INSTRUMENT: tl.constexpr, WAIT_VOTE: tl.constexpr):
    """If ``waits``: wait (acquire, bounded) until flag ``flag`` holds ``epoch``, with records around a
    wait that spins. Returns (A's first row for the loads, the record clock, the least flag seen).

    The row is computed from the wait's outcome (the same row when the flag arrived), so the loads
    depend on the wait and no schedule can issue them before it."""
    ok = True
    if waits:
        if INSTRUMENT:
            # A scalar atomic reads the flag once for the whole CTA (``late`` must agree in every
            # thread: the records hold barriers).
            late = tl.atomic_add(flags_ptr + flag, 0, sem="relaxed", scope="sys") < epoch
            if late:
                t_rec = trace.mark(rec_ptr, pid, trace.COMPUTE, t_rec, INSTRUMENT, SYNC_MODE)
        ok = wait_geq(flags_ptr + flag, epoch, budget, err_ptr, rank, src, flag, kernel_id, SYNC_MODE, False, WAIT_VOTE)
        if INSTRUMENT:
            if late:
                t_rec = trace.mark(rec_ptr, pid, trace.FLAG_WAIT, t_rec, INSTRUMENT, SYNC_MODE)
        if USE_TMA:
            fence_tma_after_acquire(SYNC_MODE)
        if COUNT:
            seen_min = tl.minimum(seen_min, tl.load(flags_ptr + flag, volatile=True).to(tl.int32))
    return a_row0 + tl.where(ok, 0, 1), t_rec, seen_min


@triton.jit
def flag_block(j, blocks_per_rank, FLAG_CHUNK: tl.constexpr):
    """The block whose flag says block ``j`` of a slab has landed: the last block of its group of
    ``FLAG_CHUNK`` (one copy-engine copy moves a group and sets that one flag; ``j`` itself at 1)."""
    if FLAG_CHUNK == 1:
        return j
    return tl.minimum((j // FLAG_CHUNK + 1) * FLAG_CHUNK, blocks_per_rank) - 1


@triton.jit
def ready_prefix(flags_ptr, rank, blocks_per_rank, horizon, epoch, WORLD: tl.constexpr, SCAN: tl.constexpr,
                 SYNC_MODE: tl.constexpr, FLAG_CHUNK: tl.constexpr = 1, ORDER_CHUNK: tl.constexpr = 1):
    """AG ``A_WAIT``, one flag per block (``K_PIECES`` 1): the new horizon after one scan, i.e. ``horizon`` plus how
    many remote blocks from position ``horizon`` on (delivery order, ``SCAN`` at most) already
    hold ``epoch``, without a gap. Every thread reads its share of the flags with an acquire load
    (``sync.acquire_load``; plain volatile loads in the interpreter); the count is a CTA-wide
    reduction, so every thread gets the same horizon."""
    pos = horizon + tl.arange(0, SCAN)
    in_range = pos < (WORLD - 1) * blocks_per_rank
    src, j = peer_block(pos, rank, blocks_per_rank, WORLD, ORDER_CHUNK)
    idx = tl.where(in_range, src * blocks_per_rank + flag_block(j, blocks_per_rank, FLAG_CHUNK), 0)
    if SYNC_MODE == 1:
        vals = acquire_load(flags_ptr + idx, False)
    else:
        vals = tl.load(flags_ptr + idx, volatile=True).to(tl.int32)
    ready = in_range & (vals >= epoch)
    return horizon + tl.min(tl.where(ready, SCAN, tl.arange(0, SCAN)), axis=0)


@triton.jit
def persistent_gemm(
    pid, a_ptr, b_ptr, c_ptr, a_desc, b_desc, c_desc,
    flags_ptr, heap_bases, err_ptr, count_ptr, seen_ptr, rec_ptr, t_rec,
    M_loc, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    a_row_shift_remote, rank, epoch, budget, kernel_id,
    ROLE: tl.constexpr, WORLD: tl.constexpr, A_MODE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGS: tl.constexpr, NUM_STAGES: tl.constexpr, USE_TMA: tl.constexpr, SYNC_MODE: tl.constexpr,
    COUNT: tl.constexpr, TMA_STORE: tl.constexpr, EPI_SPLIT: tl.constexpr, K_PIECES: tl.constexpr,
    KT_PER_PIECE: tl.constexpr, INSTRUMENT: tl.constexpr, FLATTEN: tl.constexpr, VEC_HINT: tl.constexpr,
    WAIT_VOTE: tl.constexpr = False, WAIT_HORIZON: tl.constexpr = False, HORIZON_SCAN: tl.constexpr = 64,
    FLAG_CHUNK: tl.constexpr = 1, ORDER_CHUNK: tl.constexpr = 1, RS_SPREAD: tl.constexpr = False, rs_lag=1,
):
    """Every tile of this program (``pid``), in the role's order; returns the record clock ``t_rec``.

    AG: ``c_ptr`` is C [WORLD * M_loc, N] (row of slab ``src`` block ``j``: ``src * M_loc + j * BM``),
    ``flags_ptr`` this launch's flags (``K_PIECES`` per block, index ``(src * blocks + j) * K_PIECES + p``),
    ``a_row_shift_remote`` the row offset of remote slabs in ``a_ptr`` (the push variant's odd parity).
    RS: ``c_ptr`` is this source's slot in the epoch's half of the receive buffer ([M_loc, N] rows of
    every owner at the same offset of every heap), ``flags_ptr`` the flags [tiles of a slab, WORLD].
    """
    blocks_per_rank = tl.cdiv(M_loc, BLOCK_M)
    n_tiles = tl.cdiv(N, BLOCK_N)
    num_tiles = WORLD * blocks_per_rank * n_tiles
    k_tiles = tl.cdiv(K, BLOCK_K)
    horizon = tl.cast(0, tl.int32)  # remote blocks (delivery order) known ready: WAIT_HORIZON
    for t in tl.range(pid, num_tiles, NUM_PROGS, flatten=FLATTEN):
        if RS_SPREAD:
            slab, j, pid_n = rs_spread_coords(t, rank, blocks_per_rank, n_tiles, rs_lag, WORLD, GROUP_M)
        else:
            slab, j, pid_n = tile_coords(t, rank, blocks_per_rank, n_tiles, ROLE, WORLD, GROUP_M, ORDER_CHUNK)
        offs_r = j * BLOCK_M + tl.arange(0, BLOCK_M)  # rows within the slab
        row_ok = offs_r < M_loc
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = offs_n < N
        a_row0 = slab * M_loc + j * BLOCK_M
        if ROLE == 0:
            a_row0 += tl.where(slab != rank, a_row_shift_remote, 0)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if (ROLE == 0) and (A_MODE == 2):
            # Remote tiles wait before their first K-step (one piece: the whole block) or piece by
            # piece along K (K_PIECES > 1); own tiles never wait.
            waits = slab != rank
            flag_idx = (slab * blocks_per_rank + flag_block(j, blocks_per_rank, FLAG_CHUNK)) * K_PIECES
            seen_min = tl.cast(epoch, tl.int32)
            if K_PIECES == 1:
                if WAIT_HORIZON and (WORLD > 1):
                    # Remote blocks arrive in delivery order (``peer_block``); positions below
                    # ``horizon`` were seen ready by an earlier scan of this program (acquired, then
                    # fenced for TMA): no wait at all.
                    r_pos = peer_position(slab, j, rank, blocks_per_rank, WORLD, ORDER_CHUNK)
                    if waits & (r_pos >= horizon):
                        horizon = ready_prefix(flags_ptr, rank, blocks_per_rank, horizon, epoch, WORLD, HORIZON_SCAN,
                                               SYNC_MODE, FLAG_CHUNK, ORDER_CHUNK)
                        if USE_TMA:
                            fence_tma_after_acquire(SYNC_MODE)
                    covered = waits & (r_pos < horizon)
                    a_wait, t_rec, seen_min = wait_piece(flags_ptr, flag_idx, waits & (r_pos >= horizon), a_row0,
                                                         seen_min, rec_ptr, pid, t_rec, err_ptr, rank, slab, epoch,
                                                         budget, kernel_id, SYNC_MODE, USE_TMA, COUNT, INSTRUMENT,
                                                         WAIT_VOTE)
                    # The loads' row depends on the scan's outcome (as on a wait's): no schedule can
                    # issue them before it.
                    a_row = tl.where(covered, a_row0, a_wait)
                    if COUNT:
                        if covered:
                            seen_min = tl.minimum(seen_min, tl.load(flags_ptr + flag_idx, volatile=True).to(tl.int32))
                else:
                    a_row, t_rec, seen_min = wait_piece(flags_ptr, flag_idx, waits, a_row0, seen_min, rec_ptr, pid,
                                                        t_rec, err_ptr, rank, slab, epoch, budget, kernel_id,
                                                        SYNC_MODE, USE_TMA, COUNT, INSTRUMENT, WAIT_VOTE)
                acc = k_steps(acc, a_ptr, b_ptr, a_desc, b_desc, a_row, a_row - j * BLOCK_M + offs_r, row_ok, offs_n,
                              col_ok, pid_n * BLOCK_N, 0, k_tiles, K, stride_am, stride_ak, stride_bk, stride_bn,
                              rank, slab, heap_bases, BLOCK_K, NUM_STAGES, USE_TMA, False)
            else:
                n_pieces = tl.where(waits, K_PIECES, 1)
                kt_piece = tl.where(waits, KT_PER_PIECE, k_tiles)
                for kp in range(0, n_pieces):
                    a_row, t_rec, seen_min = wait_piece(flags_ptr, flag_idx + kp, waits, a_row0, seen_min, rec_ptr,
                                                        pid, t_rec, err_ptr, rank, slab, epoch, budget, kernel_id,
                                                        SYNC_MODE, USE_TMA, COUNT, INSTRUMENT, WAIT_VOTE)
                    kt0 = kp * kt_piece
                    kt1 = tl.minimum(kt0 + kt_piece, k_tiles)
                    acc = k_steps(acc, a_ptr, b_ptr, a_desc, b_desc, a_row, a_row - j * BLOCK_M + offs_r, row_ok,
                                  offs_n, col_ok, pid_n * BLOCK_N, kt0, kt1, K, stride_am, stride_ak, stride_bk,
                                  stride_bn, rank, slab, heap_bases, BLOCK_K, NUM_STAGES, USE_TMA, False)
            if COUNT:
                tl.store(seen_ptr + (slab * blocks_per_rank + j) * n_tiles + pid_n, seen_min)
        else:
            acc = k_steps(acc, a_ptr, b_ptr, a_desc, b_desc, a_row0, a_row0 - j * BLOCK_M + offs_r, row_ok, offs_n,
                          col_ok, pid_n * BLOCK_N, 0, k_tiles, K, stride_am, stride_ak, stride_bk, stride_bn, rank,
                          slab, heap_bases, BLOCK_K, NUM_STAGES, USE_TMA, (ROLE == 0) and (A_MODE == 1))
        if ROLE == 0:
            c_row0 = slab * M_loc + j * BLOCK_M
            store_local(acc, c_ptr, c_desc, c_row0, c_row0 - j * BLOCK_M + offs_r, row_ok, offs_n, col_ok,
                        pid_n * BLOCK_N, stride_cm, stride_cn, BLOCK_N, TMA_STORE, EPI_SPLIT)
            if COUNT:
                tl.atomic_add(count_ptr + (slab * blocks_per_rank + j) * n_tiles + pid_n, 1)
        else:
            t_rec = trace.mark(rec_ptr, pid, trace.COMPUTE, t_rec, INSTRUMENT, SYNC_MODE)
            dst = c_ptr + offs_r[:, None] * stride_cm + offs_n[None, :] * stride_cn  # the slot's row stride
            mask = row_ok[:, None] & col_ok[None, :]
            val = acc.to(c_ptr.dtype.element_ty)
            # One store for own and peers' tiles (an own tile's pointer translates to itself): a
            # branch on the owner around two stores crashes Triton 3.6's pipeliner in the
            # flattened loop. The hint marks 16-byte contiguous runs: vector stores over the link.
            if VEC_HINT:
                iris.store(dst, val, rank, slab, heap_bases, mask=mask, hint=(1, 16))
            else:
                iris.store(dst, val, rank, slab, heap_bases, mask=mask)
            # A peer's tile: moving it out is communication only; an own tile's store is the epilogue.
            t_rec = trace.mark(rec_ptr, pid, tl.where(slab == rank, trace.COMPUTE, trace.STORE_PUSH), t_rec,
                               INSTRUMENT, SYNC_MODE)
    if ROLE == 1:
        release_tiles(flags_ptr, pid, rank, epoch, heap_bases, blocks_per_rank, n_tiles, num_tiles, NUM_PROGS, WORLD,
                      GROUP_M, SYNC_MODE, RS_SPREAD, rs_lag)
    return t_rec


@triton.jit
def release_tiles(flags_ptr, pid, rank, epoch, heap_bases, blocks_per_rank, n_tiles, num_tiles,
                  NUM_PROGS: tl.constexpr, WORLD: tl.constexpr, GROUP_M: tl.constexpr, SYNC_MODE: tl.constexpr,
                  RS_SPREAD: tl.constexpr = False, rs_lag=1):
    """RS, after a program's last tile: one release (system scope) on the scratch flag row, then the
    flag of every tile this program pushed set to ``epoch`` on its owner (relaxed: the release's
    fence already ordered every store of the program before them)."""
    signal(flags_ptr + blocks_per_rank * n_tiles * WORLD + rank, epoch, rank, rank, heap_bases, SYNC_MODE)
    for t in range(pid, num_tiles, NUM_PROGS):
        if RS_SPREAD:
            slab, j, pid_n = rs_spread_coords(t, rank, blocks_per_rank, n_tiles, rs_lag, WORLD, GROUP_M)
        else:
            slab, j, pid_n = tile_coords(t, rank, blocks_per_rank, n_tiles, 1, WORLD, GROUP_M)
        flag = flags_ptr + (j * n_tiles + pid_n) * WORLD + rank
        iris.atomic_xchg(flag, tl.cast(epoch, flags_ptr.dtype.element_ty), rank, slab, heap_bases, sem="relaxed",
                         scope="sys")


def flatten_ok(k_pieces: int, instrument: bool, use_tma: bool) -> bool:
    """Whether a launch may use the flattened schedule (see the module docstring): one K piece per
    tile, no in-kernel records, TMA loads (the pointer path is the interpreter's and ``A_PULL``'s)."""
    return k_pieces == 1 and not instrument and use_tma
