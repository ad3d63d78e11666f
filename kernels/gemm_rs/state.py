"""What the GEMM + Reduce-Scatter variants share: kernel names, the fine-grained configuration,
shapes, seeded inputs, and one rank's buffers (``GemmRsState``) with the variant type that prepares
them.

It sits below ``workload.py`` (the registered workload, which imports the variants) and below every
variant module, so that no variant imports the workload that lists it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import torch

from taxmodel.errors import InputError
from taxmodel.kernels.device.sync import interpreting
from taxmodel.kernels.ag_gemm.gemm_tiles import CPU_CONFIG, GPU_CONFIG, GemmConfig
from taxmodel.kernels.ag_gemm.state import pick_dtype as ag_pick_dtype
from taxmodel.kernels.ag_gemm.state import symmetric_heap  # noqa: F401  (duck-typed: any state with ctx/heap)
from taxmodel.kernels.names import GEMM_RS_KERNEL, RS_REDUCE_KERNEL
from taxmodel.workload import RankBound, Variant

from .tiles import own_tiles, slot_row_stride

#: Kernel names. (The bulk-synchronous pair, the partial-product GEMM and the collective, are other
#: libraries' kernels: ``taxmodel.vocabulary``'s ``GEMM_KERNELS`` and ``COLLECTIVE_KERNELS``.)
#: The fine-grained pair (``tiles.py``): the persistent GEMM that pushes tiles, and the reduction.
FUSED_GEMM_KERNEL = GEMM_RS_KERNEL
FUSED_REDUCE_KERNEL = RS_REDUCE_KERNEL

@dataclass(frozen=True)
class RsConfig:
    """Parameters of the fine-grained variant: the GEMM tiles (``ag_gemm``'s ``GemmConfig``; its
    transport fields are unused here) and where the reduction runs.

    ``reduce``: ``"kernel"`` - a second small kernel (``rs_reduce_kernel``, one program per output
    tile) launched after the GEMM on the same stream; ``"tail"`` - the GEMM's own programs reduce
    this rank's tiles after their compute tiles (one launch; see ``tiles.py`` for why the
    interpreter then runs one program). ``reduce_rows`` rows of a tile are summed at a time;
    ``reduce_warps`` warps per program of the reduce kernel. ``spread`` (the default): the GEMM's
    tiles in rounds of one block of every peer and, ``lag`` rounds behind, one own block
    (``tiles.py``, "Tile order"); ``spread=False``: every peer's tile first, own tiles last.
    """

    gemm: GemmConfig = GPU_CONFIG
    reduce: str = "kernel"
    reduce_rows: int = 32
    reduce_warps: int = 4
    spread: bool = True
    lag: int = 1

    def label(self) -> str:
        order = f"spread{self.lag}" if self.spread else "first"
        return f"{self.gemm.tile_label()}-{self.reduce}-r{self.reduce_rows}-{order}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


CPU_RS_CONFIG = RsConfig(gemm=CPU_CONFIG, reduce_rows=8)
GPU_RS_CONFIG = RsConfig()


def default_rs_config(device: torch.device) -> RsConfig:
    return GPU_RS_CONFIG if torch.device(device).type == "cuda" and not interpreting() else CPU_RS_CONFIG


def shape_dims(shape: Mapping[str, int], world: int) -> tuple[int, int, int, int, int]:
    """(M, M per rank, N, K, K per rank) after checking that the shape splits over ``world`` ranks."""
    m, n, k = int(shape["M"]), int(shape["N"]), int(shape["K"])
    if min(m, n, k) < 1:
        raise InputError(f"gemm_rs: M, N and K must be positive (got M={m}, N={n}, K={k})")
    if m % world:
        raise InputError(f"gemm_rs: M={m} must be a multiple of the world size {world} (rows are scattered)")
    if k % world:
        raise InputError(f"gemm_rs: K={k} must be a multiple of the world size {world} (each rank holds K/world)")
    return m, m // world, n, k, k // world


def pick_dtype(shape: Mapping[str, int], device: torch.device) -> torch.dtype:
    return ag_pick_dtype(shape, device, workload="gemm_rs")


def make_a_shard(seed: int, rank: int, m: int, k_loc: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s columns of A ([M, K/world]), the same on every rank that builds them."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + 31 + rank)
    return torch.randn(m, k_loc, generator=g, device=device, dtype=torch.float32).to(dtype)


def make_b_shard(seed: int, rank: int, k_loc: int, n: int, k: int, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s rows of the weight ([K/world, N]), scaled by K^-1/2 so that C ~ N(0, 1)."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + 7_927 + rank)
    return torch.randn(k_loc, n, generator=g, device=device, dtype=torch.float32).mul_(k ** -0.5).to(dtype)


@dataclass
class GemmRsState(RankBound):
    """One rank's buffers for one variant. ``epochs`` (fused): the device's count of finished
    iterations (what the flags hold), one slot per GEMM program (``kernels/device/epochs.py``);
    nothing per-iteration is kept on the host, so a captured iteration can be replayed."""

    ctx: Any
    shape: dict[str, int]
    variant: str
    dtype: torch.dtype
    m: int
    m_loc: int
    n: int
    k: int
    k_loc: int
    a: torch.Tensor  # A_r [M, K/world]
    b: torch.Tensor  # B_r [K/world, N]
    out: torch.Tensor  # this rank's rows of C [M/world, N]
    cfg: RsConfig
    err: torch.Tensor
    sync: int
    budget: int
    partial: torch.Tensor | None = None  # bsp: A_r @ B_r [M, N] (on the heap for thread ranks)
    recv: torch.Tensor | None = None  # fused: heap [2 parities, world sources, M/world, N padded to 16]
    flags: torch.Tensor | None = None  # fused: heap [tiles of this rank's rows, world sources] int32
    heap: Any = None
    epochs: torch.Tensor | None = None  # fused: int32 [EPOCH_SLOTS], the GEMM's epoch slots (tiles.py, "Epochs")
    count: torch.Tensor | None = None  # debug: times each own output tile was reduced
    seen: torch.Tensor | None = None  # debug: least flag value a tile's reduction saw before reading
    rec_gemm: Any = None  # fused, instrumented: taxmodel.runtime.records.RecordBuffer of gemm_rs_kernel
    rec_reduce: Any = None  # ... and of rs_reduce_kernel (None with the tail reduction)
    cache: dict[str, Any] = field(default_factory=dict)

    def poison(self) -> None:
        """Fill the output with NaN so that a row the variant never wrote fails the reference check."""
        self.out.fill_(float("nan"))

    def reseed(self, seed: int) -> None:
        """Refill this rank's A and B shards in place with the inputs of ``seed`` (same buffers, so a
        captured CUDA graph reads them); the workload's reference of ``seed`` then holds."""
        self.shape["seed"] = int(seed)
        device = self.a.device
        self.a.copy_(make_a_shard(seed, self.rank, self.m, self.k_loc, self.dtype, device))
        self.b.copy_(make_b_shard(seed, self.rank, self.k_loc, self.n, self.k, self.dtype, device))

    def enable_debug_counters(self) -> None:
        """Count reductions per output tile and record the flags each saw (tests of the protocol)."""
        n = own_tiles(self.m_loc, self.n, self.cfg.gemm)
        self.count = torch.zeros(n, dtype=torch.int32, device=self.out.device)
        self.seen = torch.full((n,), -1, dtype=torch.int32, device=self.out.device)


@dataclass
class GemmRsVariant(Variant):
    """A variant that prepares its own buffers: ``prepare(state)`` runs at the end of ``setup`` on
    every rank, in the same order everywhere (heap allocations must match)."""

    prepare: Callable[[GemmRsState], None] | None = None


def heap_bytes(shape: Mapping[str, int], world: int, variant: str, dtype: torch.dtype, cfg: RsConfig) -> int:
    """Symmetric-heap bytes a variant allocates on each rank (plus alignment slack)."""
    m, m_loc, n, _, _ = shape_dims(shape, world)
    elt = torch.empty((), dtype=dtype).element_size()
    slack = 4096
    if variant == "fused":
        return 2 * world * m_loc * slot_row_stride(n) * elt + own_tiles(m_loc, n, cfg.gemm) * world * 4 + 2 * slack
    if variant == "bsp":
        return m * n * elt + slack  # CPU thread ranks emulate the collective through the heap
    return 0
