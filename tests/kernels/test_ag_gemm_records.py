"""In-kernel trace records of the fine-grained All-Gather+GEMM kernels (pull and push with the
``sm`` transport), in Triton's interpreter: every record where it should be, each CTA's phases
chained inside its kernel's launch, outputs still right, and a late producer rank seen as
flag_wait on its consumer."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import replace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pandas as pd
import pytest
import torch

from taxmodel.kernels.device import trace
from taxmodel.kernels.device.sync import check_errors
from taxmodel.kernels.ag_gemm import gemm_tiles, transport
from taxmodel.kernels.ag_gemm.workload import AgGemm
from taxmodel.runtime.context import RankContext, run_in_threads

from late_producer import assert_delay_is_flag_wait, late_producer_records

pytestmark = pytest.mark.skipif(type(gemm_tiles.ag_gemm_kernel).__name__ != "InterpretedFunction",
                                reason="kernels were imported without TRITON_INTERPRET=1")

GEMM, COPY = "ag_gemm_kernel", "copy_blocks_kernel"
SM = replace(gemm_tiles.CPU_CONFIG, transport="sm")
SHAPE = {**AgGemm.presets["tiny"], "seed": 4}  # world 2: M_loc 48 (3 blocks of 16), N 40 (3 tiles), K 40 (2 pieces)


class _Timed:
    """Stands in for a kernel: launches it and notes (name, host start, host end) of each launch."""

    def __init__(self, kernel, name: str, spans: threading.local) -> None:
        self.kernel, self.name, self.spans = kernel, name, spans

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            t0 = time.perf_counter_ns()
            self.kernel[grid](*args, **kwargs)
            self.spans.log.append((self.name, t0, time.perf_counter_ns()))

        return launch


def _chained_per_cta(rec: pd.DataFrame) -> None:
    """Each CTA's records of one launch follow each other without gap or overlap."""
    assert (rec["end_ns"] >= rec["start_ns"]).all()
    for _, g in rec.groupby(["iteration", "name", "cta"]):
        g = g.sort_values(["start_ns", "end_ns"], kind="stable")
        assert (g["start_ns"].to_numpy()[1:] == g["end_ns"].to_numpy()[:-1]).all()


def test_record_layouts_give_each_program_room_for_its_worst_case() -> None:
    # SHAPE on 2 ranks: 3 programs over 2 x 3 x 3 tiles (9 remote), 2 K pieces; the copy kernel's
    # 2 programs over 6 work items.
    assert gemm_tiles.gemm_record_layout(48, 40, 2, SM, 2, "cpu") == trace.RecordLayout(3, 1 + 2 * 2 * 3)
    assert transport.copy_record_layout(48, 40, 2, SM) == trace.RecordLayout(2, 3)
    # Every wait spinning: a program records once plus twice per remote tile and piece. Programs
    # take tiles pid, pid + P, ...; the own tiles come first (tile_gemm.tile_coords).
    for m_loc, n, world, progs, pieces in [(48, 40, 2, 3, 2), (100, 70, 4, 5, 3), (16, 16, 3, 7, 1)]:
        cfg = replace(SM, num_progs=progs)
        bpr, n_tiles = gemm_tiles.tile_counts(m_loc, n, world, cfg)
        total, own = world * bpr * n_tiles, bpr * n_tiles
        programs = min(progs, total)
        worst = max(1 + 2 * pieces * sum(t >= own for t in range(pid, total, programs)) for pid in range(programs))
        layout = gemm_tiles.gemm_record_layout(m_loc, n, world, cfg, pieces, "cpu")
        assert layout.ctas == programs and worst <= layout.per_cta <= worst + 2 * pieces


@pytest.mark.parametrize("variant,copy_phase", [("push", "store_push"), ("pull", "remote_load")])
def test_records_are_complete_chained_and_inside_their_kernels(variant: str, copy_phase: str, monkeypatch) -> None:
    spans = threading.local()
    monkeypatch.setattr(gemm_tiles, "ag_gemm_kernel", _Timed(gemm_tiles.ag_gemm_kernel, GEMM, spans))
    monkeypatch.setattr(transport, "copy_blocks_kernel", _Timed(transport.copy_blocks_kernel, COPY, spans))
    wl = AgGemm(SM)
    iterations = 2

    def body(ctx: RankContext):
        ctx.instrument = True
        spans.log = []
        v = wl.variants()[variant]
        st = wl.setup(ctx, SHAPE, v)
        ref = wl.reference(ctx, SHAPE, st)
        book = ctx.records
        book.arm(iterations)
        launches = []
        for it in range(iterations):
            book.set_iteration(it)
            st.poison()
            spans.log = []
            v.run(st)
            check_errors(st.err, variant, ctx)
            torch.testing.assert_close(st.c.float(), ref, rtol=1e-4, atol=1e-4)  # records change nothing
            launches += [(it, *s) for s in spans.log]
            ctx.barrier()
        return book.drain(ctx.rank), launches, book.dropped

    for rank, (rec, launches, dropped) in enumerate(run_in_threads(2, body, heap_bytes=1 << 20, timeout_s=300)):
        assert dropped == {}
        # world 2, 16x16 tiles, 32-column pieces: 3 remote M-blocks x 3 N-tiles, K=40 in 2 pieces;
        # the GEMM's 3 programs, the copy kernel's 2 programs over 3 blocks x 2 pieces x 1 peer.
        remote, pieces, items = 9, 2, 6
        for it in range(iterations):
            g = rec[rec["iteration"] == it]
            gemm, copy = g[g["name"] == GEMM], g[g["name"] == COPY]
            # Records only at phase changes: per CTA compute, (flag_wait, compute) per wait that spun.
            for cta, c in gemm.sort_values("start_ns", kind="stable").groupby("cta"):
                phases = c["phase"].tolist()
                assert phases == ["compute"] + ["flag_wait", "compute"] * ((len(phases) - 1) // 2), (cta, phases)
            assert (gemm["phase"] == "flag_wait").sum() <= remote * pieces
            assert sorted(gemm["cta"].unique()) == [0, 1, 2]
            assert copy["phase"].value_counts().to_dict() == {copy_phase: items}
            assert sorted(copy["cta"].unique()) == [0, 1]
            for name, start, end in [(n, s, e) for i, n, s, e in launches if i == it]:
                k = g[g["name"] == name]
                assert k["start_ns"].min() >= start and k["end_ns"].max() <= end, (rank, it, name)
        _chained_per_cta(rec)


def test_no_records_without_instrument() -> None:
    wl = AgGemm(SM)

    def body(ctx: RankContext):
        st = wl.setup(ctx, SHAPE, wl.variants()["push"])
        return st.records, ctx.records

    for records, book in run_in_threads(2, body, heap_bytes=1 << 20, timeout_s=120):
        assert records == {} and book is None


# --- a delayed producer, ranks as processes ---------------------------------------------------

def _prepare_push(ctx):
    """Push (sm transport) on this rank: rank 1 produces rank 0's remote rows."""
    wl = AgGemm(replace(gemm_tiles.CPU_CONFIG, transport="sm"))
    v = wl.variants()["push"]
    st = wl.setup(ctx, SHAPE, v)
    return (lambda: v.run(st)), (lambda: check_errors(st.err, "push", ctx))


@pytest.fixture(scope="module")
def delayed(tmp_path_factory):
    return late_producer_records(_prepare_push, tmp_path_factory.mktemp("delay"))


def _gemm_flag_wait_per_cta(rec: pd.DataFrame, iteration: int) -> pd.Series:
    """Seconds each GEMM CTA spent in flag_wait records (0 for CTAs with none)."""
    g = rec[(rec["iteration"] == iteration) & (rec["name"] == GEMM)]
    wait = (g["end_ns"] - g["start_ns"]).where(g["phase"] == "flag_wait", 0)
    return wait.groupby(g["cta"]).sum() / 1e9


@pytest.mark.slow
def test_a_delayed_producer_is_flag_wait_on_its_consumer(delayed):
    # rank 0's first GEMM program reaches rank 1's rows after its own tiles and waits until rank 1
    # has pushed them
    waited = assert_delay_is_flag_wait(delayed, _gemm_flag_wait_per_cta)
    # iteration 0 (no delay) waited far less on rank 0 too
    assert _gemm_flag_wait_per_cta(delayed[0], 0).max() < 0.5 * waited.max()
    for rec in delayed:
        assert set(rec["phase"]) <= {"compute", "flag_wait", "store_push"}
        _chained_per_cta(rec)
