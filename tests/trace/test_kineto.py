"""The Kineto importer: exact times, kinds, roles, iterations, collectives, meta -- on the real
H200 traces, on built traces with known contents, and on CPU traces from torch.profiler."""
from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kineto_fixtures import REAL_PEER_READ, REAL_RANKS, build_trace, write_ranks, write_trace
from taxmodel.errors import InputError
from taxmodel.trace import importers, json_stream, kineto, schema
from taxmodel.trace.bundle import load_bundle


# --- the real 4-rank H200 traces ------------------------------------------------------------------


def _reference_gpu_rows(path: Path) -> list[tuple[str, int, int, int]]:
    """(name, start_ns, dur_ns, correlation) of every kernel/memset/memcpy, parsed independently
    with Decimal (exact) from the raw JSON."""
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    rows = []
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"):
            rows.append((e["name"], int(Decimal(e["ts"]) * 1000), int(Decimal(e["dur"]) * 1000), e["args"]["correlation"]))
    return sorted(rows, key=lambda r: (r[1], r[3]))


@pytest.fixture(scope="module")
def real_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("real") / "bundle"
    bundle, fmt = importers.import_bundle(REAL_RANKS, out)
    assert fmt == "kineto"
    return bundle


def test_real_traces_give_a_four_rank_bundle(real_bundle):
    assert real_bundle.ranks == [0, 1, 2, 3]
    assert real_bundle.world_size == 4
    assert real_bundle.meta["source"] == "kineto"
    assert sorted(p.name for p in (real_bundle.path / "raw").iterdir()) == sorted(p.name for p in REAL_RANKS)


def test_real_kernel_counts_and_durations_match_the_json_exactly(real_bundle):
    ev = real_bundle.events
    for rank, path in enumerate(REAL_RANKS):
        ref = _reference_gpu_rows(path)
        got = ev[(ev["rank"] == rank) & ev["kind"].isin(schema.GPU_KINDS)].sort_values(["start_ns", "correlation"])
        assert len(got) == len(ref)
        ref_kernels = [r for r in ref if not r[0].startswith("Memset")]
        assert int((got["kind"] == "kernel").sum()) == len(ref_kernels)
        assert list(got["name"]) == [r[0] for r in ref]
        assert list(got["start_ns"]) == [r[1] for r in ref]
        assert list(got["end_ns"] - got["start_ns"]) == [r[2] for r in ref]
        assert list(got["correlation"]) == [r[3] for r in ref]
    # Spot check one value by hand: rank 0's first GEMM is ts 4440860101478.072, dur 684.894 us.
    first = ev[(ev["rank"] == 0) & (ev["correlation"] == 53) & (ev["kind"] == "kernel")].iloc[0]
    assert (first["start_ns"], first["end_ns"]) == (4440860101478072, 4440860101478072 + 684894)


def test_real_iterations_collectives_and_roles(real_bundle):
    ev = real_bundle.events
    gpu = ev[ev["kind"].isin(schema.GPU_KINDS)]
    # Steps 2..6 on every rank; the warm-up GEMM and memset enqueued before profiling are outside.
    for rank in range(4):
        its = gpu.loc[gpu["rank"] == rank, "iteration"]
        assert sorted(set(its) - {-1}) == [2, 3, 4, 5, 6]
        assert (its.value_counts().drop(-1, errors="ignore") == 3).all()  # nccl + memset + gemm per step
    nccl = gpu[gpu["name"].str.startswith("ncclDevKernel")]
    assert set(nccl["role"]) == {"comm"} and set(nccl["collective_op"]) == {"allgather"}
    assert len(nccl) == 20
    # collective ids match across ranks: each id appears once on every rank, in the same iteration
    per_id = nccl.groupby("collective_id").agg(ranks=("rank", "nunique"), n=("rank", "size"), it=("iteration", "nunique"))
    assert list(per_id.index) == ["0:0", "0:1", "0:2", "0:3", "0:4"]
    assert (per_id["ranks"] == 4).all() and (per_id["n"] == 4).all() and (per_id["it"] == 1).all()
    assert set(nccl["bytes"]) == {33554432 * 2}  # Out msg nelems x bf16
    assert set(gpu.loc[gpu["name"].str.startswith("nvjet"), "role"]) == {"compute"}
    assert set(gpu.loc[gpu["kind"] == "memset", "role"]) == {"copy"}
    assert set(gpu.loc[gpu["name"].str.startswith("nvjet"), "grid"]) == {"2,66,1"}
    launches = ev[ev["kind"] == "launch"]
    assert set(launches["name"]) == {"cuLaunchKernelEx", "cudaMemsetAsync"}
    assert set(ev.loc[ev["kind"] == "sync", "name"]) == {"cudaDeviceSynchronize"}


def test_real_meta(real_bundle):
    meta = real_bundle.meta
    hw = meta["hardware"]
    assert hw["name"] == "NVIDIA H200" and hw["num_sms"] == 132 and hw["memory_bytes"] == 150109880320
    assert hw["compute_capability"] == "9.0" and hw["vendor"] == "nvidia"
    assert meta["software"]["nccl"] == "2.28.9"
    assert meta["software"]["cuda_runtime"] == "13.0"
    assert [i["rank_source"] for i in meta["inputs"]] == ["distributedInfo"] * 4


def test_single_rank_of_a_run_needs_allow_missing_ranks(tmp_path):
    with pytest.raises(InputError, match=r"ranks \{1, 2, 3\} of world size 4 are missing"):
        importers.import_traces([REAL_PEER_READ])
    events, meta, _ = importers.import_traces([REAL_PEER_READ], allow_missing_ranks=True)
    assert meta["world_size"] == 4 and meta["ranks"] == [0]
    assert any("missing" in n for n in meta["notes"])
    assert "read_peer_kernel" in set(events["name"])


# --- exact time conversion -----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-(10**17), max_value=10**17), st.integers(min_value=0, max_value=6))
def test_to_ns_is_exact_for_decimal_text(ns_times_1000, extra_digits):
    # a decimal with 3 + extra_digits fraction digits, rounded half-even to ns like Decimal
    text = str(Decimal(ns_times_1000).scaleb(-(3 + extra_digits)))
    want = int((Decimal(text) * 1000).to_integral_value())
    assert kineto._to_ns(text) == want


def test_to_ns_cases():
    assert kineto._to_ns("4440859589094.303") == 4440859589094303
    assert kineto._to_ns("0.7") == 700
    assert kineto._to_ns("-0.5") == -500
    assert kineto._to_ns(12) == 12000
    assert kineto._to_ns("1.5e3") == 1500000
    assert kineto._to_ns("0.0005") == 0 and kineto._to_ns("0.0015") == 2  # half even
    for bad in (None, "abc", [], {}, True, "1e999999999", float("nan")):
        assert kineto._to_ns(bad) is None


def _top_level(path: Path) -> dict:
    """The top-level values of a JSON document as the importer's stream reads them."""
    stream = json_stream.TraceStream(path)
    assert list(stream.batches()) == []
    return stream.top


def test_float_parsing_would_lose_the_digits_this_keeps(tmp_path):
    # The reason for the exact parser: these two values differ by 1 ns and floats merge them.
    p = tmp_path / "t.json"
    p.write_text('{"a": 4440859589094.3031, "b": 4440859589094.3029}')
    doc = _top_level(p)
    assert kineto._to_ns(doc["a"]) == 4440859589094303 and kineto._to_ns(doc["b"]) == 4440859589094303
    p.write_text('{"a": 9007199254740.993, "b": 9007199254740.992}')
    doc = _top_level(p)
    assert kineto._to_ns(doc["a"]) - kineto._to_ns(doc["b"]) == 1
    assert round(9007199254740.993 * 1000) - round(9007199254740.992 * 1000) != 1


# --- built traces with known contents -------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_built_trace_rows_match_what_was_written(tmp_path, gz):
    paths, expected = write_ranks(tmp_path, world_size=2, gz=gz)
    events, meta, fmt = importers.import_traces(paths)
    assert fmt == "kineto" and meta["world_size"] == 2 and meta["ranks"] == [0, 1]
    for rank, exp in enumerate(expected):
        ev = events[events["rank"] == rank]
        kern = ev[ev["kind"] == "kernel"].sort_values("start_ns")
        want = sorted(exp.kernels, key=lambda k: k["start_ns"])
        assert list(kern["name"]) == [k["name"] for k in want]
        assert list(kern["start_ns"]) == [k["start_ns"] for k in want]
        assert list(kern["end_ns"]) == [k["end_ns"] for k in want]
        assert list(kern["iteration"]) == [k["iteration"] for k in want]
        assert list(kern["role"]) == [k["role"] for k in want]
        comm = [k for k in want if k["role"] == "comm"]
        got_comm = kern[kern["role"] == "comm"]
        assert list(got_comm["collective_id"]) == [k["collective_id"] for k in comm]
        assert list(got_comm["bytes"]) == [k["bytes"] for k in comm]
        assert set(got_comm["collective_op"]) == {"allgather"}
        assert (ev["kind"] == "launch").sum() == exp.launches
        assert (ev["kind"] == "sync").sum() == exp.syncs
        assert set(ev.loc[ev["kind"] == "marker", "name"]) == {"ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"}
        memcpy = ev[ev["kind"] == "memcpy"]
        assert set(memcpy["role"]) == {"copy"} and set(memcpy["bytes"]) == {4096}
        assert set(memcpy["iteration"]) == {1, 2, 3}
        # launches carry their step too; the launch -> kernel correlation is intact
        launches = ev[ev["kind"] == "launch"]
        assert set(launches["iteration"]) == {1, 2, 3}
        assert set(launches["correlation"]) == set(ev.loc[ev["kind"].isin(schema.GPU_KINDS) & (ev["iteration"] >= 0), "correlation"])
        assert "cudaEventRecord" not in set(ev["name"])
        assert set(ev.loc[ev["kind"] != "kernel", "device"]) <= {-1, 0}
    assert meta["software"] == {"cuda_runtime": "12.8", "cuda_driver": "13.0", "cupti": "130001", "nccl": "2.21.5",
                                "distributed_backend": "nccl"}


def test_sequence_numbers_are_used_where_recorded(tmp_path):
    paths, _ = write_ranks(tmp_path, seq=True, pg="7")
    events, _, _ = importers.import_traces(paths)
    ids = events.loc[events["role"] == "comm", "collective_id"]
    assert sorted(set(ids)) == ["7:100", "7:101", "7:102"]


def test_graph_ids(tmp_path):
    paths, _ = write_ranks(tmp_path, graph=True)
    events, _, _ = importers.import_traces(paths)
    gemm = events[events["name"] == "gemm_kernel"]
    assert set(gemm["graph_id"]) == {42}
    assert set(events.loc[events["name"] != "gemm_kernel", "graph_id"]) == {-1}


def test_graph_launch_without_graph_id_groups_by_launch(tmp_path):
    doc, _ = build_trace(0, 1)
    for e in doc["traceEvents"]:
        if e.get("name") == "cudaLaunchKernel":
            e["name"] = "cudaGraphLaunch"
    events, _, _ = importers.import_traces([write_trace(tmp_path / "g.json", doc)])
    gemm = events[events["name"] == "gemm_kernel"]
    assert (gemm.loc[gemm["iteration"] >= 0, "graph_id"] == gemm.loc[gemm["iteration"] >= 0, "correlation"]).all()
    assert set(events.loc[events["kind"] == "launch", "name"]) == {"cudaGraphLaunch", "cuLaunchKernelEx", "cudaMemcpyAsync"}


def test_gpu_side_range_is_the_fallback_when_the_launch_is_missing(tmp_path):
    doc, exp = build_trace(0, 1)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "cudaLaunchKernel"]
    events, _, _ = importers.import_traces([write_trace(tmp_path / "t.json", doc)])
    gemm = events[events["name"] == "gemm_kernel"].sort_values("start_ns")
    assert list(gemm["iteration"]) == [1, 2, 3]  # from the gpu_user_annotation ProfilerStep ranges
    assert events.loc[events["name"] == "warmup_kernel", "iteration"].item() == -1


def test_custom_iteration_pattern(tmp_path):
    doc, _ = build_trace(0, 1)
    for e in doc["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = "decode_step_" + e["name"].split("#")[1] + "0"
    path = write_trace(tmp_path / "t.json", doc)
    events, meta, _ = importers.import_traces([path])
    assert set(events["iteration"]) == {-1}
    assert any("no iteration markers" in n for n in meta["notes"])
    events, meta, _ = importers.import_traces([path], iteration_pattern=r"decode_step_(\d+)")
    assert list(events.loc[events["name"] == "gemm_kernel", "iteration"]) == [10, 20, 30]
    assert meta["capture"]["iteration_pattern"] == r"decode_step_(\d+)"


def test_tolerates_what_other_exporters_and_versions_do(tmp_path):
    """Strings for pid/tid, unknown categories, other phases, capitalized 'Kernel', missing
    optional fields, HIP names, no distributedInfo, Chrome's bare-array format."""
    docs = []
    for r in range(2):
        doc, _ = build_trace(r, 2, distributed=False)
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel" and e["name"] == "gemm_kernel":
                e["cat"] = "Kernel"
                e["pid"], e["tid"] = "0", "stream 7"
                del e["args"]["grid"], e["args"]["stream"]
            if e.get("name") == "cudaLaunchKernel":
                e["name"] = "hipLaunchKernel"
        doc["traceEvents"] += [
            {"ph": "X", "cat": "mystery_category", "name": "x", "pid": 1, "tid": 1, "ts": 5.0, "dur": 1.0},
            {"ph": "B", "cat": "kernel", "name": "begin_only", "pid": 0, "tid": 7, "ts": 5.0},
            {"ph": "C", "name": "counter", "pid": 0, "ts": 5.0, "args": {"v": 1}},
            "not an event", 17, None,
        ]
        del doc["deviceProperties"]
        docs.append(doc)
    p0 = write_trace(tmp_path / "a.json", docs[0])
    p1 = write_trace(tmp_path / "b.json", docs[1]["traceEvents"])  # bare array
    events, meta, _ = importers.import_traces([p0, p1])
    assert meta["ranks"] == [0, 1]
    assert [i["rank_source"] for i in meta["inputs"]] == ["file order", "file order"]
    assert any("order given" in n for n in meta["notes"])
    gemm = events[events["name"] == "gemm_kernel"]
    assert len(gemm) == 6 and set(gemm["stream"]) == {7} and set(gemm["device"]) == {0} and set(gemm["grid"]) == {""}
    assert set(events.loc[events["name"] == "hipLaunchKernel", "kind"]) == {"launch"}
    assert "begin_only" not in set(events["name"]) and "x" not in set(events["name"])
    assert meta["hardware"] == {}


def test_rank_recorded_by_some_files_only_is_an_error(tmp_path):
    a, _ = build_trace(0, 2)
    b, _ = build_trace(1, 2, distributed=False)
    paths = [write_trace(tmp_path / "a.json", a), write_trace(tmp_path / "b.json", b)]
    with pytest.raises(InputError, match=r"b\.json: the trace records no rank"):
        importers.import_traces(paths)


def test_normalize_collective():
    cases = {"_allgather_base": "allgather", "allgather_into_tensor_coalesced": "allgather", "all_gather": "allgather",
             "allreduce": "allreduce", "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor_coalesced":
             "reduce_scatter", "ReduceScatter": "reduce_scatter", "broadcast": "broadcast", "alltoall_base": "alltoall",
             "all_to_all": "alltoall", "send": "send", "recv": "recv", "SendRecv": "sendrecv", "reduce": "reduce",
             "AllReduce": "allreduce", "barrier": "barrier"}
    for name, want in cases.items():
        assert kineto.normalize_collective(name) == want, name


def test_sniff():
    assert kineto.sniff(Path("x"), b'{\n  "schemaVersion": 1,\n  "traceEvents": [', set())
    assert kineto.sniff(Path("x"), b'[{"ph": "X", "cat": "cuda_runtime"', set())
    assert not kineto.sniff(Path("x"), b'{"traceEvents": [{"ph": "X", "name": "a"}]}', set())  # a generic Chrome trace
    assert not kineto.sniff(Path("x"), b"SQLite format 3\x00", set())
    assert not kineto.sniff(Path("x"), b"Kernel_Name,Start_Timestamp\n", set())


# --- CPU traces from torch.profiler (what any PyTorch user without a GPU here produces) --------------


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    path = tmp_path_factory.mktemp("cpu") / "cpu_trace.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2, repeat=1)) as prof:
        for _ in range(4):
            a = torch.randn(32, 32)
            with record_function("my_region"):
                (a @ a).sum()
            prof.step()
    prof.export_chrome_trace(str(path))
    return path


def test_cpu_trace_parses(cpu_trace):
    assert importers.detect_format(cpu_trace) == "kineto"
    events, meta = kineto.read([cpu_trace])
    markers = events[events["kind"] == "marker"]
    steps = markers[markers["name"].str.startswith("ProfilerStep#")]
    assert len(steps) == 2 and (steps["iteration"] >= 0).all()
    assert set(steps["iteration"]) == {int(n.split("#")[1]) for n in steps["name"]}
    region = markers[markers["name"] == "my_region"]
    assert len(region) == 2 and set(region["iteration"]) == set(steps["iteration"])
    assert not events["kind"].isin(schema.GPU_KINDS).any()
    assert meta["ranks"] == [0] and meta["hardware"] == {}


def test_cpu_trace_import_says_there_are_no_gpu_events(cpu_trace, tmp_path):
    with pytest.raises(InputError) as err:
        importers.import_bundle([cpu_trace], tmp_path / "b")
    msg = str(err.value)
    assert msg.startswith(str(cpu_trace)) and "no GPU events" in msg and "ProfilerActivity.CUDA" in msg
    assert not (tmp_path / "b").exists()


def test_written_bundle_round_trips_the_import(tmp_path):
    paths, _ = write_ranks(tmp_path)
    events, meta, _ = importers.import_traces(paths)
    bundle, _ = importers.import_bundle(paths, tmp_path / "out", keep_raw=False)
    assert not (tmp_path / "out" / "raw").exists()
    loaded = load_bundle(tmp_path / "out")
    assert loaded.events.equals(bundle.events)
    np.testing.assert_array_equal(loaded.events["start_ns"].to_numpy(), events["start_ns"].to_numpy())
    assert loaded.meta["inputs"] == meta["inputs"]


def test_collective_enqueued_before_profiling_does_not_shift_the_numbering(tmp_path):
    docs = [build_trace(r, 2)[0] for r in range(2)]
    first = min((e for e in docs[0]["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"]),
                key=lambda e: e["ts"])
    early = json.loads(json.dumps(first))
    early["ts"] = first["ts"] - 200.0  # on the GPU before the profiled steps; its launch is not in the trace
    early["args"]["correlation"] = 2
    docs[0]["traceEvents"].append(early)
    paths = [write_trace(tmp_path / f"r{r}.json", d) for r, d in enumerate(docs)]
    events, _, _ = importers.import_traces(paths)
    comm = events[events["role"] == "comm"].sort_values("start_ns")
    assert list(comm.loc[comm["rank"] == 0, "collective_id"]) == ["0:-1", "0:0", "0:1", "0:2"]
    assert list(comm.loc[comm["rank"] == 1, "collective_id"]) == ["0:0", "0:1", "0:2"]
