"""PyTorch's own fused op: ``torch.ops.symm_mem.fused_all_gather_matmul`` (symmetric memory,
copy-engine all-gather micro-pipelined with cuBLAS matmuls): the op a user would otherwise pick.
CUDA only, and only with a process group of more than one rank.
"""
from __future__ import annotations

import importlib
from typing import Any

import torch

from taxmodel.vocabulary import GEMM_KERNELS, SYMM_MEM_KERNELS

from .state import AgGemmState, AgGemmVariant


def available(ctx: Any) -> str | None:
    if torch.device(ctx.device).type != "cuda":
        return "torch_fused needs CUDA (torch.distributed._symmetric_memory has no CPU fused all-gather matmul)"
    if getattr(torch.version, "hip", None):
        return "torch_fused is not supported on ROCm here"
    if ctx.backend == "threads" or ctx.group is None and ctx.world_size > 1:
        return "torch_fused needs a torch.distributed process group"
    try:
        importlib.import_module("torch.distributed._symmetric_memory")
    except ImportError as exc:
        return f"torch.distributed._symmetric_memory is unavailable: {exc}"
    if not hasattr(torch.ops.symm_mem, "fused_all_gather_matmul"):
        return "this torch has no torch.ops.symm_mem.fused_all_gather_matmul"
    return None


def _group_name(ctx: Any) -> str:
    import torch.distributed as dist

    group = ctx.group if ctx.group is not None else dist.group.WORLD
    return group.group_name


def prepare(st: AgGemmState, nbytes: int) -> None:
    if available(st.ctx) is None:
        st.cache["group_name"] = _group_name(st.ctx)


def run(st: AgGemmState) -> None:
    st.epoch += 1
    with st.ctx.kernel("fused_all_gather_matmul"):
        _, outs = torch.ops.symm_mem.fused_all_gather_matmul(st.a_local, [st.b], 0, st.cache["group_name"],
                                                            return_A=False)
    st.c = outs[0]


VARIANT = AgGemmVariant(
    name="torch_fused",
    run=run,
    roles={GEMM_KERNELS: "compute", SYMM_MEM_KERNELS: "comm"},
    needs_heap=False,
    fine_grained=True,
    description="torch.ops.symm_mem.fused_all_gather_matmul (PyTorch's own fused all-gather matmul)",
    available=available,
    prepare=prepare,
)
