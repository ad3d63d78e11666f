"""A gap before work queued behind another stream's event is stream_wait, not kernel_gap
(taxmodel/ledger/stream_waits.py), and a real trace's stream waits are imported."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from taxmodel.ledger.compute import compute_ledger
from taxmodel.ledger.stream_waits import gap_keys, split_gap_keys
from taxmodel.trace import importers, schema
from taxmodel.trace.bundle import Bundle, make_meta

THIRDPARTY = Path(__file__).resolve().parents[1] / "data" / "thirdparty"


def _bundle(with_wait: bool) -> Bundle:
    """One rank, one iteration: kernel A on stream 1 [0, 100) ns; kernel B on stream 2
    [500, 600), launched (and, optionally, made to wait on stream 1's event) before A ran."""
    rows = [
        dict(kind="marker", name="ProfilerStep#0", stream=-1, start_ns=-100, end_ns=700, correlation=-1),
        dict(kind="launch", name="cudaLaunchKernel", stream=-1, start_ns=-60, end_ns=-55, correlation=1),
        dict(kind="launch", name="cudaLaunchKernel", stream=-1, start_ns=-45, end_ns=-40, correlation=2),
        dict(kind="kernel", name="A", stream=1, start_ns=0, end_ns=100, correlation=1, role="compute"),
        dict(kind="kernel", name="B", stream=2, start_ns=500, end_ns=600, correlation=2, role="compute"),
    ]
    if with_wait:
        rows.append(dict(kind="wait", name="Stream Wait Event", stream=2, start_ns=-50, end_ns=-48, correlation=3))
    ev = pd.DataFrame(rows).assign(rank=0, device=0, iteration=0, repetition=0)
    ev["role"] = ev["role"].fillna("other")
    return Bundle(schema.normalize_events(ev), make_meta(world_size=1, ranks=[0]))


def _ns(led, sub: str) -> int:
    return int(led.parts.loc[led.parts["subcategory"] == sub, "ns"].sum())


def test_gap_behind_a_cross_stream_wait_is_stream_wait():
    led = compute_ledger(_bundle(with_wait=True))
    assert _ns(led, "stream_wait") == 400 and _ns(led, "kernel_gap") == 0
    assert int(led.parts["ns"].sum()) == int(led.windows["window_ns"].sum())


def test_the_same_gap_without_the_wait_is_kernel_gap():
    led = compute_ledger(_bundle(with_wait=False))
    assert _ns(led, "kernel_gap") == 400 and _ns(led, "stream_wait") == 0


def test_keys_keep_order_and_sentinels():
    unknown = np.iinfo(np.int64).max - 1
    launch = np.array([-7, 0, 5, unknown, np.iinfo(np.int64).max], np.int64)
    gated = np.array([True, False, True, True, False])
    keys = gap_keys(launch, gated, unknown)
    back, flag = split_gap_keys(keys, unknown)
    assert back.tolist() == launch.tolist() and flag.tolist() == [True, False, True, False, False]
    assert (np.diff(keys[:3]) > 0).all()


def test_a_real_trace_s_stream_wait_is_imported_on_the_waiting_stream():
    """HTA's two-stream A100 trace: one cudaStreamWaitEvent (stream 24 waits on stream 20).
    The work behind it was launched 19 ms later, so its gap stays host_starved."""
    events, _, _ = importers.import_traces([THIRDPARTY / "hta" / "a100_event_sync_multi_stream.json.gz"])
    waits = events[events["kind"] == "wait"]
    assert waits["stream"].tolist() == [24] and waits["correlation"].tolist() == [1389]


def test_a_real_trace_s_gap_behind_a_stream_wait_is_not_launch_overhead():
    """HTA's AlexNet trace on an A100 (two streams, cudaStreamWaitEvent between them): the idle
    gaps that end at work queued behind a wait on its stream are stream_wait, and that work's
    stream did receive a wait after its previous launch."""
    events, meta, _ = importers.import_traces([THIRDPARTY / "hta" / "a100_alexnet_no_steps.json.gz"])
    b = Bundle(schema.normalize_events(events), make_meta(**meta))
    led = compute_ledger(b)
    waits = led.intervals[led.intervals["subcategory"] == "stream_wait"]
    assert len(waits) >= 1 and _ns(led, "stream_wait") > 0
    ev = b.events
    gpu = ev[ev["kind"].isin(["kernel", "memcpy", "memset"])].sort_values("start_ns")
    launch_end = ev[ev["kind"] == "launch"].set_index("correlation")["end_ns"]
    for end in waits["end_ns"]:
        nxt = gpu[gpu["start_ns"] >= end].iloc[0]
        same = gpu[(gpu["stream"] == nxt["stream"]) & (gpu["start_ns"] < nxt["start_ns"])]
        before = launch_end.get(same.iloc[-1]["correlation"], -1) if len(same) else -1
        on_stream = ev[(ev["kind"] == "wait") & (ev["stream"] == nxt["stream"])]["start_ns"]
        assert ((on_stream > before) & (on_stream <= launch_end[nxt["correlation"]])).any()
