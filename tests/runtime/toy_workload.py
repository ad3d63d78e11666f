"""A trivial workload for runtime tests: each rank scales its shard, all-gathers, sums.

Shape keys beyond N steer failures for the tests: ``fail_rank`` raises in that rank's run,
``hang_rank`` sleeps forever there, ``wrong_rank`` makes that rank's output wrong. The ``ring``
variant pushes the shard into the next rank's symmetric heap with an Iris store and flag
(Triton's interpreter on CPU), so the worker's heap path is exercised too.
"""
from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

from taxmodel.errors import InputError
from taxmodel.workload import Cost, Intermediate, Variant, Workload, register

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _maybe_misbehave(ctx, shape):
    if shape["fail_rank"] == ctx.rank:
        raise ValueError(f"toy failure on rank {ctx.rank}")
    if shape["hang_rank"] == ctx.rank:
        while True:
            time.sleep(0.05)


@register
class ToyWorkload(Workload):
    name = "toy"
    description = "scale + all_gather + sum (runtime tests)"
    presets = {"tiny": {"N": 8, "fail_rank": -1, "hang_rank": -1, "wrong_rank": -1}}
    default_preset = "tiny"
    cpu_preset = "tiny"

    def variants(self):
        return {
            "bsp": Variant("bsp", self._run_bsp, roles={r"^scale$": "compute", r"^sum$": "compute"},
                           description="scale, gloo/NCCL all_gather, sum", graph_safe=True),
            "ring": Variant("ring", self._run_ring, roles={r"ring_push": "fused"}, needs_heap=True, fine_grained=True,
                            description="push the shard to the next rank with iris.store + flag"),
            "never": Variant("never", self._run_bsp, available=lambda ctx: "needs hardware nobody has"),
        }

    def setup(self, ctx, shape, variant):
        n = shape["N"]
        x = torch.arange(n, dtype=torch.float32, device=ctx.device) + 1000.0 * ctx.rank
        st = SimpleNamespace(ctx=ctx, shape=shape, x=x, gathered=torch.empty(ctx.world_size * n, device=ctx.device),
                             out=torch.empty(n, device=ctx.device), variant=variant.name)
        if variant.needs_heap:
            st.src = ctx.heap.empty(n, torch.float32)
            st.src.copy_(x)
            st.dst = ctx.heap.zeros(n, torch.float32)
            st.flag = ctx.heap.zeros(1, torch.int32)
            st.status = torch.zeros(1, dtype=torch.int32)
        return st

    def _run_bsp(self, st):
        ctx = st.ctx
        _maybe_misbehave(ctx, st.shape)
        with ctx.kernel("scale"):
            y = st.x * 2
        dist.all_gather_into_tensor(st.gathered, y)
        with ctx.kernel("sum"):
            st.out.copy_(st.gathered.view(ctx.world_size, -1).sum(0))
        if st.shape["wrong_rank"] == ctx.rank:
            st.out.add_(1.0)

    def _run_ring(self, st):
        from ring_kernel import ring_push_kernel

        ctx = st.ctx
        _maybe_misbehave(ctx, st.shape)
        st.flag.zero_()
        ctx.heap.barrier()
        with ctx.kernel("ring_push"):
            ring_push_kernel[(1,)](st.src, st.dst, st.flag, st.status, ctx.heap.heap_bases, ctx.rank, ctx.world_size,
                                   200_000, BLOCK=st.shape["N"])
        ctx.heap.barrier()
        if int(st.status.item()) != 1:
            raise RuntimeError("ring flag never arrived")
        st.out.copy_(st.dst)

    def output(self, st):
        return st.out

    def reference(self, ctx, shape, st):
        n, w = shape["N"], ctx.world_size
        base = torch.arange(n, dtype=torch.float64)
        if st.variant == "ring":
            return base + 1000.0 * ((ctx.rank - 1) % w)
        return sum(2 * (base + 1000.0 * r) for r in range(w))

    def tolerance(self, shape):
        return (0.0, 1e-6)

    def cost(self, shape, world_size, variant):
        n = shape["N"]
        if n < 1:  # as real workloads refuse shapes they cannot run (checked on the host before ranks start)
            raise InputError(f"toy: N={n} must be positive")
        return Cost(flops=2 * n * world_size, hbm_bytes=4 * n * (world_size + 2), link_bytes=4 * n * (world_size - 1),
                    intermediates=(Intermediate("gathered", 4 * n * world_size, r"nccl|gloo", r"^sum$"),), dtype="fp32")
