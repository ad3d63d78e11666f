"""kernels/device/trace.py and the instrumented fused flash decode: in-kernel records are well formed,
a delayed producer shows up as flag_wait on its consumers, and the normal build holds no record
code. Kernels run in Triton's interpreter (host clock); the no-record-code check compiles for sm_90."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pandas as pd
import pytest
import torch
import triton
import triton.language as tl

from taxmodel.kernels.device import trace
from taxmodel.runtime import records

from late_producer import assert_delay_is_flag_wait, late_producer_records

interpreted = pytest.mark.skipif(type(trace.mark).__name__ != "InterpretedFunction",
                                 reason="kernels were imported without TRITON_INTERPRET=1")


@triton.jit
def _phased(rec_ptr, x_ptr, n, INSTRUMENT: tl.constexpr):
    """Each program: a 'compute' phase, a 'flag_wait' phase, and a 'store_push' phase."""
    pid = tl.program_id(0)
    t = trace.begin(INSTRUMENT, 0)
    offs = tl.arange(0, 16)
    v = tl.load(x_ptr + pid * 16 + offs, mask=offs < n)
    t = trace.mark(rec_ptr, pid, trace.COMPUTE, t, INSTRUMENT, 0)
    w = tl.sum(v * v, axis=0)
    t = trace.mark(rec_ptr, pid, trace.FLAG_WAIT, t, INSTRUMENT, 0)
    tl.store(x_ptr + pid * 16, w)
    t = trace.mark(rec_ptr, pid, trace.STORE_PUSH, t, INSTRUMENT, 0)


def _check_well_formed(rec: pd.DataFrame) -> None:
    """Every CTA's phases are non-empty... in order, non-overlapping, and chained end to start."""
    assert (rec["end_ns"] >= rec["start_ns"]).all()
    for _, g in rec.groupby("cta"):
        g = g.sort_values("start_ns", kind="stable")
        assert (g["start_ns"].to_numpy()[1:] >= g["end_ns"].to_numpy()[:-1]).all()


@interpreted
def test_records_are_chained_per_cta_and_in_phase_order():
    programs = 5
    buf = records.new_buffer(trace.RecordLayout(programs, 3), "cpu")
    x = torch.randn(programs * 16)
    t0 = time.perf_counter_ns()
    _phased[(programs,)](buf, x, 16, INSTRUMENT=True)
    t1 = time.perf_counter_ns()
    rec, dropped = records.decode(buf, 0)
    assert dropped == 0 and len(rec) == 3 * programs
    assert sorted(rec["cta"].unique().tolist()) == list(range(programs))
    for cta, g in rec.groupby("cta"):
        g = g.sort_values("start_ns", kind="stable")
        assert g["phase"].tolist() == ["compute", "flag_wait", "store_push"]
        # chained: each phase starts where the previous ended, so they sum to the CTA's lifetime
        assert (g["start_ns"].to_numpy()[1:] == g["end_ns"].to_numpy()[:-1]).all()
        life = g["end_ns"].max() - g["start_ns"].min()
        assert (g["end_ns"] - g["start_ns"]).sum() == life
    _check_well_formed(rec)
    assert rec["start_ns"].min() >= t0 and rec["end_ns"].max() <= t1  # the host clock under the interpreter


@interpreted
def test_the_kth_record_of_a_cta_lands_in_its_kth_slot():
    """No cursor: CTA c's k-th record is slot c * per_cta + k (k threaded through the clock value),
    slots past a CTA's records stay empty and the drain skips them."""
    programs, per_cta = 4, 5
    buf = records.new_buffer(trace.RecordLayout(programs, per_cta), "cpu")
    _phased[(programs,)](buf, torch.randn(programs * 16), 16, INSTRUMENT=True)
    assert int(buf[trace.DROPPED_WORD]) == 0
    slots = buf[trace.HEADER:].view(programs, per_cta, trace.RECORD_WORDS)
    phases = [trace.PHASE_ID[p] + 1 for p in ("compute", "flag_wait", "store_push")]
    for c in range(programs):
        assert slots[c, :3, 0].tolist() == [c] * 3
        assert slots[c, :3, 1].tolist() == phases
        assert (slots[c, 3:] == 0).all()  # never written
        assert slots[c, 1:3, 2].tolist() == slots[c, :2, 3].tolist()  # start (low 48 bits) = previous end
    rec, dropped = records.decode(buf, 0)
    assert dropped == 0 and rec["cta"].tolist() == [c for c in range(programs) for _ in range(3)]


@triton.jit
def _chain(rec_ptr, n_marks, cta, INSTRUMENT: tl.constexpr):
    """One program records ``n_marks`` compute phases under logical CTA id ``cta``."""
    t = trace.begin(INSTRUMENT, 0)
    for _ in range(n_marks):
        t = trace.mark(rec_ptr, cta, trace.COMPUTE, t, INSTRUMENT, 0)


def _guarded(layout: trace.RecordLayout, guard: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """A record buffer followed by guard words (the kernel gets the buffer's view)."""
    buf = records.new_buffer(layout, "cpu")
    whole = torch.full((buf.numel() + guard,), -7, dtype=torch.int64)
    whole[:buf.numel()] = buf
    return whole[:buf.numel()], whole[buf.numel():]


@interpreted
@pytest.mark.parametrize("n_marks,cta,kept,dropped", [(7, 1, 4, 3), (2, 3, 0, 2), (3, -1, 0, 3), (4, 2, 4, 0)])
def test_records_past_a_ctas_slots_or_the_buffer_are_dropped_and_counted(n_marks, cta, kept, dropped):
    buf, guard = _guarded(trace.RecordLayout(3, 4))
    _chain[(1,)](buf, n_marks, cta, INSTRUMENT=True)
    rec, lost = records.decode(buf, 0)
    assert (len(rec), lost) == (kept, dropped)
    assert (guard == -7).all()  # nothing written past the buffer
    other = [c for c in range(3) if c != cta]
    slots = buf[trace.HEADER:].view(3, 4, trace.RECORD_WORDS)
    assert (slots[other] == 0).all()  # nor into another CTA's slots
    if kept:
        assert set(rec["cta"]) == {cta}
        assert (rec["start_ns"].to_numpy()[1:] == rec["end_ns"].to_numpy()[:-1]).all()


@interpreted
def test_append_mode_collects_several_launches_and_counts_overflow():
    """Graph slots (append mode): every launch's records follow the previous ones through the cursor."""
    buf = records.new_buffer(trace.RecordLayout(2, 3), "cpu", append=True)
    for _ in range(3):
        _phased[(1,)](buf, torch.randn(16), 16, INSTRUMENT=True)
    rec, dropped = records.decode(buf, 0)
    assert len(rec) == 6 and dropped == 3 and int(buf[0]) == 9
    assert rec["phase"].tolist() == ["compute", "flag_wait", "store_push"] * 2
    assert (rec["start_ns"].to_numpy()[1:] >= rec["end_ns"].to_numpy()[:-1]).all()  # launches in order


@interpreted
def test_instrument_off_writes_nothing():
    buf = records.new_buffer(8, "cpu")
    before = buf.clone()
    _phased[(2,)](buf, torch.randn(32), 16, INSTRUMENT=False)
    assert torch.equal(buf, before)


@interpreted
def test_fused_flash_decode_records_on_one_rank():
    from taxmodel.runtime.context import thread_contexts
    from taxmodel.workload import get_workload

    ctx = thread_contexts(1)[0]
    ctx.instrument = True
    wl = get_workload("flash_decode")
    v = wl.variants()["fused"]
    st = wl.setup(ctx, wl.shape("tiny"), v)
    book = ctx.records
    book.arm(2)
    for it in range(2):
        book.set_iteration(it)
        v.run(st)
    rec = book.drain(0)
    a = st.impl.args
    pairs, workers = a.batch * a.kv_heads, a.batch * a.kv_heads * a.plan.num_splits
    per_iteration = workers + 4 * pairs
    assert len(rec) == 2 * per_iteration and book.dropped == {}
    for it, g in rec.groupby("iteration"):
        _check_well_formed(g)
        counts = g["phase"].value_counts().to_dict()
        assert counts == {"compute": workers, "combine": 2 * pairs, "store_push": pairs, "flag_wait": pairs}
        assert (g.loc[g["phase"] == "flag_wait", "cta"] >= workers).all()  # only combiners wait
        assert g["cta"].between(0, workers + pairs - 1).all()  # the logical combiner ids workers + pair
        # the last worker's chain runs on into its pair's combiner id: the chain of every pair's
        # records (worker's compute ... combiner's combine) has no gap, so the phases of one
        # program sum to its lifetime
        comb = g[g["cta"] >= workers].sort_values("start_ns", kind="stable")
        for _, c in comb.groupby("cta"):
            assert c["phase"].tolist() == ["flag_wait", "combine"]
            before = g[(g["cta"] < workers) & (g["end_ns"] == c["start_ns"].iloc[0])]
            assert before["phase"].tolist() == ["store_push"]
    # outputs stay right with records on
    ref = wl.reference(ctx, st.shape, st)
    assert torch.allclose(wl.output(st).float(), ref, rtol=2e-2, atol=2e-2)
    assert book.drain(0).empty  # drained buffers are freed: nothing twice


# --- a delayed producer, ranks as processes ---------------------------------------------------

def _prepare_fused(ctx):
    """Flash decode fused on this rank (rank 1 is a producer of every pair)."""
    from taxmodel.workload import get_workload

    wl = get_workload("flash_decode")
    v = wl.variants()["fused"]
    st = wl.setup(ctx, wl.shape("tiny"), v)
    return (lambda: v.run(st)), (lambda: wl.output(st))  # output() raises if a combiner gave up


@pytest.fixture(scope="module")
def delayed(tmp_path_factory):
    return late_producer_records(_prepare_fused, tmp_path_factory.mktemp("delay"))


def _flag_wait_per_combiner(rec: pd.DataFrame, iteration: int) -> pd.Series:
    g = rec[(rec["iteration"] == iteration) & (rec["phase"] == "flag_wait")]
    return (g["end_ns"] - g["start_ns"]).groupby(g["cta"]).sum() / 1e9


@pytest.mark.slow
def test_a_delayed_producer_is_flag_wait_on_its_consumer(delayed):
    assert_delay_is_flag_wait(delayed, _flag_wait_per_combiner)  # rank 0's combiners wait for rank 1
    for rec in delayed:
        for _, g in rec.groupby("iteration"):
            _check_well_formed(g)


# --- the normal build holds no record code (compiled for sm_90, in a subprocess) ---------------

COMPILE = r'''
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from taxmodel.kernels.flash_decode import fused as fu

sig = {n: "i32" for n in fu.flash_decode_fused.arg_names}
for n in ("q_ptr", "k_ptr", "v_ptr", "out_ptr"):
    sig[n] = "*bf16"
for n in ("part_out_ptr", "part_lse_ptr", "recv_ptr"):
    sig[n] = "*fp32"
for n in ("counter_ptr", "flag_ptr", "epoch_ptr", "done_ptr", "ready_ptr"):
    sig[n] = "*i32"
for n in ("err_ptr", "heap_bases", "rec_ptr"):
    sig[n] = "*i64"
sig["qk_scale"], sig["budget"] = "fp32", "i64"
out = {}
for inst in (False, True, (64 << 16) | 8):  # off, header-reading (graph captures), a fixed layout
    consts = dict(G=4, G_DOT=16, D=32, BLOCK_N=16, NUM_STAGES=1, DOT_F32=False, G_P2=4, NB=4, W_P2=2, MODE=1,
                  KERNEL_ID=1, INSTRUMENT=inst, LL=True, SLICES=0, RS=1, RS_P2=1)
    s = dict(sig)
    for k in consts:
        s[k] = "constexpr"
    k = triton.compile(ASTSource(fn=fu.flash_decode_fused, signature=s, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, num_stages=1))
    ttir = k.asm["ttir"]
    head, _, body = ttir.split("tt.func public @flash_decode_fused", 1)[1].partition("{")
    out[str(inst)] = dict(rec_uses=len(re.findall(r"%rec_ptr\b", body)), rec_declared="%rec_ptr: !tt.ptr<i64>" in head,
                          globaltimer=len(re.findall(r"%globaltimer", k.asm["ptx"])),
                          header_loads=len(re.findall(r"tt.load %rec_ptr\b|tt.addptr %rec_ptr, %c[123]_i32", body)))
print(json.dumps(out))
'''


def _nvidia_backend_present() -> bool:
    base = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return (base / "ptxas").exists()


@pytest.mark.slow
def test_uninstrumented_build_has_no_record_code(tmp_path):
    if not _nvidia_backend_present():
        pytest.skip("Triton's NVIDIA backend tools are not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    off, on = r["False"], r["True"]
    assert off["rec_declared"] and on["rec_declared"]
    assert off["rec_uses"] == 0  # the record pointer is never touched
    assert on["rec_uses"] > 0
    assert on["globaltimer"] > off["globaltimer"] >= 1  # waits read the clock either way; records add reads
    fixed = r[str((64 << 16) | 8)]
    assert fixed["rec_uses"] > 0 and fixed["globaltimer"] == on["globaltimer"]
    # a fixed layout is constants in the code: no load of the header (sizes, append word) per record
    assert fixed["header_loads"] == 0 < on["header_loads"]
