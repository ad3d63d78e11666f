"""All-Gather + GEMM's persistent GEMM: the engine (``kernels/device/tile_gemm.py``) in its AG role.

Math: C[M, N] = A_gathered[M, K] @ B[K, N], where A_gathered's rows come in ``WORLD`` slabs of
``M_loc`` rows, slab ``r`` being rank ``r``'s shard. The tile order (own slab first, then the
peers' blocks interleaved), the schedule and the flag waits are the engine's (its docstring).

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

Epoch in device memory (why: CUDA graphs): ``epoch_ptr`` is this kernel's epoch slots on this rank
(``kernels/device/epochs.py``): program ``pid`` takes ``slot[pid] + 1`` as this launch's epoch
and stores it back after its last tile, so a captured graph that replays the launch waits for
the right epoch each time; every launch on one slots buffer must use the same grid. The push
variant double-buffers the remote rows and flags by epoch parity (``DOUBLE_BUFFER``, a
constexpr: ``parity_rows`` and ``flag_parity_stride`` are the offsets of the odd parity); own
rows are always read from parity 0. Without it (pull, the copy engines, the GEMM alone) no load
address depends on the epoch, only the waits do, so the first own tiles' loads need not wait for
the slot's load (on an H100 that dependence and the old end-of-launch count cost 0.7-3.0 points
of cuBLAS speed at the short shapes: ``epochs.py``).

In-kernel records (``INSTRUMENT``): a CTA writes ``1 + 2 x (waits that spun)`` records,
alternating compute / flag_wait (``gemm_record_layout``); with ``INSTRUMENT=False`` no record code
is compiled. The tile configuration per shape comes from ``gemm_table.py`` (``config_for_shape``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import triton
import triton.language as tl

from taxmodel.kernels.ag_gemm import gemm_table
from taxmodel.kernels.device import trace
from taxmodel.kernels.device.epochs import check_grid, launch_epoch, publish_epoch
from taxmodel.kernels.device.sync import SYNC_NVIDIA, interpreting
from taxmodel.kernels.device.tile_gemm import A_LOCAL, A_PULL, A_WAIT, ROLE_AG, flatten_ok, persistent_gemm  # noqa: F401  (the modes are this module's API too)


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
    FLATTEN: tl.constexpr = False, WAIT_VOTE: tl.constexpr = False, WAIT_HORIZON: tl.constexpr = False,
    HORIZON_SCAN: tl.constexpr = 64, DOUBLE_BUFFER: tl.constexpr = False, FLAG_CHUNK: tl.constexpr = 1,
    ORDER_CHUNK: tl.constexpr = 1,
):
    pid = tl.program_id(0)
    t_rec = trace.begin(INSTRUMENT, SYNC_MODE)  # in-kernel records; nothing when off
    if A_MODE == 2:
        epoch = launch_epoch(epoch_ptr, pid)  # this launch's epoch (device memory: graph-safe)
    else:
        epoch = 0
    if DOUBLE_BUFFER:
        parity = epoch % 2
        flags_base = flags_ptr + parity * flag_parity_stride
        remote_shift = parity * parity_rows  # remote rows of the odd parity live further down
    else:  # no load address depends on the epoch
        flags_base = flags_ptr
        remote_shift = 0
    t_rec = persistent_gemm(
        pid, a_ptr, b_ptr, c_ptr, a_desc, b_desc, c_desc, flags_base, heap_bases, err_ptr, count_ptr, seen_ptr,
        rec_ptr, t_rec, M_loc, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        remote_shift, rank, epoch, budget, kernel_id,
        ROLE_AG, WORLD, A_MODE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGS, NUM_STAGES, USE_TMA, SYNC_MODE,
        COUNT, TMA_STORE, EPI_SPLIT, K_PIECES, KT_PER_PIECE, INSTRUMENT, FLATTEN, False, WAIT_VOTE, WAIT_HORIZON,
        HORIZON_SCAN, FLAG_CHUNK, ORDER_CHUNK)
    t_rec = trace.mark(rec_ptr, pid, trace.COMPUTE, t_rec, INSTRUMENT, SYNC_MODE)  # the last compute run

    if A_MODE == 2:
        publish_epoch(epoch_ptr, pid, epoch, SYNC_MODE)


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

    ``ce_signal`` picks the flag write after a copy-engine copy: "mem" (stream memory operation)
    or "kernel" (one-program Triton kernel). ``ce_copy_bytes``: how much of a peer's slab one
    copy-engine copy moves (whole M-blocks, ``ce_blocks_per_copy``), each copy followed by one flag
    write that covers all its blocks: None (the default) splits a slab into ``max(world, 4)``
    copies; 0 copies one block at a time; a positive number about that many bytes per copy. Why:
    per copy the engine pays a fixed cost (2x H200: 2 MiB blocks moved at 233 GB/s with ~6 us from
    one copy's end to the next one's start, so the link carried data 60% of the time), so a few
    large copies move a slab faster than many small ones; and with at least ``world`` copies per
    slab the first one lands within 1/world of the transfer, while the GEMM is still on its own
    rows (1/world of its tiles), whenever the transfer is no longer than the GEMM
    (``benchmarks/results/ag_gemm_ce_copies_h200x2.md``). ``ce_order`` (pull on the copy engines):
    "round" issues every peer's first copy, then every peer's second, ..., one side stream per peer;
    "step" issues them peer by peer on one side stream (all of rank+1's slab, then rank+2's, ...),
    so that at any time every rank reads from a different peer, as torch's fused op does between
    its barriers, and the GEMM takes the blocks in that order; "auto" (the default) picks by shape
    (``ce_order_for``). ``flatten`` asks for the engine's flattened tile loop
    (the next tile's loads overlap this tile's epilogue; ``tile_gemm.flatten_ok`` says when a launch
    can have it). ``wait_vote`` lets a remote tile whose flag already holds the epoch pass with one
    acquire load per thread and a voting barrier (``sync.wait_geq``'s ``VOTE``; GPU only: the
    interpreter always spins). ``wait_horizon`` (one flag per block): a program scans the remote
    blocks' flags in delivery order and remembers how far they were all ready, so a tile whose
    block lies below that horizon waits on nothing (``tile_gemm.ready_prefix``); one scan reads at
    most ``horizon_scan`` flags (a power of two).
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
    ce_copy_bytes: int | None = None
    ce_order: str = "auto"
    push_progs: int = 32
    push_rows: int = 32
    push_block_k: int = 256
    push_chunk_k: int = 2048
    push_warps: int = 4
    reserve_sms: bool = False
    flatten: bool = True
    wait_vote: bool = True
    wait_horizon: bool = True
    horizon_scan: int = 64

    def tile_label(self) -> str:
        """The GEMM's part of ``label``: tile, pipeline, warps, grouping, loads/stores."""
        tma = "tma" if self.use_tma else "ptr"
        if self.use_tma and self.tma_store:
            tma += f"-st{self.epi_split}"
        gemm = f"{self.block_m}x{self.block_n}x{self.block_k}-s{self.num_stages}-w{self.num_warps}-g{self.group_m}-{tma}"
        if self.flatten:
            gemm += "-fl"
        if not self.wait_vote:
            gemm += "-spin"
        if not self.wait_horizon:
            gemm += "-tilewait"
        return gemm

    def label(self) -> str:
        gemm = self.tile_label()
        if self.transport == "ce":
            size = "" if self.ce_copy_bytes is None else f"-{self.ce_copy_bytes / 2**20:g}m" if self.ce_copy_bytes else "-1b"
            order = "" if self.ce_order == "auto" else f"-{self.ce_order}"
            return f"{gemm}-ce-{self.ce_signal}{size}{order}"
        if self.transport == "sm":
            res = "-reserved" if self.reserve_sms else ""
            return f"{gemm}-sm{self.push_progs}x{self.push_rows}x{self.push_block_k}-c{self.push_chunk_k}{res}"
        return f"{gemm}-{self.transport}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Small tiles for Triton's interpreter (CPU): partial tiles appear at the tiny preset's shapes.
CPU_CONFIG = GemmConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_stages=1, num_warps=4,
                        num_progs=3, use_tma=False, push_progs=2, push_rows=8, push_block_k=16, push_chunk_k=32,
                        push_warps=4, flatten=False)

#: Defaults on a Hopper GPU (the benchmark tries a few others per size).
GPU_CONFIG = GemmConfig()


def default_config(device: torch.device) -> GemmConfig:
    return GPU_CONFIG if torch.device(device).type == "cuda" and not interpreting() else CPU_CONFIG


def config_for_shape(m: int, n: int, k: int, device: torch.device, base: GemmConfig | None = None) -> GemmConfig:
    """``base`` (default: the device's default) with the tile fields of the committed per-shape table
    of the device's GPU family (``gemm_table.py``) for a GEMM of ``m`` x ``n`` x ``k`` on a GPU;
    unchanged on the CPU (the interpreter's small tiles) and for a shape class or GPU the tables do
    not hold."""
    cfg = base if base is not None else default_config(device)
    if torch.device(device).type != "cuda" or interpreting():
        return cfg
    fields = gemm_table.tile_fields(m, n, k, gemm_table.device_family(torch.cuda.get_device_name(device)))
    return replace(cfg, **fields) if fields else cfg


def table_choice(m: int, n: int, k: int, device: torch.device) -> str:
    """Where ``config_for_shape``'s tiles come from on ``device``, in words (benchmarks and bundles
    record it): the family table's entry, or the default and how far it was from cuBLAS."""
    if torch.device(device).type != "cuda" or interpreting():
        return "interpreter tiles (CPU_CONFIG)"
    family = gemm_table.device_family(torch.cuda.get_device_name(device))
    if gemm_table.tile_fields(m, n, k, family) is not None:
        return f"{family} table, class {gemm_table.shape_class(m, n, k)}"
    return gemm_table.DEFAULT_NOTE


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


#: The copy engines' issue orders of a pull (``GemmConfig.ce_order``).
CE_ORDERS = ("auto", "round", "step")

#: ``ce_order`` "auto" pulls peer by peer where the GEMM has at most this many columns per rank.
#: Why: the copies then take most of the GEMM's time (3 x 64 MiB against a 0.7 ms GEMM at the
#: 4-rank tensor-parallel M=16384), and issued on one stream per peer a 4x H200 ran them one at a
#: time with ranks reading the same peer at once (16 MiB copies at 60 us median, 46 at best); peer
#: by peer, the step took 0.74-0.83 ms against 1.06-1.07 (``benchmarks/results/final_round_h200x4.md``).
#: With N = 8192 per rank the GEMM hides most of either order and the runs did not agree (128x256
#: tiles at M=1024: step 0.287, 0.248, 0.253 ms against round 0.271, 0.268, 0.267 in three calls;
#: M=16384: step 1-3% slower), so "round" stays there (M=1024 on 4 ranks: ``first_wave_tiles``).
CE_STEP_MAX_N = 4096

#: Copies per peer slab at least, with ``ce_copy_bytes`` None (``GemmConfig``).
CE_MIN_COPIES = 4


def default_blocks_per_copy(blocks: int, world: int, n_tiles: int = 0, wave: int = 0, step: bool = False) -> int:
    """Blocks per copy-engine copy of a slab of ``blocks`` M-blocks on ``world`` ranks by default
    (``GemmConfig.ce_copy_bytes`` None), each copy of whole blocks (at least one):
    - order "round": the slab in ``max(world, CE_MIN_COPIES)`` copies;
    - order "step" (``step``): as many blocks as one wave of the GEMM (``wave`` programs) takes,
      ``n_tiles`` N-tiles a block, at most the slab. Why: one stream runs the copies one after
      another, each paying a fixed cost (a 4x H200 trace: 5-6 us from one copy's end to the next
      one's start, and 3-4 us more than its bytes take at the copy rate), so fewer copies land
      sooner; but the tiles of the last copy all start when it lands, so a copy larger than one
      wave's tiles would leave the GEMM more than one tile time to run after the last copy.
    The analytic model plans the copies with it too."""
    if step:
        return max(1, min(blocks, wave // max(1, n_tiles)))
    return max(1, blocks // max(world, CE_MIN_COPIES))


def ce_blocks_per_copy(cfg: GemmConfig, m_loc: int, n_loc: int, k: int, elt: int, world: int, wave: int) -> int:
    """M-blocks per copy-engine copy (and per flag) of a slab of ``m_loc`` rows of ``k`` elements of
    ``elt`` bytes on ``world`` ranks, for a GEMM of ``n_loc`` columns per rank over ``wave``
    programs (``GemmConfig.ce_copy_bytes``): ``default_blocks_per_copy`` for the pull order, or as
    many whole blocks as fit in the bytes asked for; at least one block, at most the slab; 1 for
    the other transports. The copies and the GEMM's flag waits both take it from here."""
    blocks = triton.cdiv(m_loc, cfg.block_m)
    if cfg.transport != "ce" or cfg.ce_copy_bytes == 0:
        return 1
    if cfg.ce_copy_bytes is None:
        return default_blocks_per_copy(blocks, world, triton.cdiv(n_loc, cfg.block_n), wave,
                                       step=ce_order_for(cfg, n_loc) == "step")
    return max(1, min(blocks, cfg.ce_copy_bytes // (cfg.block_m * k * elt)))


#: Tiles of the fine-grained AG GEMM where its own slab is small (``first_wave_tiles``).
NARROW_TILES = dict(block_n=128, num_stages=4, num_warps=8, tma_store=False)


def first_wave_tiles(cfg: GemmConfig, m_loc: int, n_loc: int, world: int, wave: int) -> GemmConfig:
    """Pull's GEMM tiles (and order) on the copy engines (``cfg.transport`` "ce") for a slab of ``m_loc`` rows, ``n_loc`` columns per rank,
    ``world`` ranks and ``wave`` programs: ``NARROW_TILES`` (128 columns) where the own slab's tiles
    at ``cfg``'s 256 fill less than half a wave and at 128 at least half, else ``cfg``.

    Why: the GEMM starts on its own rows while the first copies land; at M=1024 on 4 ranks (2 blocks
    a slab, 32 N-tiles a block) the own slab is 64 tiles of 132 programs, so the other 68 wait for
    remote rows at once, and the GEMM is two waves of ~90 us tiles: a wait at the first wave
    delays the second. With 128-column tiles the own slab fills about a wave and a tile takes half
    as long: on 4x H200 pull took 0.229-0.233 ms against 0.248-0.268 with 128x256 tiles (bsp
    0.262; ``benchmarks/results/final_round_h200x4.md``), and pulling peer by peer ("auto" becomes
    "step" here) 0.225-0.229 (three runs). Only for pull on the copy engines: with the Triton copy
    kernel 128x128 tiles were slower (0.255 against 0.242 ms), push was not measured; nor at 2 ranks
    (the own slab is a wave already) or the narrow tensor-parallel slabs (16 tiles either way)."""
    if world < 2 or cfg.block_n != 256 or cfg.transport != "ce":
        return cfg
    blocks = triton.cdiv(m_loc, cfg.block_m)
    if blocks * triton.cdiv(n_loc, 256) * 2 < wave <= blocks * triton.cdiv(n_loc, 128) * 2:
        return replace(cfg, **NARROW_TILES, ce_order="step" if cfg.ce_order == "auto" else cfg.ce_order)
    return cfg


def wave_programs(cfg: GemmConfig, device: torch.device) -> int:
    """The programs of one wave of the persistent GEMM on ``device`` (no SMs reserved)."""
    return num_programs(cfg, device, 1 << 30)


def ce_order_for(cfg: GemmConfig, n_loc: int) -> str:
    """The copy engines' pull order (``GemmConfig.ce_order``) for a GEMM of ``n_loc`` columns per
    rank: "auto" is "step" (peer by peer) where ``n_loc`` <= ``CE_STEP_MAX_N``, else "round"."""
    if cfg.ce_order not in CE_ORDERS:
        raise ValueError(f"ce_order must be one of {CE_ORDERS}, got {cfg.ce_order!r}")
    if cfg.ce_order != "auto":
        return cfg.ce_order
    return "step" if n_loc <= CE_STEP_MAX_N else "round"


def order_chunk(cfg: GemmConfig, n_loc: int, blocks: int, per_copy: int) -> int:
    """Blocks per peer taken in a row by the GEMM when it follows the copy engines' pulls
    (``tile_gemm.peer_block``'s ``CHUNK``): a copy's blocks (order "round"), or the whole slab of
    ``blocks`` (order "step": peer by peer)."""
    return blocks if ce_order_for(cfg, n_loc) == "step" else per_copy


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
    parity_rows: int = 0, flag_parity_stride: int = 0, records: Any = None, copy_by_copy: bool = False,
) -> None:
    """Enqueue one ``ag_gemm_kernel`` (see the module docstring for ``mode``); no host sync.

    ``copy_by_copy``: the peers' blocks are taken in the order the copy engines deliver a rank's
    pulls (one copy after another: ``tile_gemm.peer_block`` with ``ORDER_CHUNK``; peer by peer with
    ``cfg.ce_order`` "step"), not interleaved block by block; it changes nothing when a copy moves
    one block in the round order.

    ``A_WAIT`` needs ``epochs`` (the kernel's epoch slots, ``epochs.new_epoch_slots``; every
    launch on them with the same grid, else ``ValueError``); ``parity_rows`` or
    ``flag_parity_stride`` non-zero compiles the double buffer (``DOUBLE_BUFFER``, the push
    variant); ``records`` is the kernel's ``RecordBuffer`` (``INSTRUMENT`` on).
    """
    if mode == A_WAIT and epochs is None:
        raise ValueError("launch_ag_gemm: A_WAIT needs the device epoch slots (epochs=)")
    if cfg.horizon_scan < 1 or cfg.horizon_scan & (cfg.horizon_scan - 1):
        raise ValueError(f"launch_ag_gemm: horizon_scan must be a power of two, got {cfg.horizon_scan}")
    n = b.shape[1]
    k = b.shape[0]
    bpr, n_tiles = tile_counts(m_loc, n, world, cfg)
    num_tiles = world * bpr * n_tiles
    progs = num_programs(cfg, c.device, num_tiles, reserve_programs)
    if mode == A_WAIT:
        check_grid(epochs, progs, "launch_ag_gemm")
    # One flag per copy-engine copy (its last block's): the transport writes no other.
    flag_chunk = (ce_blocks_per_copy(cfg, m_loc, n, k, a.element_size(), world, wave_programs(cfg, c.device))
                  if mode == A_WAIT and pieces == 1 else 1)
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
        INSTRUMENT=trace.instrument_code(records),
        FLATTEN=cfg.flatten and flatten_ok(pieces, bool(trace.instrument_code(records)), use_tma),
        WAIT_VOTE=cfg.wait_vote and sync == SYNC_NVIDIA, WAIT_HORIZON=cfg.wait_horizon, HORIZON_SCAN=cfg.horizon_scan,
        FLAG_CHUNK=flag_chunk, ORDER_CHUNK=order_chunk(cfg, n, bpr, flag_chunk) if copy_by_copy else 1,
        DOUBLE_BUFFER=parity_rows != 0 or flag_parity_stride != 0, num_warps=cfg.num_warps,
    )
