"""GEMM + Reduce-Scatter: the tensor-parallel row-parallel linear layer.

Each rank ``r`` holds a column block of the activations, A_r [M, K/world], and the matching row
block of the weight, B_r [K/world, N]. The layer's output is C = sum_r A_r @ B_r [M, N]; it is
reduce-scattered by rows, so rank ``r`` ends with rows [r*M/world, (r+1)*M/world) of C
([M/world, N], ``m_loc`` rows). ``M`` and ``K`` must split evenly over the ranks.

Inputs come from seeded generators (seed in the shape's ``seed`` key, default 0) so that every rank
can rebuild every shard: the reference needs no communication. A ~ N(0, 1), B ~ N(0, 1/K), so
C ~ N(0, 1) and one tolerance fits every K (the sum over ranks has K terms in all).

Dtype: bf16 on GPUs, fp32 on CPU (Triton's interpreter has no fast bf16 dot); a shape may force one
with ``dtype`` 16 (bf16), 15 (fp16) or 32 (fp32), as in ``ag_gemm``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import torch

from taxmodel.errors import InputError
from taxmodel.kernels.ag_gemm.gemm_tiles import CPU_CONFIG, GPU_CONFIG, GemmConfig
from taxmodel.kernels.ag_gemm import workload as ag_workload
from taxmodel.kernels.ag_gemm.workload import DTYPE_CODES, DTYPE_NAMES
from taxmodel.kernels.ag_gemm.workload import symmetric_heap  # noqa: F401  (duck-typed: any state with ctx/heap)
from taxmodel.workload import Cost, Intermediate, RankBound, Variant, Workload, register

#: Kernel names (regex). The bulk-synchronous pair: the partial-product GEMM (cuBLAS/hipBLASLt on
#: GPUs, "matmul" on CPU) and the collective (NCCL/RCCL, "reduce_scatter" on CPU).
GEMM_KERNELS = r"(?i)gemm|matmul|nvjet|cutlass|xmma|cublas|Cijk"
REDUCE_SCATTER_KERNELS = r"(?i)nccl|rccl|reduce_?scatter|reducescatter"
#: The fine-grained pair (``tiles.py``): the persistent GEMM that pushes tiles, and the reduction.
FUSED_GEMM_KERNEL = "gemm_rs_kernel"
FUSED_REDUCE_KERNEL = "rs_reduce_kernel"

#: GPU presets: M x N x K with N = K = 8192, and the N = K = 4096 family.
_GPU_PRESETS: dict[str, dict[str, int]] = {}
for _m in (1024, 4096, 8192):
    _GPU_PRESETS[f"m{_m}"] = {"M": _m, "N": 8192, "K": 8192}
    _GPU_PRESETS[f"m{_m}_n4096"] = {"M": _m, "N": 4096, "K": 4096}

#: Tiny CPU preset: with the CPU tile config (16x16x16) every dimension has a partial tile at world
#: sizes 1 to 4 (M/world = 120, 60, 40, 30; N = 40; K/world = 60, 30, 20, 15).
PRESETS: dict[str, dict[str, int]] = {"tiny": {"M": 120, "N": 40, "K": 60}, **_GPU_PRESETS}


@dataclass(frozen=True)
class RsConfig:
    """Parameters of the fine-grained variant: the GEMM tiles (``ag_gemm``'s ``GemmConfig``; its
    transport fields are unused here) and where the reduction runs.

    ``reduce``: ``"kernel"`` - a second small kernel (``rs_reduce_kernel``, one program per output
    tile) launched after the GEMM on the same stream; ``"tail"`` - the GEMM's own programs reduce
    this rank's tiles after their compute tiles (one launch; see ``tiles.py`` for why the
    interpreter then runs one program). ``reduce_rows`` rows of a tile are summed at a time;
    ``reduce_warps`` warps per program of the reduce kernel.
    """

    gemm: GemmConfig = GPU_CONFIG
    reduce: str = "kernel"
    reduce_rows: int = 32
    reduce_warps: int = 4

    def label(self) -> str:
        g = self.gemm
        tma = "tma" if g.use_tma else "ptr"
        return (f"{g.block_m}x{g.block_n}x{g.block_k}-s{g.num_stages}-w{g.num_warps}-g{g.group_m}-{tma}"
                f"-{self.reduce}-r{self.reduce_rows}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


CPU_RS_CONFIG = RsConfig(gemm=CPU_CONFIG, reduce_rows=8)
GPU_RS_CONFIG = RsConfig()


def default_rs_config(device: torch.device) -> RsConfig:
    from taxmodel.kernels._sync import interpreting

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
    return ag_workload.pick_dtype(shape, device, workload="gemm_rs")


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
    iterations (what the flags hold) and the GEMM's done counter; nothing per-iteration is kept on
    the host, so a captured iteration can be replayed."""

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
    recv: torch.Tensor | None = None  # fused: heap [2 parities, world sources, M/world, N]
    flags: torch.Tensor | None = None  # fused: heap [tiles of this rank's rows, world sources] int32
    heap: Any = None
    epochs: torch.Tensor | None = None  # fused: int32 [last finished epoch, done counter] (tiles.py, "Epochs")
    count: torch.Tensor | None = None  # debug: times each own output tile was reduced
    seen: torch.Tensor | None = None  # debug: least flag value a tile's reduction saw before reading
    rec_gemm: Any = None  # fused, instrumented: taxmodel.runtime.records.RecordBuffer of gemm_rs_kernel
    rec_reduce: Any = None  # ... and of rs_reduce_kernel (None with the tail reduction)
    cache: dict[str, Any] = field(default_factory=dict)

    def poison(self) -> None:
        """Fill the output with NaN so that a row the variant never wrote fails the reference check."""
        self.out.fill_(float("nan"))

    def enable_debug_counters(self) -> None:
        """Count reductions per output tile and record the flags each saw (tests of the protocol)."""
        from .tiles import own_tiles

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
    from .tiles import own_tiles

    m, m_loc, n, _, _ = shape_dims(shape, world)
    elt = torch.empty((), dtype=dtype).element_size()
    slack = 4096
    if variant == "fused":
        return 2 * world * m_loc * n * elt + own_tiles(m_loc, n, cfg.gemm) * world * 4 + 2 * slack
    if variant == "bsp":
        return m * n * elt + slack  # CPU thread ranks emulate the collective through the heap
    return 0


@register
class GemmRs(Workload):
    """GEMM + Reduce-Scatter (tensor-parallel row-parallel linear): bsp, fused, torch_fused."""

    name = "gemm_rs"
    description = ("C = sum_r A_r @ B_r reduce-scattered by rows (A_r [M, K/world], B_r [K/world, N]; "
                   "rank r keeps rows r*M/world..(r+1)*M/world of C)")
    presets = PRESETS
    default_preset = "m8192"
    cpu_preset = "tiny"

    def __init__(self, config: RsConfig | None = None) -> None:
        self.config = config

    def variants(self) -> dict[str, Variant]:
        from . import bsp, fused, torch_fused

        return {"bsp": bsp.VARIANT, "fused": fused.VARIANT, "torch_fused": torch_fused.VARIANT}

    def setup(self, ctx: Any, shape: Mapping[str, int], variant: Variant) -> GemmRsState:
        from taxmodel.kernels._sync import new_error_buffer, spin_budget, sync_mode

        shape = dict(shape)
        world, rank, device = ctx.world_size, ctx.rank, torch.device(ctx.device)
        m, m_loc, n, k, k_loc = shape_dims(shape, world)
        dtype = pick_dtype(shape, device)
        cfg = self.config or default_rs_config(device)
        seed = int(shape.get("seed", 0))
        sync = sync_mode(device)
        st = GemmRsState(ctx=ctx, shape=shape, variant=variant.name, dtype=dtype, m=m, m_loc=m_loc, n=n, k=k,
                         k_loc=k_loc, a=make_a_shard(seed, rank, m, k_loc, dtype, device),
                         b=make_b_shard(seed, rank, k_loc, n, k, dtype, device),
                         out=torch.full((m_loc, n), float("nan"), dtype=dtype, device=device), cfg=cfg,
                         err=new_error_buffer(device), sync=sync, budget=spin_budget(ctx.spin_timeout_s, sync))
        prepare = getattr(variant, "prepare", None)
        if prepare is not None:
            prepare(st)
        ctx.barrier()  # every rank's buffers are in place before any rank's first run writes into them
        return st

    def reference(self, ctx: Any, shape: Mapping[str, int], state: GemmRsState) -> torch.Tensor:
        """This rank's rows of sum_r A_r @ B_r in fp32, from shards rebuilt locally."""
        device = torch.device(ctx.device)
        seed = int(shape.get("seed", 0))
        rows = slice(ctx.rank * state.m_loc, (ctx.rank + 1) * state.m_loc)
        ref = torch.zeros(state.m_loc, state.n, dtype=torch.float32, device=device)
        for r in range(ctx.world_size):
            a = make_a_shard(seed, r, state.m, state.k_loc, state.dtype, device)[rows].float()
            ref += a @ make_b_shard(seed, r, state.k_loc, state.n, state.k, state.dtype, device).float()
        return ref

    def output(self, state: GemmRsState) -> torch.Tensor:
        return state.out

    def tolerance(self, shape: Mapping[str, int], world_size: int = 1) -> tuple[float, float]:
        """In 16 bits (bf16 unless the shape's ``dtype`` says otherwise) the output is a sum of W
        rounded partials (each C_r ~ N(0, 1/W)), and a reduce-scatter in 16 bits rounds the running sum
        at each of its W steps, by up to u |s| (unit roundoff u: 2^-8 bf16, 2^-11 fp16); with
        |s| up to ~3 the error stays under 3 u W. 2x and 4x H200: within 0.02; 8x H200 (NCCL ring,
        bf16): up to 0.047 (one element in 2M on each of 4 ranks), beyond the old fixed 0.02. A missing or
        misplaced partial errs by O(1/sqrt(W)) on most elements, far beyond either."""
        code = int(shape.get("dtype", 16))
        unit = {16: 2.0 ** -8, 15: 2.0 ** -11}.get(code, 0.0)
        return (2e-2, max(2e-2, 3.0 * unit * world_size))

    def cost(self, shape: Mapping[str, int], world_size: int, variant: str) -> Cost:
        """Per rank and iteration. FLOPs: the partial product A_r @ B_r. HBM floor: A_r and B_r read,
        this rank's rows of C written (the peers' partial tiles could in principle be summed on
        chip as they arrive). Link: the (world-1) peers' partial tiles of this rank's rows
        (symmetrically, what this rank sends). Intermediates: bsp and torch_fused write the whole
        partial C [M, N] to HBM and the collective reads it back; the fused variant lands every
        source's tile of this rank's rows (its own included) in the receive buffer, which the
        reduction reads back."""
        m, m_loc, n, k, k_loc = shape_dims(shape, world_size)
        code = shape.get("dtype")
        dtype = DTYPE_CODES.get(int(code), torch.bfloat16) if code is not None else torch.bfloat16
        elt = torch.empty((), dtype=dtype).element_size()
        inter: tuple[Intermediate, ...] = ()
        if variant == "bsp":
            inter = (Intermediate("partial_C", m * n * elt, GEMM_KERNELS, REDUCE_SCATTER_KERNELS),)
        elif variant == "torch_fused":
            from .torch_fused import COMM_KERNELS, SUM_KERNELS

            inter = (Intermediate("partial_C", m * n * elt, GEMM_KERNELS, COMM_KERNELS + "|" + SUM_KERNELS.removeprefix("(?i)")),)
        elif variant == "fused":
            tail = (self.config or GPU_RS_CONFIG).reduce == "tail"  # the reduction runs in the GEMM's tail
            consumer = FUSED_GEMM_KERNEL if tail else FUSED_REDUCE_KERNEL
            inter = (Intermediate("received_partials", world_size * m_loc * n * elt, FUSED_GEMM_KERNEL, consumer),)
        return Cost(
            flops=2 * m * n * k_loc,
            hbm_bytes=(m * k_loc + k_loc * n + m_loc * n) * elt,
            link_bytes=(world_size - 1) * m_loc * n * elt,
            intermediates=inter,
            dtype=DTYPE_NAMES[dtype],
        )
