"""Graph safety of the fine-grained All-Gather+GEMM variants, without a GPU.

A CUDA graph freezes every kernel argument of the captured iteration. Here one iteration's Triton
launches are recorded (kernel, grid, arguments) and then replayed verbatim for later iterations,
with fresh inputs written in place and C poisoned before each replay: the variants that declare
``graph_safe`` must stay correct (epoch and parity come from device memory), on thread ranks in
Triton's interpreter.
"""
from __future__ import annotations

import os
import threading
from dataclasses import replace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from taxmodel.kernels.device.epochs import EPOCH_SLOTS
from taxmodel.kernels.device.sync import check_errors
from taxmodel.kernels.ag_gemm import gemm_tiles, transport
from taxmodel.kernels.ag_gemm.workload import AgGemm
from taxmodel.runtime.context import RankContext, run_in_threads
from taxmodel.workload import get_workload

from launch_tape import Recorder

pytestmark = pytest.mark.skipif(type(gemm_tiles.ag_gemm_kernel).__name__ != "InterpretedFunction",
                                reason="kernels were imported without TRITON_INTERPRET=1")


def test_variants_declare_graph_safety_per_transport() -> None:
    def flags(transport: str) -> dict[str, bool]:
        wl = AgGemm(replace(gemm_tiles.CPU_CONFIG, transport=transport))
        return {n: v.graph_safe for n, v in wl.variants().items()}

    assert flags("sm") == {"bsp": True, "pull": True, "push": True, "torch_fused": False}
    assert flags("ce") == {"bsp": True, "pull": True, "push": False, "torch_fused": False}
    assert flags("direct")["pull"] is True
    assert get_workload("ag_gemm").variants()["push"].graph_safe is False  # default transport: copy engines


@pytest.mark.parametrize("variant", ["push", "pull"])
def test_replaying_one_recorded_iteration_stays_correct(variant: str, monkeypatch) -> None:
    tape = threading.local()
    monkeypatch.setattr(gemm_tiles, "ag_gemm_kernel", Recorder(gemm_tiles.ag_gemm_kernel, tape))
    monkeypatch.setattr(transport, "copy_blocks_kernel", Recorder(transport.copy_blocks_kernel, tape))
    wl = AgGemm(replace(gemm_tiles.CPU_CONFIG, transport="sm"))
    shape = {"M": 64, "N": 40, "K": 40, "tp": 0, "seed": 1}
    replays = 3  # odd and even epochs: push's parity must flip on the device

    def body(ctx: RankContext) -> list[float]:
        v = wl.variants()[variant]
        assert v.graph_safe
        st = wl.setup(ctx, shape, v)
        tape.log = []
        v.run(st)  # "capture": the launches of one iteration, arguments frozen from here on
        captured, tape.log = tape.log, None
        assert len(captured) == 2  # the copy kernel and the GEMM
        # Push double-buffers by the device epoch's parity; pull's single buffer keeps every address
        # off the epoch.
        assert [kw["DOUBLE_BUFFER"] for _, _, _, kw in captured] == [variant == "push"] * 2
        (_, (copy_grid,), _, _), (_, (gemm_grid,), _, _) = captured
        errs = []
        for i in range(replays):
            ctx.barrier()
            st.reseed(100 + i)  # fresh inputs in place, as a graph's user refreshes them
            st.poison()
            ctx.barrier()
            for kernel, grid, args, kwargs in captured:
                kernel[grid](*args, **kwargs)
            check_errors(st.err, variant, ctx)
            ref = wl.reference(ctx, st.shape, st)
            out = wl.output(st).float()
            assert not torch.isnan(out).any(), f"replay {i}: a tile was never written"
            errs.append(float((out - ref).abs().max()))
        # Both kernels counted every launch, replays included, in every program's slot.
        for slots, grid in zip(st.epochs.tolist(), (gemm_grid, copy_grid)):
            assert slots == [1 + replays] * grid + [0] * (EPOCH_SLOTS - grid)
        return errs

    errs = run_in_threads(2, body, heap_bytes=1 << 20, timeout_s=300, spin_timeout_s=60)
    assert max(max(e) for e in errs) < 1e-4


class _EngineTape:
    """Stands in for a rank's CopyEngine: runs each call, and while the thread records keeps it (a
    graph captures the copies, flag writes and the reset as nodes with their arguments frozen)."""

    def __init__(self, engine, tape: threading.local) -> None:
        self.engine, self.tape = engine, tape

    def __getattr__(self, name):
        fn = getattr(self.engine, name)
        if name not in ("copy", "write_flag", "reset_flags"):
            return fn

        def call(*args, **kwargs):
            log = getattr(self.tape, "log", None)
            if log is not None:
                log.append((fn, args, kwargs))
            return fn(*args, **kwargs)
        return call


def test_the_copy_engine_pull_replays_with_its_flags_reset_after_every_gemm(monkeypatch) -> None:
    """Copy-engine pull is graph-safe: its flag value never changes (CE_SET) and its flags are zeroed
    after the GEMM, so a replay of one recorded iteration (copies, flag writes, GEMM, reset) is
    right on fresh inputs every time, and a GEMM never runs on a flag left from an earlier one."""
    from taxmodel.kernels.ag_gemm import pull

    tape = threading.local()
    monkeypatch.setattr(gemm_tiles, "ag_gemm_kernel", Recorder(gemm_tiles.ag_gemm_kernel, tape))
    wl = AgGemm(replace(gemm_tiles.CPU_CONFIG, transport="ce"))
    shape = {"M": 64, "N": 40, "K": 40, "tp": 0, "seed": 1}

    def body(ctx: RankContext) -> list[float]:
        v = wl.variants()["pull"]
        assert v.graph_safe
        st = wl.setup(ctx, shape, v)
        st.cache["ce"] = _EngineTape(st.cache["ce"], tape)
        tape.log = []
        v.run(st)
        captured, tape.log = tape.log, None
        engine_ops = [op[0].__name__ for op in captured if len(op) == 3]
        assert engine_ops[-1] == "reset_flags" and "write_flag" in engine_ops and "copy" in engine_ops
        assert [op[3]["DOUBLE_BUFFER"] for op in captured if len(op) == 4] == [False]  # the GEMM: single buffer
        assert int(st.flags.abs().sum()) == 0  # reset after the GEMM
        errs = []
        for i in range(3):
            ctx.barrier()
            st.reseed(200 + i)
            st.poison()
            ctx.barrier()
            for op in captured:
                if len(op) == 4:
                    kernel, grid, args, kwargs = op
                    kernel[grid](*args, **kwargs)
                else:
                    fn, args, kwargs = op
                    fn(*args, **kwargs)
            check_errors(st.err, "pull", ctx)
            assert int(st.flags.abs().sum()) == 0
            ref = wl.reference(ctx, st.shape, st)
            out = wl.output(st).float()
            assert not torch.isnan(out).any(), f"replay {i}: a tile was never written"
            errs.append(float((out - ref).abs().max()))
        assert pull.CE_SET > st.epochs.max().item()
        return errs

    errs = run_in_threads(2, body, heap_bytes=1 << 20, timeout_s=300, spin_timeout_s=60)
    assert max(max(e) for e in errs) < 1e-4
