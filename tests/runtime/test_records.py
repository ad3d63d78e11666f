"""taxmodel/runtime/records.py and the ledger's use of in-kernel records: buffers and the drain,
clock alignment to the trace's kernels, communication-only phases as bulk-synchronous tax, and
`taxmodel profile --instrument` on CPU ranks end to end."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from taxmodel.kernels.device import sync, trace
from taxmodel.ledger.compute import compute_ledger
from taxmodel.runtime import records
from taxmodel.trace import schema
from taxmodel.testing.synthetic import synthetic_bundle

from record_writer import write_records


def test_decode_reads_phases_and_scales_amd_ticks():
    buf = records.new_buffer(trace.RecordLayout(6, 1), "cpu")
    write_records(buf, [(3, "flag_wait", 100, 250), (4, "store_push", 250, 260), (5, "compute", 1, 2),
                        (3, "compute", 250, 300)])  # CTA 3's second record: past its one slot
    nv, dropped = records.decode(buf, sync.SYNC_NVIDIA)
    assert dropped == 1
    assert nv.to_dict("list") == {"cta": [3, 4, 5], "phase": ["flag_wait", "store_push", "compute"],
                                  "start_ns": [100, 250, 1], "end_ns": [250, 260, 2]}
    amd, _ = records.decode(buf, sync.SYNC_AMD)
    assert amd["start_ns"].tolist() == [1000, 2500, 10]  # 10-ns ticks


def test_decode_reads_only_written_slots():
    buf = records.new_buffer(trace.RecordLayout(3, 4), "cpu")
    assert records.decode(buf, sync.SYNC_NVIDIA)[0].empty
    write_records(buf, [(2, "compute", 0, 0)])  # a zero-length phase at clock 0 still counts
    rec, dropped = records.decode(buf, sync.SYNC_NVIDIA)
    assert rec.to_dict("list") == {"cta": [2], "phase": ["compute"], "start_ns": [0], "end_ns": [0]} and dropped == 0


WRAP = 1 << trace.CLOCK_BITS


def test_start_unwraps_across_a_48_bit_wrap():
    base = 7 * WRAP  # the clock's low 48 bits wrap between the start and the end of the phase
    buf = records.new_buffer(trace.RecordLayout(1, 2), "cpu")
    write_records(buf, [(0, "flag_wait", base - 50, base + 100), (0, "compute", base + 100, base + 130)])
    assert int(buf[trace.HEADER + 2]) == WRAP - 50  # what the kernel keeps of the start
    rec, _ = records.decode(buf, sync.SYNC_NVIDIA)
    assert rec["start_ns"].tolist() == [base - 50, base + 100] and rec["end_ns"].tolist() == [base + 100, base + 130]
    amd, _ = records.decode(buf, sync.SYNC_AMD)
    assert amd["start_ns"].tolist() == [10 * (base - 50), 10 * (base + 100)]


@settings(max_examples=60, deadline=None)
@given(end=st.integers(0, 2**62), length=st.integers(0, WRAP - 1))
def test_start_unwrap_is_exact_for_phases_shorter_than_the_wrap(end, length):
    start = max(end - length, 0)
    got = records.unwrap_start(np.array([start & (WRAP - 1)], np.int64), np.array([end], np.int64))
    assert int(got[0]) == start


def test_offsets_stay_one_per_rank_when_launches_straddle_a_wrap():
    """Records of launches on both sides of a 48-bit wrap of the device clock keep absolute times,
    so one clock offset still fits every launch of a rank (residual 0)."""
    dev0 = 3 * WRAP - 600  # launch 0's flag_wait runs across the wrap, launch 1 comes after it
    trace_minus_dev = -dev0 + 10_000
    ev = _events([(0, 0, 10_000, 11_000), (0, 1, 12_000, 13_000)])
    frames = []
    for it, first in enumerate((dev0, dev0 + 2_000)):
        buf = records.new_buffer(trace.RecordLayout(2, 2), "cpu")
        write_records(buf, [(0, "compute", first + 100, first + 500), (0, "flag_wait", first + 500, first + 900),
                            (1, "compute", first + 100, first + 700)])
        rec, _ = records.decode(buf, sync.SYNC_NVIDIA)
        frames.append(rec.assign(rank=0, repetition=0, iteration=it, name="fused"))
    out, info = records.merge_records(ev, pd.concat(frames, ignore_index=True))
    assert info["residual_ns"] == {"0": 0} and info["offset_ns"] == {"0": trace_minus_dev}
    got = out[out["kind"] == "record"]
    assert sorted(got["start_ns"].tolist()) == [10_100, 10_100, 10_500, 12_100, 12_100, 12_500]


def test_book_drain_separates_iterations_and_resets():
    book = records.RecordBook()
    buf = book.buffer("k", 8, "cpu", sync.SYNC_POLL)
    write_records(buf.tensor(), [(0, "compute", 1, 2)])  # warm-up: scratch, never drained
    book.arm(2)
    for it in range(2):
        book.set_iteration(it)
        write_records(buf.tensor(), [(it, "compute", 10 * it, 10 * it + 5)] * (it + 1))
    out = book.drain(rank=3, repetition=1)
    assert list(out.columns) == list(records.RECORD_COLUMNS)
    assert out.groupby("iteration").size().to_dict() == {0: 1, 1: 2}
    assert (out["rank"] == 3).all() and (out["repetition"] == 1).all() and (out["name"] == "k").all()
    assert buf.tensor() is buf.scratch  # back to scratch until the next arm
    assert book.drain(rank=3).empty
    book.arm(1)
    book.set_iteration(0)
    assert not buf.tensor()[trace.HEADER:].any()  # fresh slots
    write_records(buf.tensor(), [(0, "compute", 1, 2)])  # a warm-up step into step 0's buffer
    book.clear(0)
    assert not buf.tensor()[trace.HEADER:].any() and int(buf.tensor()[trace.CTAS_WORD]) == 8  # emptied, header kept
    assert book.drain(rank=0).empty


def test_book_grows_a_buffer_to_hold_every_setups_layout():
    book = records.RecordBook()
    first = book.buffer("k", trace.RecordLayout(4, 2), "cpu", sync.SYNC_POLL)
    assert book.buffer("k", trace.RecordLayout(3, 1), "cpu", sync.SYNC_POLL) is first  # fits
    grown = book.buffer("k", trace.RecordLayout(2, 5), "cpu", sync.SYNC_POLL)
    assert grown.layout == trace.RecordLayout(4, 8)  # sizes rounded up to powers of two
    head = grown.scratch[:trace.APPEND_WORD + 1].tolist()
    assert head == [0, 4, 8, 0] and grown.scratch.numel() == trace.HEADER + trace.RECORD_WORDS * 32
    assert grown.code == (4 << 16) | 8 and not grown.append
    with pytest.raises(ValueError):
        trace.RecordLayout(0, 1)


def test_layout_codes_make_fixed_slot_kernels_and_graph_books_read_the_header():
    """A fixed-slot buffer hands its kernel the layout as a constexpr (no header loads per record);
    a book made for graph captures hands out code 1 (read the header: append mode)."""
    assert trace.RecordLayout(5, 3).rounded() == trace.RecordLayout(8, 4)
    assert trace.RecordLayout(1, 1).rounded().code == (1 << 16) | 1
    assert trace.instrument_code(None) == 0
    graph_book = records.RecordBook(append=True)
    buf = graph_book.buffer("k", trace.RecordLayout(3, 2), "cpu", sync.SYNC_POLL)
    assert buf.append and buf.code == 1 and trace.instrument_code(buf) == 1


def _events(kernels: list[tuple[int, int, int, int]]) -> pd.DataFrame:
    """Kernel rows (rank, iteration, start, end) of one kernel named 'fused'."""
    return pd.DataFrame([dict(rank=r, device=r, stream=7, kind="kernel", role="fused", name="fused", start_ns=s, end_ns=e,
                              repetition=0, iteration=it) for r, it, s, e in kernels])


@settings(max_examples=30, deadline=None)
@given(offset=st.integers(-10**15, 10**15), slack=st.integers(0, 10_000), span=st.integers(10, 100_000),
       n=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_alignment_centres_the_record_span_in_the_kernel(offset, slack, span, n, seed):
    rng = np.random.default_rng(seed)
    ks = 5_000_000
    ev = _events([(0, 0, ks, ks + span + slack)])
    cuts = np.sort(rng.integers(0, span, size=n))
    starts = np.r_[0, cuts]
    ends = np.r_[cuts, span]
    rec = pd.DataFrame(dict(rank=0, repetition=0, iteration=0, name="fused", cta=np.arange(n + 1) % 3,
                            phase="compute", start_ns=starts - offset, end_ns=ends - offset))
    out, info = records.merge_records(ev, rec)
    got = out[out["kind"] == "record"]
    assert info["unmatched"] == 0 and info["spans_longer_than_kernel"] == 0
    assert info["residual_ns"] == {"0": 0}
    # every record inside the kernel, durations kept, span centred (to the ns)
    assert (got["start_ns"] >= ks).all() and (got["end_ns"] <= ks + span + slack).all()
    kept = (ends - starts) > 0
    assert sorted((got["end_ns"] - got["start_ns"]).tolist()) == sorted((ends - starts)[kept].tolist())
    assert int(got["start_ns"].min()) - ks == slack // 2
    assert info["records"] == int(kept.sum()) and info["empty_after_clip"] == int((~kept).sum())


def test_alignment_reports_residual_unmatched_and_clips_long_spans():
    ev = _events([(0, 0, 1000, 2000), (0, 1, 3000, 4000), (1, 0, 1000, 1100)])
    rec = pd.DataFrame(dict(rank=[0, 0, 1, 1, 0], repetition=0, iteration=[0, 1, 0, 0, 5], name="fused", cta=0,
                            phase="flag_wait", start_ns=[100, 2150, 0, 100, 0], end_ns=[200, 2250, 100, 300, 10]))
    out, info = records.merge_records(ev, rec)
    got = out[out["kind"] == "record"].sort_values(["rank", "start_ns"])
    assert info["unmatched"] == 1  # iteration 5 has no kernel
    assert info["spans_longer_than_kernel"] == 1  # rank 1: 300 ns of records in a 100 ns kernel
    assert info["offset_ns"]["0"] == 1325 and info["residual_ns"]["0"] == 25  # per-kernel offsets 1350, 1300
    r1 = got[got["rank"] == 1]
    assert (r1["start_ns"] >= 1000).all() and (r1["end_ns"] <= 1100).all()
    assert set(got["stream"]) == {7} and set(got["role"]) == {"fused"}
    schema.validate_events(schema.normalize_events(out))


def _with_comm_phase(case, push_ns: int):
    """The synthetic fused case with each CTA's compute record starting with ``push_ns`` of store_push."""
    ev = case.bundle.events
    comp = ev[(ev["kind"] == "record") & (ev["phase"] == "compute")]
    push = comp.assign(end_ns=comp["start_ns"] + push_ns, phase="store_push")
    ev = ev.copy()
    ev.loc[comp.index, "start_ns"] = comp["start_ns"] + push_ns
    case.bundle.events = schema.normalize_events(pd.concat([ev, push], ignore_index=True))
    return case


def _sub(led, name, rank=0, iteration=1):
    p = led.parts
    return int(p[(p["subcategory"] == name) & (p["rank"] == rank) & (p["iteration"] == iteration)]["ns"].sum())


def test_communication_only_phases_are_exposed_comm():
    base = synthetic_bundle(variant="fused", flag_wait_ns=3000)
    plain = compute_ledger(base.bundle, base.hardware)
    pushed = compute_ledger(_with_comm_phase(synthetic_bundle(variant="fused", flag_wait_ns=3000), 2000).bundle,
                            base.hardware)
    for r in (0, 1):
        assert _sub(pushed, "flag_wait", r) == _sub(plain, "flag_wait", r) == 3000
        assert _sub(pushed, "exposed_comm", r) - _sub(plain, "exposed_comm", r) == 2000
        assert _sub(pushed, "useful", r) == _sub(plain, "useful", r)  # compute-bound: the floor is untouched
        assert _sub(pushed, "compute_inefficiency", r) == _sub(plain, "compute_inefficiency", r) - 2000
    w = pushed.windows.set_index(["repetition", "iteration"])["window_ns"]
    sums = pushed.parts.groupby(["repetition", "iteration", "rank"])["ns"].sum()
    assert all(sums[k] == w[k[:2]] for k in sums.index)  # the invariant, to the ns
    assert not any("in-kernel" in c for c in pushed.caveats)


def test_fused_kernels_missing_records_are_named():
    case = synthetic_bundle(variant="fused", flag_wait_ns=3000)
    ev = case.bundle.events
    drop = (ev["kind"] == "record") & (ev["rank"] == 1)
    case.bundle.events = ev[~drop].reset_index(drop=True)
    led = compute_ledger(case.bundle, case.hardware)
    assert any("have no in-kernel records" in c for c in led.caveats)
    assert _sub(led, "flag_wait", 1) == 0 and _sub(led, "flag_wait", 0) == 3000


def test_records_of_a_concurrent_kernel_are_not_the_fused_kernels():
    """A copy kernel on a side stream records store_push while the fused GEMM runs: those records
    carry the copy kernel's name and must not become the GEMM's exposed communication."""
    case = synthetic_bundle(variant="fused", flag_wait_ns=3000)
    plain = compute_ledger(case.bundle, case.hardware)
    ev = case.bundle.events
    waits = ev[(ev["kind"] == "record") & (ev["phase"] == "flag_wait")]
    foreign = waits.assign(name="copy_blocks_kernel", phase="store_push", cta=waits["cta"] + 1000)
    case.bundle.events = schema.normalize_events(pd.concat([ev, foreign], ignore_index=True))
    led = compute_ledger(case.bundle, case.hardware)
    for r in (0, 1):
        assert _sub(led, "exposed_comm", r) == _sub(plain, "exposed_comm", r)
        assert _sub(led, "flag_wait", r) == _sub(plain, "flag_wait", r) == 3000


def test_a_tail_where_only_waiting_ctas_run_is_flag_wait():
    """One CTA waits for a late peer after every other CTA finished: the kernel did nothing but
    wait for that long, although the average CTA waited only a fraction of it."""
    case = synthetic_bundle(variant="fused")
    ev = case.bundle.events
    kern = ev[(ev["kind"] == "kernel") & (ev["role"] == "fused")]
    recs = []
    for k in kern.itertuples(index=False):
        for cta in range(8):
            recs.append({"rank": k.rank, "device": k.device, "stream": k.stream, "kind": "record", "role": "fused",
                         "name": k.name, "start_ns": k.start_ns + 100, "end_ns": k.end_ns - 5000, "repetition": k.repetition,
                         "iteration": k.iteration, "cta": cta, "phase": "compute"})
        recs.append({**recs[-8], "start_ns": k.end_ns - 5000, "end_ns": k.end_ns - 10, "phase": "flag_wait"})
    case.bundle.events = schema.normalize_events(pd.concat([ev[ev["kind"] != "record"], pd.DataFrame(recs)],
                                                           ignore_index=True))
    led = compute_ledger(case.bundle, case.hardware)
    for r in (0, 1):
        assert _sub(led, "flag_wait", r) == 4990  # not 4990 / 8


# --- end to end on CPU ranks --------------------------------------------------------------------


@pytest.fixture(scope="module")
def instrumented_bundle(tmp_path_factory):
    from taxmodel.cli import cli

    out = tmp_path_factory.mktemp("prof")
    res = CliRunner().invoke(cli, ["profile", "flash_decode", "--device", "cpu", "--variants", "fused", "--instrument",
                                   "--iterations", "3", "--warmup", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out / "flash_decode"


@pytest.mark.slow
def test_profile_instrument_then_analyze_shows_flag_wait(instrumented_bundle):
    from taxmodel.cli import cli
    from taxmodel.trace.bundle import load_bundle as read_bundle

    (path,) = [p for p in instrumented_bundle.iterdir() if p.is_dir()]
    b = read_bundle(path)
    ev = b.events
    rec = ev[ev["kind"] == "record"]
    assert b.meta["capture"]["instrument"] is True
    assert b.meta["records"]["records"] == len(rec) > 0 and b.meta["records"]["unmatched"] == 0
    assert set(rec["phase"]) == {"compute", "combine", "store_push", "flag_wait"}
    kern = ev[(ev["kind"] == "kernel") & (ev["name"] == "flash_decode_fused")]
    spans = kern.groupby(["rank", "iteration"]).agg(s=("start_ns", "min"), e=("end_ns", "max"))
    joined = rec.join(spans, on=["rank", "iteration"])
    assert ((joined["start_ns"] >= joined["s"]) & (joined["end_ns"] <= joined["e"])).all()
    for _, g in rec.groupby(["rank", "iteration", "cta"]):
        g = g.sort_values("start_ns")
        assert (g["start_ns"].to_numpy()[1:] >= g["end_ns"].to_numpy()[:-1]).all()
    led = compute_ledger(b)
    assert led.parts.loc[led.parts["subcategory"] == "flag_wait", "ns"].sum() > 0
    assert led.parts.loc[led.parts["subcategory"] == "exposed_comm", "ns"].sum() > 0  # the pushes
    assert not any("in-kernel" in c for c in led.caveats)
    res = CliRunner().invoke(cli, ["analyze", str(instrumented_bundle)])
    assert res.exit_code == 0, res.output
    assert "Flag wait" in res.output and "without in-kernel trace records" not in res.output


@pytest.mark.slow
def test_per_cta_figure_renders(instrumented_bundle):
    from taxmodel.report import figures
    from taxmodel.trace.bundle import load_bundle as read_bundle

    (path,) = [p for p in instrumented_bundle.iterdir() if p.is_dir()]
    fig = figures.cta_timeline(read_bundle(path), rank=0)
    assert len(fig.axes) >= 2 and len(fig.axes[0].patches) > 0
