"""The locality chain of ``bench_locality.py`` as a taxmodel workload, so the tool itself measures it.

Why: issue 24's proof asks that *the tool* report the unfused chain's locality tax from its
DRAM counters and that it match what fusing saves. Registered as ``locality_chain`` it runs
through ``taxmodel profile --counters`` (timed pass traced, counters pass under ncu) and
``taxmodel analyze`` (ledger 5b: measured locality against the declared compulsory bytes).

    taxmodel profile locality_chain --workload-module benchmarks/locality_workload.py \\
        -n 1 --device cuda --graph --counters --preset l2,hbm -o runs

Variants: ``unfused`` (``axpb_kernel`` writes y to memory, ``relu_kernel`` reads it) and
``fused`` (``fused_kernel``). Declared cost per iteration: x read once and z written once
(``hbm_bytes = 8 N``, fp32); the unfused variant also declares y (4 N bytes) as an
intermediate, so the analytic (estimated) locality is y's round trip at HBM bandwidth.
"""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import torch

from taxmodel.workload import Cost, Intermediate, Variant, Workload, register

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_locality import A, B, fused, unfused  # noqa: E402  (the benchmark's own kernels)


@register
class LocalityChain(Workload):
    name = "locality_chain"
    description = "y = 1.5*x - 0.25; z = relu(y) over fp32 vectors: two kernels (y in memory) or one"
    presets = {"tiny": {"N": 4096}, "l2": {"N": 2 * 2**20}, "hbm": {"N": 256 * 2**20}}
    default_preset = "hbm"
    cpu_preset = "tiny"

    def variants(self) -> dict[str, Variant]:
        roles = {r"axpb_kernel|relu_kernel|fused_kernel": "compute"}
        return {
            "unfused": Variant("unfused", self._run(unfused), roles=roles, graph_safe=True,
                               description="axpb_kernel (x -> y in memory), then relu_kernel (y -> z)"),
            "fused": Variant("fused", self._run(fused), roles=roles, graph_safe=True, fine_grained=True,
                             description="fused_kernel (x -> z; y stays in registers)"),
        }

    @staticmethod
    def _run(chain):
        def run(st):
            with st.ctx.kernel("chain"):
                chain(st.x, st.y, st.z)
        return run

    def setup(self, ctx, shape, variant):
        n = shape["N"]
        gen = torch.Generator(device="cpu").manual_seed(ctx.rank)
        x = torch.randn(n, generator=gen).to(ctx.device)
        return SimpleNamespace(ctx=ctx, x=x, y=torch.empty(n, device=ctx.device),
                               z=torch.full((n,), float("nan"), device=ctx.device))

    def reference(self, ctx, shape, state):
        return torch.relu(state.x.double() * A + B)

    def output(self, state):
        return state.z

    def tolerance(self, shape, world_size=1):
        return (1e-6, 1e-6)

    def cost(self, shape, world_size, variant):
        n = shape["N"]
        inter = (Intermediate("y", 4 * n, "axpb_kernel", "relu_kernel"),) if variant == "unfused" else ()
        return Cost(flops=3 * n, hbm_bytes=8 * n, link_bytes=0, intermediates=inter, dtype="fp32")
