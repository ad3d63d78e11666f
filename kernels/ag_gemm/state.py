"""What the All-Gather + GEMM variants share: shapes, seeded inputs, dtypes, and one rank's
buffers (``AgGemmState``) with the variant type that prepares them.

It sits below ``workload.py`` (the registered workload, which imports the variants) and below
every variant module, so that no variant imports the workload that lists it. ``gemm_rs`` reuses
the dtypes, the input generator's dtype choice and the heap helper.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from taxmodel.errors import InputError
from taxmodel.kernels.device.epochs import new_epoch_slots
from taxmodel.workload import RankBound, Variant

from .gemm_tiles import GemmConfig

DTYPE_CODES = {16: torch.bfloat16, 15: torch.float16, 32: torch.float32}
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def shape_dims(shape: Mapping[str, int], world: int) -> tuple[int, int, int, int]:
    """(M, M per rank, N per rank, K) after checking that the shape splits over ``world`` ranks."""
    m, n, k = int(shape["M"]), int(shape["N"]), int(shape["K"])
    tp = bool(shape.get("tp", 0))
    if m % world:
        raise InputError(f"ag_gemm: M={m} must be a multiple of the world size {world}")
    if tp and n % world:
        raise InputError(f"ag_gemm: tensor-parallel layout needs N={n} divisible by the world size {world}")
    return m, m // world, (n // world if tp else n), k


def pick_dtype(shape: Mapping[str, int], device: torch.device, workload: str = "ag_gemm") -> torch.dtype:
    """The shape's ``dtype`` code, else bf16 on GPUs and fp32 in the CPU interpreter (whose bf16
    dot products are wrong). Shared by the GEMM workloads."""
    code = shape.get("dtype")
    if code is not None:
        if int(code) not in DTYPE_CODES:
            raise InputError(f"{workload}: dtype code {code} unknown; use 16 (bf16), 15 (fp16) or 32 (fp32)")
        return DTYPE_CODES[int(code)]
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def make_shard(seed: int, rank: int, m_loc: int, k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s rows of A, the same on every rank that builds them."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + 17 + rank)
    return torch.randn(m_loc, k, generator=g, device=device, dtype=torch.float32).to(dtype)


def make_weight(seed: int, rank: int, k: int, n: int, n_loc: int, tp: bool, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """This rank's B: all of the [K, N] weight, or its column block in the tensor-parallel layout."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + 7_919)
    w = torch.randn(k, n, generator=g, device=device, dtype=torch.float32).mul_(k ** -0.5)
    if tp:
        w = w[:, rank * n_loc:(rank + 1) * n_loc]
    return w.to(dtype).contiguous()


@dataclass
class AgGemmState(RankBound):
    """One rank's buffers for one variant.

    ``epoch`` counts on the host the iterations enqueued (the copy engines write it into flags);
    the fine-grained kernels count on the device in ``epochs`` (int32 [2, EPOCH_SLOTS]: the
    GEMM's epoch slots, then the copy kernel's; ``kernels/device/epochs.py``), which is what
    makes them graph-safe. After a launch every slot of its grid holds the epoch it finished.
    ``records`` holds the in-kernel record buffers by kernel name (``ctx.instrument``).
    """

    ctx: Any
    shape: dict[str, int]
    variant: str
    dtype: torch.dtype
    m: int
    m_loc: int
    n_loc: int
    k: int
    a_local: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    cfg: GemmConfig
    err: torch.Tensor
    sync: int
    budget: int
    gathered: torch.Tensor | None = None
    flags: torch.Tensor | None = None
    heap: Any = None
    epoch: int = 0
    epochs: torch.Tensor | None = None  # device epoch slots of the GEMM [0] and the copy kernel [1]
    records: dict[str, Any] = field(default_factory=dict)  # kernel name -> RecordBuffer
    count: torch.Tensor | None = None  # debug: per-output-tile compute count (A_WAIT/A_PULL kernels)
    seen: torch.Tensor | None = None  # debug: flag epoch each tile saw before reading A
    cache: dict[str, Any] = field(default_factory=dict)

    def new_epochs(self) -> None:
        """Zeroed device epoch slots (fine-grained variants, at setup)."""
        self.epochs = new_epoch_slots(self.c.device, kernels=2)
        self.cache["gemm_epochs"], self.cache["copy_epochs"] = self.epochs[0], self.epochs[1]

    @property
    def gemm_epochs(self) -> torch.Tensor:
        return self.cache["gemm_epochs"]

    @property
    def copy_epochs(self) -> torch.Tensor:
        return self.cache["copy_epochs"]

    def add_records(self, kernel: str, layout: Any) -> None:
        """Ask the context for kernel ``kernel``'s record buffer (``layout``: a
        ``kernels.device.records.RecordLayout``); None unless ``ctx.instrument`` is set."""
        buf = self.ctx.record_buffer(kernel, layout, self.c.device)
        if buf is not None:
            self.records[kernel] = buf

    def reseed(self, seed: int) -> None:
        """Refill this rank's A shard and B in place with the inputs of ``seed`` (same buffers, so a
        captured CUDA graph sees them). Peers read the shard: barrier before and after."""
        self.shape["seed"] = int(seed)
        device = self.c.device
        self.a_local.copy_(make_shard(seed, self.rank, self.m_loc, self.k, self.dtype, device))
        self.b.copy_(make_weight(seed, self.rank, self.k, int(self.shape["N"]), self.n_loc,
                                 bool(self.shape.get("tp", 0)), self.dtype, device))

    def poison(self) -> None:
        """Fill C with NaN so a tile the kernel never wrote fails the reference check."""
        self.c.fill_(float("nan"))

    def enable_debug_counters(self) -> None:
        """Count per-tile computations and record the flag epoch each tile saw (tests)."""
        from .gemm_tiles import tile_counts

        bpr, n_tiles = tile_counts(self.m_loc, self.n_loc, self.world, self.cfg)
        total = self.world * bpr * n_tiles
        self.count = torch.zeros(total, dtype=torch.int32, device=self.c.device)
        self.seen = torch.full((total,), -1, dtype=torch.int32, device=self.c.device)


@dataclass
class AgGemmVariant(Variant):
    """A variant that may also prepare its own buffers: ``prepare(state, heap_bytes)`` runs at the
    end of ``setup`` on every rank (in the same order everywhere: heap allocations must match)."""

    prepare: Callable[[AgGemmState, int], None] | None = None


def symmetric_heap(st: AgGemmState, nbytes: int) -> Any:
    """The context's heap if it has ``nbytes`` free, else a new one for this state (collective)."""
    heap = st.ctx.heap
    if heap is not None and heap.nbytes - heap.used_bytes >= nbytes:
        return heap
    st.heap = st.ctx.new_heap(nbytes)
    return st.heap
