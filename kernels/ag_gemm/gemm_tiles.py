"""The persistent tile GEMM shared by the fine-grained All-Gather+GEMM variants.

Math: C[M, N] = A_gathered[M, K] @ B[K, N], where A_gathered's rows come in ``WORLD`` slabs of
``M_loc`` rows, slab ``r`` being rank ``r``'s shard. Output tiles are ``BLOCK_M x BLOCK_N``; an
M-block never straddles two slabs (the last block of each slab is partial when ``M_loc`` is not a
multiple of ``BLOCK_M``), so every tile reads A from exactly one source rank.

Tile order (why): this rank's own slab first (no communication needed), then the remote slabs
interleaved block by block (block 0 of every peer, then block 1, ...), which is the order in which
the push kernels deliver them; consecutive tiles are grouped ``GROUP_M`` M-blocks at a time so that
concurrently running programs share A and B tiles in L2.

How A reaches the tile (``A_MODE``, a constexpr):
- ``A_LOCAL`` (0): every row is already in ``a_ptr`` (the gathered buffer): the GEMM alone (floor).
- ``A_PULL`` (1): ``a_ptr`` is the gathered buffer on the symmetric heap, each rank's own slab filled;
  rows of slab ``src`` are loaded straight from rank ``src``'s buffer with ``iris.load`` (no flags:
  the slab is written before the launch, and a host barrier separates setup from the first run).
- ``A_WAIT`` (2): ``a_ptr`` is the gathered buffer; a tile of remote slab ``src`` and block ``j``
  reads K in ``k_pieces`` pieces (``k_pieces(cfg, K)``: 1 for the copy engines, which flag whole
  blocks) and before piece ``p`` waits (acquire) until
  ``flags[(src * blocks_per_rank + j) * k_pieces + p] >= epoch`` (every flag is set to the epoch
  by whoever brings that piece: the peer that pushed it, or this rank's own staging copy in the
  pull variant); own rows are already in place. The flags live in this rank's memory, so the
  wait polls local L2, never a link.

Epoch in device memory (why: CUDA graphs). ``epoch_ptr`` points at two int32 words owned by this
kernel's launches on one rank: [last finished epoch, programs done]. Every program reads the
epoch at its start (``+ 1``: this launch's epoch) and the last program to finish writes it back,
so a captured graph that replays the launch waits for the right epoch each time (a host-side
epoch argument would be frozen into the graph). The push variant double-buffers the remote rows
and flags by epoch parity: ``parity_rows`` and ``flag_parity_stride`` are the offsets of the odd
parity (0 when there is a single buffer); own rows are always read from parity 0.

In-kernel records (``INSTRUMENT``, kernels/device/trace.py), only at phase changes because a record
costs a CTA barrier and a clock read (and a GEMM waits on up to ``K_PIECES`` flags per remote tile,
most already set): before each wait on a K piece the flag is read once; if it is not
there yet, the CTA records ``compute`` (everything since its previous record: MMA loops,
epilogues, waits that did not spin) and, once the flag arrived, ``flag_wait``. The CTA's last
record is ``compute`` up to its last tile's end. So a CTA writes ``1 + 2 x (waits that spun)``
records, alternating compute / flag_wait (``gemm_record_layout``). With ``INSTRUMENT=False`` no
record code is compiled.

The persistent grid is ``NUM_PROGS`` programs (at most the SM count), each looping over tiles with
stride ``NUM_PROGS``, so a launch never needs more programs than fit at once (no program waits on
a program that is not running). ``USE_TMA`` loads A and B through tensor descriptors (Hopper TMA);
otherwise through pointers (required under the interpreter and for ``A_PULL``).
``WARP_SPECIALIZE`` asks Triton to warp-specialize the TMA K loop (producer/consumer warps); the
tile configuration per shape comes from ``gemm_table.py`` (``config_for_shape``).

``COUNT`` (debug) counts, per output tile, how often it was computed and which flag epoch it saw,
so tests can check the flag protocol (each tile exactly once, never before its flag).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import triton
import triton.language as tl

import iris

from taxmodel.kernels.ag_gemm import gemm_table
from taxmodel.kernels.device import trace
from taxmodel.kernels.device.sync import fence_tma_after_acquire, interpreting, wait_geq

A_LOCAL = 0
A_PULL = 1
A_WAIT = 2


@triton.jit
def _tile_coords(t, rank, blocks_per_rank, num_mblocks, n_tiles, WORLD: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile number ``t`` -> (source rank, block within the source slab, N-tile index).

    The M-block sequence is this rank's slab, then the peers' blocks interleaved (block 0 of every
    peer, then block 1, ...). Tiles are grouped ``GROUP_M`` M-blocks at a time (M fastest within a
    group, for L2 reuse of B), and groups never straddle the end of the own slab: every own tile
    comes before every remote tile, so when the own slab holds about a wave of tiles (e.g. M=1024 on
    4 ranks with 128x128 tiles) the first wave needs no communication at all.
    """
    own_tiles = blocks_per_rank * n_tiles
    in_own = t < own_tiles
    seg_t = tl.where(in_own, t, t - own_tiles)
    seg_first = tl.where(in_own, 0, blocks_per_rank)
    seg_blocks = tl.where(in_own, blocks_per_rank, num_mblocks - blocks_per_rank)
    tiles_per_group = GROUP_M * n_tiles
    group = seg_t // tiles_per_group
    first = group * GROUP_M
    group_size = tl.minimum(seg_blocks - first, GROUP_M)
    within = seg_t % tiles_per_group
    s = seg_first + first + within % group_size  # position in the M-block sequence
    pid_n = within // group_size
    # Sequence position -> (src, j): own slab first, then peers interleaved block by block.
    is_own = s < blocks_per_rank
    r = s - blocks_per_rank
    j_remote = r // (WORLD - 1) if WORLD > 1 else r
    step = r % (WORLD - 1) + 1 if WORLD > 1 else 0
    src = tl.where(is_own, rank, (rank + step) % WORLD)
    j = tl.where(is_own, s, j_remote)
    return src, j, pid_n


@triton.jit
def advance_epoch(epoch_ptr, epoch, NUM_PROGS: tl.constexpr):
    """The last program of a launch to get here stores ``epoch`` as the last finished epoch
    (``epoch_ptr[0]``) and re-arms the done counter (``epoch_ptr[1]``) for the next launch. Every
    program read ``epoch_ptr[0]`` at its start, before it counted itself done, so no program of
    this launch can see the new value."""
    tl.debug_barrier()
    finished = tl.atomic_add(epoch_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if finished == NUM_PROGS - 1:
        tl.store(epoch_ptr + 1, 0)
        tl.atomic_xchg(epoch_ptr, epoch, sem="release", scope="gpu")


# rank changes between ranks: unspecialized, so every rank compiles the same kernel.
@triton.jit(do_not_specialize=["rank", "budget"])
def ag_gemm_kernel(
    a_ptr, b_ptr, c_ptr, a_desc, b_desc, c_desc,
    flags_ptr, heap_bases, err_ptr, count_ptr, seen_ptr, epoch_ptr, rec_ptr,
    M_loc, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    parity_rows, flag_parity_stride,
    rank, budget, kernel_id,
    WORLD: tl.constexpr, A_MODE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGS: tl.constexpr, NUM_STAGES: tl.constexpr, USE_TMA: tl.constexpr,
    SYNC_MODE: tl.constexpr, COUNT: tl.constexpr, TMA_STORE: tl.constexpr = False, EPI_SPLIT: tl.constexpr = 1,
    K_PIECES: tl.constexpr = 1, KT_PER_PIECE: tl.constexpr = 1, INSTRUMENT: tl.constexpr = False,
    WARP_SPECIALIZE: tl.constexpr = False,
):
    pid = tl.program_id(0)
    t_rec = trace.begin(INSTRUMENT, SYNC_MODE)  # in-kernel records; nothing when off
    blocks_per_rank = tl.cdiv(M_loc, BLOCK_M)
    num_mblocks = WORLD * blocks_per_rank
    n_tiles = tl.cdiv(N, BLOCK_N)
    num_tiles = num_mblocks * n_tiles
    k_tiles = tl.cdiv(K, BLOCK_K)
    out_dtype = c_ptr.dtype.element_ty
    if A_MODE == 2:
        epoch = tl.load(epoch_ptr) + 1  # this launch's epoch (device memory: graph-safe)
        parity = epoch % 2
        flags_base = flags_ptr + parity * flag_parity_stride
    else:
        epoch = 0
        parity = 0
        flags_base = flags_ptr

    for t in range(pid, num_tiles, NUM_PROGS):
        src, j, pid_n = _tile_coords(t, rank, blocks_per_rank, num_mblocks, n_tiles, WORLD, GROUP_M)
        offs_r = j * BLOCK_M + tl.arange(0, BLOCK_M)  # rows within the source slab
        row_ok = offs_r < M_loc
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = offs_n < N
        flag_idx = src * blocks_per_rank + j
        # Remote rows of the odd parity live parity_rows further down; own rows only in parity 0.
        a_row_shift = tl.where(src != rank, parity * parity_rows, 0)

        # Remote tiles of A_WAIT wait piece by piece along K (flag per K_PIECES column piece of the
        # block): a tile starts as soon as the first piece of its block has landed and the rest
        # streams in while it computes. Own tiles (and the other modes) run one piece: all of K.
        waits = (A_MODE == 2) & (src != rank)
        n_pieces = tl.where(waits, K_PIECES, 1)
        kt_piece = tl.where(waits, KT_PER_PIECE, k_tiles)
        seen_min = tl.cast(epoch, tl.int32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kp in range(0, n_pieces):
            if waits:
                piece_flag = flag_idx * K_PIECES + kp
                if INSTRUMENT:
                    # Records only at phase changes (a record costs a CTA barrier): a wait that
                    # will spin closes the compute run so far and gets its own record. ``late`` must
                    # be the same in every thread (the records hold barriers): a scalar atomic reads
                    # the flag once and broadcasts it, where a plain load in every thread could
                    # straddle the flag's arrival and split the CTA (misaligned barriers, a hang).
                    late = tl.atomic_add(flags_base + piece_flag, 0, sem="relaxed", scope="sys") < epoch
                    if late:
                        t_rec = trace.mark(rec_ptr, pid, trace.COMPUTE, t_rec, INSTRUMENT, SYNC_MODE)
                wait_geq(flags_base + piece_flag, epoch, budget, err_ptr, rank, src, piece_flag, kernel_id, SYNC_MODE)
                if INSTRUMENT:
                    if late:
                        t_rec = trace.mark(rec_ptr, pid, trace.FLAG_WAIT, t_rec, INSTRUMENT, SYNC_MODE)
                if USE_TMA:
                    fence_tma_after_acquire(SYNC_MODE)
                if COUNT:
                    # The flag as this tile saw it just before reading the piece (own slab: the epoch).
                    seen_min = tl.minimum(seen_min, tl.load(flags_base + piece_flag, volatile=True).to(tl.int32))
            kt0 = kp * kt_piece
            kt1 = tl.minimum(kt0 + kt_piece, k_tiles)
            if USE_TMA:
                row0 = a_row_shift + src * M_loc + j * BLOCK_M
                for kt in tl.range(kt0, kt1, num_stages=NUM_STAGES, warp_specialize=WARP_SPECIALIZE):
                    a = a_desc.load([row0, kt * BLOCK_K])
                    b = b_desc.load([kt * BLOCK_K, pid_n * BLOCK_N])
                    acc = tl.dot(a, b, acc)
            else:
                offs_k = tl.arange(0, BLOCK_K)
                a_rows = a_ptr + (a_row_shift + src * M_loc + offs_r)[:, None] * stride_am
                b_cols = b_ptr + offs_n[None, :] * stride_bn
                for kt in tl.range(kt0, kt1, num_stages=NUM_STAGES):
                    ks = kt * BLOCK_K + offs_k
                    k_ok = ks < K
                    a_mask = row_ok[:, None] & k_ok[None, :]
                    a_ptrs = a_rows + ks[None, :] * stride_ak
                    if A_MODE == 1:
                        a = iris.load(a_ptrs, rank, src, heap_bases, mask=a_mask, other=0.0)
                    else:
                        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
                    b = tl.load(b_cols + ks[:, None] * stride_bk, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                    acc = tl.dot(a, b, acc)
        if COUNT:
            if A_MODE == 2:
                tl.store(seen_ptr + (src * blocks_per_rank + j) * n_tiles + pid_n, seen_min)

        if TMA_STORE:
            # Asynchronous TMA store (bounds clipped by the descriptor: only whole-slab row blocks
            # may use it, see launch_ag_gemm), split in EPI_SPLIT column halves to halve the
            # shared memory it needs beside the load pipeline.
            row0_c = src * M_loc + j * BLOCK_M
            if EPI_SPLIT == 2:
                acc3 = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
                acc_lo, acc_hi = tl.split(acc3)
                c_desc.store([row0_c, pid_n * BLOCK_N], acc_lo.to(out_dtype))
                c_desc.store([row0_c, pid_n * BLOCK_N + BLOCK_N // 2], acc_hi.to(out_dtype))
            else:
                c_desc.store([row0_c, pid_n * BLOCK_N], acc.to(out_dtype))
        else:
            c_rows = src * M_loc + offs_r
            c_ptrs = c_ptr + c_rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
            tl.store(c_ptrs, acc.to(out_dtype), mask=row_ok[:, None] & col_ok[None, :])

        if COUNT:
            # Tiles are numbered in C order (global M-block, N-tile) so tests can index them.
            c_tile = (src * blocks_per_rank + j) * n_tiles + pid_n
            tl.atomic_add(count_ptr + c_tile, 1)
    t_rec = trace.mark(rec_ptr, pid, trace.COMPUTE, t_rec, INSTRUMENT, SYNC_MODE)  # the last compute run

    if A_MODE == 2:
        advance_epoch(epoch_ptr, epoch, NUM_PROGS)


# --- host side -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmConfig:
    """Tile, launch and transport parameters of the fused kernels (what the benchmark tunes).

    ``num_progs`` 0 means "one program per SM" on a GPU. ``transport`` says how remote rows of A
    reach this rank in the pull and push variants:

    - ``"ce"``: copy engines (``copy_engine.py``): whole M-blocks copied by ``cuMemcpyAsync`` on one
      side stream per peer, each followed by a flag write; no SM does any communication.
    - ``"sm"``: a small Triton copy kernel (``push_progs`` programs, ``push_warps`` warps) moving
      ``push_rows x push_block_k`` pieces with 16-byte vector loads/stores, one release-add per
      ``push_chunk_k`` columns of a block; it shares the SMs with the persistent GEMM (it needs no
      shared memory) unless ``reserve_sms`` leaves it ``push_progs`` SMs of its own.
    - ``"direct"`` (pull only): the GEMM loads remote A tiles straight from the peers' heaps
      (every remote tile crosses the link once per N-tile: the slow reference design).

    ``ce_signal`` picks the flag write after a copy-engine block: "mem" (stream memory operation)
    or "kernel" (one-program Triton kernel).
    """

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    num_stages: int = 3
    num_warps: int = 8
    num_progs: int = 0
    use_tma: bool = True
    tma_store: bool = False
    epi_split: int = 2
    transport: str = "ce"
    ce_signal: str = "mem"
    push_progs: int = 32
    push_rows: int = 32
    push_block_k: int = 256
    push_chunk_k: int = 2048
    push_warps: int = 4
    reserve_sms: bool = False
    warp_specialize: bool = False

    def tile_label(self) -> str:
        """The GEMM's part of ``label``: tile, pipeline, warps, grouping, loads/stores."""
        tma = "tma" if self.use_tma else "ptr"
        if self.use_tma and self.tma_store:
            tma += f"-st{self.epi_split}"
        gemm = f"{self.block_m}x{self.block_n}x{self.block_k}-s{self.num_stages}-w{self.num_warps}-g{self.group_m}-{tma}"
        if self.warp_specialize:
            gemm += "-ws"
        return gemm

    def label(self) -> str:
        gemm = self.tile_label()
        if self.transport == "ce":
            return f"{gemm}-ce-{self.ce_signal}"
        if self.transport == "sm":
            res = "-reserved" if self.reserve_sms else ""
            return f"{gemm}-sm{self.push_progs}x{self.push_rows}x{self.push_block_k}-c{self.push_chunk_k}{res}"
        return f"{gemm}-{self.transport}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Small tiles for Triton's interpreter (CPU): partial tiles appear at the tiny preset's shapes.
CPU_CONFIG = GemmConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_stages=1, num_warps=4,
                        num_progs=3, use_tma=False, push_progs=2, push_rows=8, push_block_k=16, push_chunk_k=32,
                        push_warps=4)

#: Defaults on a Hopper GPU (the benchmark tries a few others per size).
GPU_CONFIG = GemmConfig()


def default_config(device: torch.device) -> GemmConfig:
    return GPU_CONFIG if torch.device(device).type == "cuda" and not interpreting() else CPU_CONFIG


def config_for_shape(m: int, n: int, k: int, device: torch.device, base: GemmConfig | None = None) -> GemmConfig:
    """``base`` (default: the device's default) with the tile fields of the committed per-shape table
    (``gemm_table.py``) for a GEMM of ``m`` x ``n`` x ``k`` on a GPU; unchanged on the CPU (the
    interpreter's small tiles) and for a shape class the table does not hold."""
    cfg = base if base is not None else default_config(device)
    if torch.device(device).type != "cuda" or interpreting():
        return cfg
    fields = gemm_table.tile_fields(m, n, k)
    return replace(cfg, **fields) if fields else cfg


def tma_available() -> bool:
    """Host tensor descriptors exist (Triton >= 3.4) and we run on a Hopper-or-newer NVIDIA GPU."""
    if interpreting() or not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        return False
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability()[0] >= 9


def make_descriptor(t: torch.Tensor, block: list[int]) -> Any:
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, block)


_DESCRIPTORS: dict[tuple, Any] = {}


def cached_descriptor(t: torch.Tensor, block: list[int]) -> Any:
    """A tensor descriptor for ``t`` reused across launches (building one costs host time)."""
    key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, tuple(block))
    d = _DESCRIPTORS.get(key)
    if d is None:
        if len(_DESCRIPTORS) > 64:
            _DESCRIPTORS.clear()
        d = _DESCRIPTORS[key] = make_descriptor(t, block)
    return d


def num_programs(cfg: GemmConfig, device: torch.device, num_tiles: int, reserve: int = 0) -> int:
    """Persistent grid size: every program must be resident at once (waits inside the kernel)."""
    if cfg.num_progs > 0:
        n = cfg.num_progs
    elif torch.device(device).type == "cuda" and not interpreting():
        n = torch.cuda.get_device_properties(device).multi_processor_count - reserve
    else:
        n = 4
    return max(1, min(n, num_tiles))


def k_pieces(cfg: GemmConfig, k: int) -> int:
    """Flags per M-block: the K pieces that the ``sm`` transport moves and flags separately
    (``cfg.push_chunk_k`` columns each, a multiple of ``block_k``); 1 for the copy engines."""
    if cfg.transport != "sm":
        return 1
    return triton.cdiv(k, piece_cols(cfg, k))


def piece_cols(cfg: GemmConfig, k: int) -> int:
    """Columns per K piece of the ``sm`` transport (whole ``block_k`` steps, at most K rounded up)."""
    if cfg.push_chunk_k % cfg.block_k:
        raise ValueError(f"push_chunk_k {cfg.push_chunk_k} must be a multiple of block_k {cfg.block_k}")
    whole_k = triton.cdiv(k, cfg.block_k) * cfg.block_k
    return min(cfg.push_chunk_k, whole_k)


def tile_counts(m_loc: int, n: int, world: int, cfg: GemmConfig) -> tuple[int, int]:
    """(M-blocks per rank slab, N-tiles)."""
    return triton.cdiv(m_loc, cfg.block_m), triton.cdiv(n, cfg.block_n)


def gemm_record_layout(m_loc: int, n: int, world: int, cfg: GemmConfig, pieces: int, device: torch.device,
                       reserve: int = 0) -> trace.RecordLayout:
    """Record slots of one ``A_WAIT`` launch (the grid ``num_programs`` gives for ``device`` and
    ``reserve``): a program writes at most one record, plus two per remote tile it computes and K
    piece (if every wait spun). Remote tiles come after the own ones in one contiguous run of tile
    numbers, taken with stride ``programs``, so no program gets more than ceil(remote / programs)."""
    bpr, n_tiles = tile_counts(m_loc, n, world, cfg)
    programs = num_programs(cfg, device, world * bpr * n_tiles, reserve)
    remote = (world - 1) * bpr * n_tiles
    return trace.RecordLayout(programs, 1 + 2 * pieces * triton.cdiv(remote, programs))


def launch_ag_gemm(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, mode: int, rank: int, world: int, m_loc: int,
    cfg: GemmConfig, err: torch.Tensor, sync: int, flags: torch.Tensor | None = None,
    heap_bases: torch.Tensor | None = None, epochs: torch.Tensor | None = None, budget: int = 1,
    kernel_id: int = 0, count: torch.Tensor | None = None, seen: torch.Tensor | None = None,
    a_desc: Any = None, b_desc: Any = None, reserve_programs: int = 0, pieces: int = 1,
    parity_rows: int = 0, flag_parity_stride: int = 0, records: Any = None,
) -> None:
    """Enqueue one ``ag_gemm_kernel`` (see the module docstring for ``mode``); no host sync.

    ``A_WAIT`` needs ``epochs`` (int32 [2] on the device: last finished epoch, done counter; see
    the module docstring); ``records`` is the kernel's ``RecordBuffer`` (``INSTRUMENT`` on).
    """
    if mode == A_WAIT and epochs is None:
        raise ValueError("launch_ag_gemm: A_WAIT needs the device epoch words (epochs=)")
    n = b.shape[1]
    k = b.shape[0]
    bpr, n_tiles = tile_counts(m_loc, n, world, cfg)
    num_tiles = world * bpr * n_tiles
    progs = num_programs(cfg, c.device, num_tiles, reserve_programs)
    use_tma = a_desc is not None and b_desc is not None
    # A TMA store writes whole BLOCK_M rows: only when no block straddles two slabs.
    tma_store = use_tma and cfg.tma_store and m_loc % cfg.block_m == 0
    c_desc = cached_descriptor(c, [cfg.block_m, cfg.block_n // cfg.epi_split]) if tma_store else None
    dummy = err
    ag_gemm_kernel[(progs,)](
        a, b, c, a_desc, b_desc, c_desc,
        flags if flags is not None else dummy, heap_bases if heap_bases is not None else dummy, err,
        count if count is not None else dummy, seen if seen is not None else dummy,
        epochs if epochs is not None else dummy, trace.record_pointer(records, dummy),
        m_loc, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        parity_rows, flag_parity_stride,
        rank, budget, kernel_id,
        WORLD=world, A_MODE=mode, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, NUM_PROGS=progs, NUM_STAGES=cfg.num_stages, USE_TMA=use_tma,
        SYNC_MODE=sync, COUNT=count is not None, TMA_STORE=tma_store, EPI_SPLIT=cfg.epi_split if tma_store else 1,
        K_PIECES=pieces, KT_PER_PIECE=piece_cols(cfg, k) // cfg.block_k if pieces > 1 else triton.cdiv(k, cfg.block_k),
        INSTRUMENT=trace.instrument_code(records), WARP_SPECIALIZE=cfg.warp_specialize and use_tma,
        num_warps=cfg.num_warps,
    )
