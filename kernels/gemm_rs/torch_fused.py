"""PyTorch's own fused op: ``torch.ops.symm_mem.fused_matmul_reduce_scatter`` (symmetric memory;
per-destination chunks of the partial product computed by cuBLAS and copied to their owners on
two streams, micro-pipelined, then summed on the owner): the op a user would otherwise pick.
CUDA only, and only with a process group of more than one rank.

Not ``graph_safe`` (profiled with eager launches under ``--graph``), as ``ag_gemm``'s torch_fused:
the op returns a new output tensor each call, forks a side stream, issues ``torch.cuda._sleep``
and symmetric-memory barriers on two signal-pad channels, and takes its workspace from a
per-group cache that may not grow during a capture. PyTorch's code has capture-aware branches
(the workspace check), so capture may well work, but it has not been run here: a replay that
captured but gave wrong results would stop the profile (``_check_variant``) instead of falling
back to eager launches. Mark it safe once a ``--graph-strict`` run on GPUs passes its checks.
"""
from __future__ import annotations

import importlib
from typing import Any

import torch

from taxmodel.vocabulary import GEMM_KERNELS, SYMM_MEM_KERNELS

from .state import GemmRsState, GemmRsVariant

#: The final sum over received chunks (the op's peer copies and barriers: ``SYMM_MEM_KERNELS``).
SUM_KERNELS = r"(?i)reduce_kernel"


def available(ctx: Any) -> str | None:
    if torch.device(ctx.device).type != "cuda":
        return "torch_fused needs CUDA (torch.distributed._symmetric_memory has no CPU fused matmul reduce-scatter)"
    if getattr(torch.version, "hip", None):
        return "torch_fused is not supported on ROCm here"
    if ctx.backend == "threads" or ctx.world_size < 2:
        return "torch_fused needs a torch.distributed process group of at least 2 ranks"
    try:
        importlib.import_module("torch.distributed._symmetric_memory")
    except ImportError as exc:
        return f"torch.distributed._symmetric_memory is unavailable: {exc}"
    if not hasattr(torch.ops.symm_mem, "fused_matmul_reduce_scatter"):
        return "this torch has no torch.ops.symm_mem.fused_matmul_reduce_scatter"
    return None


def _group_name(ctx: Any) -> str:
    import torch.distributed as dist

    group = ctx.group if ctx.group is not None else dist.group.WORLD
    return group.group_name


def prepare(st: GemmRsState) -> None:
    if available(st.ctx) is None:
        st.cache["group_name"] = _group_name(st.ctx)


def run(st: GemmRsState) -> None:
    with st.ctx.kernel("fused_matmul_reduce_scatter"):
        st.out = torch.ops.symm_mem.fused_matmul_reduce_scatter(st.a, st.b, "sum", 0, st.cache["group_name"])


VARIANT = GemmRsVariant(
    name="torch_fused",
    run=run,
    roles={GEMM_KERNELS: "compute", SYMM_MEM_KERNELS: "comm", SUM_KERNELS: "compute"},
    needs_heap=False,
    fine_grained=True,
    description="torch.ops.symm_mem.fused_matmul_reduce_scatter (PyTorch's own fused matmul reduce-scatter)",
    available=available,
    prepare=prepare,
)
