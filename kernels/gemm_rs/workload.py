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

from dataclasses import replace
from typing import Any, Mapping

import torch

from taxmodel.kernels.device.sync import new_error_buffer, spin_budget, sync_mode
from taxmodel.kernels.ag_gemm.gemm_tiles import config_for_shape
from taxmodel.kernels.ag_gemm.state import DTYPE_CODES, DTYPE_NAMES
from taxmodel.vocabulary import COLLECTIVE_KERNELS, GEMM_KERNELS, REDUCE_SCATTER, SYMM_MEM_KERNELS, any_name
from taxmodel.workload import Cost, Intermediate, Variant, Workload, register

from . import bsp, fused, torch_fused
from .state import (FUSED_GEMM_KERNEL, FUSED_REDUCE_KERNEL, GPU_RS_CONFIG, GemmRsState, RsConfig, default_rs_config,
                    make_a_shard, make_b_shard, pick_dtype, shape_dims)

#: GPU presets: M x N x K with N = K = 8192, and the N = K = 4096 family.
_GPU_PRESETS: dict[str, dict[str, int]] = {}
for _m in (1024, 4096, 8192, 16384):
    _GPU_PRESETS[f"m{_m}"] = {"M": _m, "N": 8192, "K": 8192}
    _GPU_PRESETS[f"m{_m}_n4096"] = {"M": _m, "N": 4096, "K": 4096}

#: Tiny CPU preset: with the CPU tile config (16x16x16) every dimension has a partial tile at world
#: sizes 1 to 4 (M/world = 120, 60, 40, 30; N = 40; K/world = 60, 30, 20, 15).
PRESETS: dict[str, dict[str, int]] = {"tiny": {"M": 120, "N": 40, "K": 60}, **_GPU_PRESETS}


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
        return {"bsp": bsp.VARIANT, "fused": fused.VARIANT, "torch_fused": torch_fused.VARIANT}

    def setup(self, ctx: Any, shape: Mapping[str, int], variant: Variant) -> GemmRsState:
        shape = dict(shape)
        world, rank, device = ctx.world_size, ctx.rank, torch.device(ctx.device)
        m, m_loc, n, k, k_loc = shape_dims(shape, world)
        dtype = pick_dtype(shape, device)
        cfg = self.config or default_rs_config(device)
        if self.config is None:  # tiles from the committed per-shape table (its GEMM has no TMA store / warp specialization)
            cfg = replace(cfg, gemm=config_for_shape(m, n, k_loc, device, base=cfg.gemm))
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
            inter = (Intermediate("partial_C", m * n * elt, GEMM_KERNELS, COLLECTIVE_KERNELS[REDUCE_SCATTER]),)
        elif variant == "torch_fused":
            comm_and_sum = any_name(SYMM_MEM_KERNELS, torch_fused.SUM_KERNELS)
            inter = (Intermediate("partial_C", m * n * elt, GEMM_KERNELS, comm_and_sum),)
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
