"""`taxmodel calibrate`'s microbenchmarks of the workloads' own kernels (issue 33), run at tiny sizes in
Triton's interpreter: the real kernels (tile GEMM, copy kernel, LL push and merge, reduction) go
through the same code paths as on a GPU, and their rows feed the fits. The interpreter's times say
nothing about a GPU; what is checked is that each step runs its kernels correctly and gives rows the
fit takes."""
from __future__ import annotations

import pytest
import torch

from taxmodel.model import calibration as calfit
from taxmodel.runtime import calibrate_decode, calibrate_gemm, calibrate_reduce
from taxmodel.runtime.microbench import PseudoPeerHeap
from taxmodel.runtime.timing import kernel_seconds

CPU = torch.device("cpu")


def test_the_tile_gemm_step_times_the_engine_and_the_vendor_gemm_on_the_same_operands():
    res = calibrate_gemm.measure_tile_gemm(CPU)
    assert [r["m"] for r in res["rows"]] == list(calibrate_gemm.CPU_GEMM_MS)
    assert all(r["tile_s"] > 0 and r["vendor_s"] > 0 and r["config"] for r in res["rows"])
    assert [p[0] for p in calfit.gemm_speed_by_m(res)] == [float(m) for m in calibrate_gemm.CPU_GEMM_MS]
    # the narrow first-wave tiles at the smallest M (on the interpreter its own 16-column tiles, the
    # narrowest tl.dot takes), checked against torch.matmul like every point, and their time over
    # the same M's row
    narrow = res["narrow"]
    small = res["rows"][0]
    assert narrow["m"] == small["m"] == min(calibrate_gemm.CPU_GEMM_MS) and narrow["tile_s"] > 0
    assert narrow["config"] == small["config"]
    assert calfit.narrow_tile_factor(res) == pytest.approx(narrow["tile_s"] / small["tile_s"], rel=1e-3)


def test_the_narrow_tile_factor_needs_a_narrow_row_and_the_same_m():
    rows = [{"m": 1024, "tile_s": 2e-4, "vendor_s": 1.8e-4}, {"m": 4096, "tile_s": 8e-4, "vendor_s": 7e-4}]
    assert calfit.narrow_tile_factor({"rows": rows, "narrow": {"m": 1024, "tile_s": 2.5e-4}}) == 1.25
    assert calfit.narrow_tile_factor({"rows": rows}) is None  # a calibration from before the narrow row
    assert calfit.narrow_tile_factor({"rows": rows, "narrow": {"m": 2048, "tile_s": 2.5e-4}}) is None
    assert calfit.narrow_tile_factor(None) is None


def test_the_copy_share_step_runs_the_copy_kernel_in_both_modes_alone_and_beside_the_gemm_on_a_pseudo_peer():
    heap = PseudoPeerHeap(1 << 20, CPU)
    res = calibrate_gemm.measure_copy_share(CPU, heap, 0, 2, heap.barrier)
    # one row per (M, mode): pull then push at every M
    assert [(r["m"], r["mode"]) for r in res["rows"]] == [(m, mode) for m in calibrate_gemm.CPU_GEMM_MS
                                                          for mode in ("pull", "push")]
    for r in res["rows"]:
        assert r["world"] == 2 and r["items"] >= r["programs"] >= 1 and r["item_bytes"] > 0
        assert min(r["copy_alone_s"], r["copy_shared_s"], r["gemm_alone_s"], r["gemm_shared_s"]) > 0
    fit = calfit.copy_share_fit(res)
    assert fit["copy_program_bytes_per_s"] > 0 and fit["copy_program_push_bytes_per_s"] > 0
    # the copy kernel really moved the slabs: pull brought rank 1's rows (its slot in rank 1's half)
    # into rank 0's buffer; push stored rank 0's own rows into rank 1's buffer
    m = calibrate_gemm.CPU_GEMM_MS[-1]
    k = calibrate_gemm.CPU_NK
    heap.reset()
    mine = heap.empty((m, k), torch.float32)
    twin = heap._both[heap.nbytes:heap.nbytes + mine.numel() * 4].view(torch.float32).view(m, k)
    assert twin.data_ptr() - mine.data_ptr() == heap.nbytes
    peer_rows = twin[m // 2:]
    assert torch.equal(mine[m // 2:], peer_rows)
    assert mine[:m // 2].abs().sum() > 0 and torch.equal(twin[:m // 2], mine[:m // 2])


def test_the_copy_share_step_measures_the_modes_asked_and_no_other():
    heap = PseudoPeerHeap(1 << 20, CPU)
    m = calibrate_gemm.CPU_GEMM_MS[0]
    res = calibrate_gemm.measure_copy_share(CPU, heap, 0, 2, heap.barrier, ms=(m,), modes=("pull",))
    assert [r["mode"] for r in res["rows"]] == ["pull"]
    assert "copy_program_push_bytes_per_s" not in calfit.copy_share_fit(res)
    heap.reset()
    twin = heap._both[heap.nbytes:heap.nbytes + m * calibrate_gemm.CPU_NK * 4]
    assert twin.abs().sum() == 0  # nothing was pushed into the peer
    with pytest.raises(ValueError, match="unknown copy mode"):
        calibrate_gemm.measure_copy_share(CPU, heap, 0, 2, heap.barrier, ms=(m,), modes=("scatter",))


def test_the_rs_gemm_step_pushes_every_peer_tile_into_its_owner_and_times_the_vendor_gemm_beside_it():
    heap = PseudoPeerHeap(1 << 21, CPU)
    res = calibrate_gemm.measure_rs_gemm(CPU, heap, 0, 2, heap.barrier)
    assert [r["m"] for r in res["rows"]] == [m * 2 for m in calibrate_gemm.CPU_GEMM_MS]
    assert all(r["rs_s"] > 0 and r["vendor_s"] > 0 and r["k_loc"] * 2 == r["k"] for r in res["rows"])
    assert [p[0] for p in calfit.gemm_speed_by_m(res, "rs_s")] == [float(r["m"]) for r in res["rows"]]
    # the last size's pushes landed: rank 1's slot of rank 0's rows, in rank 1's half of the heap,
    # holds rank 0's partial product of rank 1's rows (the step checked rank 0's own slot itself)
    m = res["rows"][-1]["m"]
    n, k_loc = res["rows"][-1]["n"], res["rows"][-1]["k_loc"]
    a, b, _ = calibrate_gemm._operands(m, n, k_loc, CPU)
    heap.reset()
    recv = heap.empty((2, 2, m // 2, n), torch.float32)
    twin = heap._both[heap.nbytes:heap.nbytes + recv.numel() * 4].view(torch.float32).view(2, 2, m // 2, n)
    landed = [h for h in range(2) if not torch.isnan(twin[h, 0]).any() and twin[h, 0].abs().sum() > 0]
    assert landed, "no half of the peer's receive slot was written"
    want = (a[m // 2:].double() @ b.double()).float()
    assert torch.allclose(twin[landed[-1], 0], want, rtol=1e-3, atol=1e-3)


def test_the_pseudo_peer_heap_translates_like_a_two_rank_heap():
    heap = PseudoPeerHeap(4096, CPU)
    a = heap.zeros(16, torch.float32)
    base0, base1 = heap.heap_bases.tolist()
    assert base1 - base0 == heap.nbytes and heap.offset_of(a) == 0 and heap.world_size == 2


def test_the_ll_step_pushes_and_merges_with_the_fused_kernels_own_functions():
    heap = PseudoPeerHeap(1 << 20, CPU)
    push = calibrate_decode.measure_push(CPU, heap, 0, 2, heap.barrier)
    assert push["reps"] == list(calibrate_decode.PUSH_REPS) and len(push["push_s"]) == 2
    # every pushed word landed in both "ranks" with the last epoch and the value 1.0
    programs, rows, d = push["programs"], push["rows"], push["head_dim"]
    slot = programs * rows * (d + 1)
    words = heap._both.view(torch.int64)
    last = max(calibrate_decode.PUSH_REPS)
    for base in (0, heap.nbytes // 8):
        half = words[base + (last % 2) * 2 * slot: base + (last % 2) * 2 * slot + slot]  # slot of rank 0
        vals = half[: programs * rows * d]
        assert bool(((vals >> 32) == last).all())
        assert bool(((vals & 0xFFFFFFFF).to(torch.int32).view(torch.float32) == 1.0).all())
    merge = calibrate_decode.measure_merge(CPU)
    assert merge["sources"] == list(calibrate_decode.MERGE_SOURCES) and min(merge["merge_s"]) > 0


def test_ll_words_are_the_value_bits_under_the_epoch():
    w = calibrate_decode.ll_words(torch.tensor([1.0, -2.5]), 7)
    assert ((w >> 32) == 7).all()
    assert torch.equal((w & 0xFFFFFFFF).to(torch.int32).view(torch.float32), torch.tensor([1.0, -2.5]))


def test_the_reduce_step_times_the_reduction_over_set_flags_and_checks_its_sum():
    res = calibrate_reduce.measure(CPU, (2, 8))
    assert [r["world"] for r in res["rows"]] == [2, 8]
    assert all(r["programs"] >= 1 and r["reduce_s"] > 0 for r in res["rows"])


def test_kernel_seconds_off_a_gpu_is_the_host_time_of_the_body_for_every_label():
    calls = []
    t = kernel_seconds(CPU, lambda: calls.append(1), {"a": "x", "b": "y"})
    assert calls == [1] and set(t) == {"a", "b"} and t["a"] == t["b"] and t["a"][0] >= 0


def test_the_unprofiled_replay_is_a_repetitions_graph_less_the_one_step_graph_per_extra_step(monkeypatch):
    """Samples of the one-step graph and of a graph of ``capture.iterations`` steps take turns, each
    after a barrier; what a replay pays once cancels in the difference. A stand-in graph backend
    replays what it captured; the one-step graph is a counting runner."""
    import contextlib
    from types import SimpleNamespace

    from taxmodel.runtime import session as session_mod
    from taxmodel.runtime import timing

    order, barriers = [], []

    class Backend:
        def __init__(self, device):
            pass

        def unavailable_reason(self):
            return None

        def side_stream(self):
            return contextlib.nullcontext()

        def capture(self, body):
            order.append("capture")
            return SimpleNamespace(replay=lambda: (order.append("replay"), body()))

        def synchronize(self):
            pass

    monkeypatch.setattr(timing, "GraphBackend", Backend)
    run = SimpleNamespace(ctx=SimpleNamespace(is_cuda=True), device="cpu", spec=SimpleNamespace(iterations=4),
                          barrier=lambda: barriers.append(1))
    vs = object.__new__(session_mod.VariantSession)
    vs.run, vs.injector, vs.replay_note = run, None, None
    vs.step = lambda: order.append("step")
    vs.runner = SimpleNamespace(launch=lambda: order.append("one"))
    vs.gate = None
    assert vs.time_replays() >= 0
    reps = session_mod.REPLAY_REPS
    long_graph = ["replay"] + ["step"] * 4
    assert order[:2] == ["step", "capture"]  # one warm-up step, then the four steps captured together
    timed = order[2 + 2 * len(long_graph):]  # after its warm-up replay and its own first sample
    assert timed == (["one"] + long_graph) * reps  # the two graphs take turns, sample by sample
    assert len(barriers) >= 2 * reps

    # with a device gate (the default alignment on GPUs) every sample starts behind it, as a
    # traced repetition does, and the gate is checked at the end
    class Gate:
        def __call__(self):
            order.append("gate")

        def check(self):
            order.append("gate checked")

    order.clear()
    vs.gate = Gate()
    assert vs.time_replays() >= 0
    assert order == (["step", "gate", "capture"] + long_graph + ["gate"] + long_graph  # warm-up replay, first sample
                     + (["gate", "one", "gate"] + long_graph) * reps + ["gate checked"])
    vs.injector = object()  # injected taxes: nothing to compare with
    assert vs.time_replays() is None


def test_a_replayed_step_is_the_difference_of_the_two_graphs_over_the_extra_steps():
    from taxmodel.runtime.session import replay_step_ms

    # a replay pays 7 us once; a step costs 15 us
    assert replay_step_ms(0.007 + 0.015, 0.007 + 5 * 0.015, 5) == pytest.approx(0.015)
    assert replay_step_ms(0.100, 0.090, 5) == pytest.approx(0.090 / 5)  # noise: the long graph's mean


def test_the_fused_combine_step_runs_the_fused_kernel_at_one_rank_and_the_split_kernel_on_the_same_plan():
    from taxmodel.kernels.flash_decode import fused
    from taxmodel.kernels.flash_decode.reference import reference_output
    from taxmodel.runtime import calibrate_fused

    res = calibrate_fused.measure(CPU)
    assert (res["q_heads"], res["kv_heads"], res["head_dim"]) == calibrate_fused.CPU_DIMS and res["world_size"] == 1
    assert [(r["batch"], r["kv_len"]) for r in res["rows"]] == list(calibrate_fused.CPU_GRID)
    for r in res["rows"]:
        assert r["splits"] >= 2 and r["steps"] >= 1 and r["pairs"] == r["batch"] * res["kv_heads"]
        assert r["fused_s"] > 0 and r["split_s"] > 0 and r["tail_s"] == pytest.approx(r["fused_s"] - r["split_s"])
    # the interpreter gives both kernels the body's host time: no line (a GPU's rows give one)
    assert calfit.fused_combine_fit(res) == {}
    # the kernel it times is the workload's fused kernel at one rank: its output is the attention
    state, args = calibrate_fused.fused_state(CPU, 2, 48, calibrate_fused.CPU_DIMS)
    for _ in range(2):  # a second launch: the epoch advances, nothing waits
        fused.launch_fused(state)
    fused.check_fused(state)
    want = reference_output(0, args.q, [48], args.kv_heads)
    assert torch.allclose(state.out.float(), want, atol=2e-2, rtol=2e-2)
