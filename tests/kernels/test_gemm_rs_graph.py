"""Graph safety of the GEMM + Reduce-Scatter variants, without a GPU.

A CUDA graph freezes every kernel argument of the captured iteration. Here one iteration's Triton
launches of the fused variant are recorded (kernel, grid, arguments) and then replayed verbatim
as later iterations, on thread ranks in Triton's interpreter, with fresh inputs written in place
and the output poisoned before each replay: the results must match an fp64 reference of those
inputs (the epoch and the receive buffer's half come from device memory), over both epoch
parities, both reduction placements, 2 and 3 ranks, with no barrier between replays (a rank may
run one epoch ahead, the case the double-buffering covers) and one rank late once.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import replace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from taxmodel.kernels.device.epochs import EPOCH_SLOTS
from taxmodel.kernels.device.sync import check_errors
from taxmodel.kernels.gemm_rs import tiles
from taxmodel.kernels.gemm_rs.state import CPU_RS_CONFIG, make_a_shard, make_b_shard
from taxmodel.kernels.gemm_rs.workload import GemmRs
from taxmodel.runtime.context import RankContext, run_in_threads
from taxmodel.runtime.graph import GraphBackend, eager_reason
from taxmodel.workload import get_workload

from launch_tape import Recorder

pytestmark = pytest.mark.skipif(type(tiles.gemm_rs_kernel).__name__ != "InterpretedFunction",
                                reason="kernels were imported without TRITON_INTERPRET=1")

#: Partial tiles everywhere with the CPU config (16x16x16): 2 ranks: 24 rows each (16 + 8), K/world
#: 18; 3 ranks: 16 rows each, K/world 12; N = 40 (16 + 16 + 8).
SHAPE = {"M": 48, "N": 40, "K": 36, "seed": 3}
REPLAYS = 4  # epochs 2..5 after the captured epoch 1: both parities twice


def _fresh_inputs(st, seed: int) -> torch.Tensor:
    """Write new shards of A and B into this rank's input buffers in place (as a graph's user does)
    and return this rank's rows of C = sum_r A_r @ B_r in fp64, rebuilt from every rank's shards."""
    cpu = torch.device("cpu")
    st.reseed(seed)
    rows = slice(st.rank * st.m_loc, (st.rank + 1) * st.m_loc)
    ref = torch.zeros(st.m_loc, st.n, dtype=torch.float64)
    for r in range(st.world):
        a = make_a_shard(seed, r, st.m, st.k_loc, st.dtype, cpu)[rows].double()
        ref += a @ make_b_shard(seed, r, st.k_loc, st.n, st.k, st.dtype, cpu).double()
    return ref


def _same_arguments(one: list, other: list) -> bool:
    """Two recorded iterations launch the same kernels with the same grids and arguments (tensors by
    address and shape, everything else by value): nothing the host passes changes per iteration."""
    if len(one) != len(other):
        return False

    def key(x):
        return ("tensor", x.data_ptr(), tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x

    return all(k1 is k2 and g1 == g2 and [key(x) for x in a1] == [key(x) for x in a2] and k1_kw == k2_kw
               for (k1, g1, a1, k1_kw), (k2, g2, a2, k2_kw) in zip(one, other))


def test_variants_declare_graph_safety() -> None:
    for reduce in ("kernel", "tail"):
        flags = {n: v.graph_safe for n, v in GemmRs(replace(CPU_RS_CONFIG, reduce=reduce)).variants().items()}
        assert flags == {"bsp": True, "fused": True, "torch_fused": False}
    assert {n: v.graph_safe for n, v in get_workload("gemm_rs").variants().items()} == {
        "bsp": True, "fused": True, "torch_fused": False}


class _AvailableBackend(GraphBackend):
    name = "available"

    def unavailable_reason(self):
        return None


def test_cpu_runs_are_never_captured_and_torch_fused_stays_eager() -> None:
    v = get_workload("gemm_rs").variants()
    for name in ("bsp", "fused", "torch_fused"):
        # Thread ranks (and any CPU rank) run on the CPU device: the CUDA backend refuses them first.
        assert eager_reason("auto", v[name], GraphBackend("cpu")).startswith("CPU run")
    gpu = _AvailableBackend("cuda")
    assert eager_reason("auto", v["bsp"], gpu) is None
    assert eager_reason("require", v["fused"], gpu) is None
    assert "variant 'torch_fused' is not graph-safe" in eager_reason("auto", v["torch_fused"], gpu)


@pytest.mark.parametrize("world,reduce", [(2, "kernel"), (2, "tail"), (3, "kernel"), (3, "tail")])
def test_replaying_one_recorded_iteration_stays_correct(world: int, reduce: str, monkeypatch) -> None:
    tape = threading.local()
    monkeypatch.setattr(tiles, "gemm_rs_kernel", Recorder(tiles.gemm_rs_kernel, tape))
    monkeypatch.setattr(tiles, "rs_reduce_kernel", Recorder(tiles.rs_reduce_kernel, tape))
    wl = GemmRs(replace(CPU_RS_CONFIG, reduce=reduce))
    launches = 1 if reduce == "tail" else 2

    def body(ctx: RankContext):
        v = wl.variants()["fused"]
        assert v.graph_safe
        st = wl.setup(ctx, SHAPE, v)
        st.enable_debug_counters()
        ref = _fresh_inputs(st, 100)
        st.poison()
        tape.log = []
        v.run(st)  # "capture" (it also runs, as the eager warm-up before a capture does): epoch 1
        captured, tape.log = tape.log, None
        assert len(captured) == launches
        errs = [float((st.out.double() - ref).abs().max())]
        for i in range(REPLAYS):  # no barrier: a peer may already push the next epoch meanwhile
            ref = _fresh_inputs(st, 101 + i)
            st.poison()
            if i == 1 and ctx.rank == 0:
                time.sleep(0.5)  # a late rank: the peers' reductions wait on its contributions
            for kernel, grid, args, kwargs in captured:
                kernel[grid](*args, **kwargs)
            check_errors(st.err, tiles.KERNEL_NAMES, ctx)
            assert not torch.isnan(st.out).any(), f"replay {i}: a tile was never written"
            errs.append(float((st.out.double() - ref).abs().max()))
        # An eager iteration after the replays continues the device's count, with the same arguments.
        ref = _fresh_inputs(st, 200)
        st.poison()
        tape.log = []
        v.run(st)
        eager, tape.log = tape.log, None
        check_errors(st.err, tiles.KERNEL_NAMES, ctx)
        errs.append(float((st.out.double() - ref).abs().max()))
        ctx.barrier()  # every rank's flags final before they are read
        return (errs, _same_arguments(captured, eager), st.epochs.tolist(), captured[0][1][0], st.count.tolist(),
                st.flags.tolist())

    total = 1 + REPLAYS + 1
    n_tiles = tiles.own_tiles(SHAPE["M"] // world, SHAPE["N"], CPU_RS_CONFIG.gemm)
    for errs, same, epochs, grid, count, flags in run_in_threads(world, body, heap_bytes=1 << 20, timeout_s=300,
                                                                 spin_timeout_s=60):
        assert len(errs) == total and max(errs) < 1e-4, errs
        assert same  # the host passed nothing that changes per iteration
        # Advanced once per GEMM launch, replays included, in every program's slot (the GEMM's grid).
        assert epochs == [total] * grid + [0] * (EPOCH_SLOTS - grid)
        assert count == [total] * n_tiles  # every own tile reduced once per iteration, replays included
        assert flags[:n_tiles] == [[total] * world] * n_tiles  # every source signalled every tile of every epoch
