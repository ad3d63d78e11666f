"""Kernel -> launch -> innermost op with shapes (trace/kineto_ops.py), on a hand-made Kineto trace."""
from __future__ import annotations

import json

from taxmodel.trace import kineto

BF = "c10::BFloat16"


def _op(name, ts, dur, tid=1, dims=None, types=None):
    args = {} if dims is None else {"Input Dims": dims, "Input type": types, "Concrete Inputs": [""] * len(dims)}
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _launch(ts, corr, tid=1, name="cudaLaunchKernel"):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 2, "args": {"correlation": corr}}


def _kernel(name, ts, dur, corr):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": 7, "correlation": corr}}


def _read(tmp_path, events):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events,
                                "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}]}))
    ev, meta = kineto.read([path])
    return ev[ev["kind"] == "kernel"].set_index("name"), meta


def test_innermost_op_with_shapes_and_shared_floor(tmp_path):
    mm = [[64, 32], [32, 16]]
    events = [
        _op("ProfilerStep#1", 0, 1000),
        _op("aten::linear", 10, 200, dims=[[64, 32], [16, 32], []], types=[BF, BF, ""]),
        _op("aten::t", 12, 3, dims=[[16, 32]], types=[BF]),  # a sibling that ended before the launch
        _op("aten::mm", 20, 100, dims=mm, types=[BF, BF]),
        _op("no_shapes_helper", 30, 20),  # innermost, but without shapes: skipped
        _launch(35, 1), _launch(60, 2), _launch(150, 3),  # 1, 2 under aten::mm; 3 under aten::linear only
        _launch(40, 4, tid=2),  # another thread: no op there
        _kernel("gemm_main", 300, 30, 1), _kernel("gemm_reduce", 330, 10, 2), _kernel("bias", 350, 5, 3),
        _kernel("orphan", 400, 5, 4),
    ]
    k, meta = _read(tmp_path, events)
    assert k.loc["gemm_main", "op"] == "aten::mm" and k.loc["gemm_reduce", "op"] == "aten::mm"
    # the op's 2*64*16*32 flops and 7168 bytes split 30:10 by duration
    assert k.loc["gemm_main", "flops"] == 49152 and k.loc["gemm_reduce", "flops"] == 16384
    assert k.loc["gemm_main", "floor_bytes"] == 5376 and k.loc["gemm_reduce", "floor_bytes"] == 1792
    assert k.loc["gemm_main", "dtype"] == "bf16"
    assert k.loc["bias", "op"] == "aten::linear" and k.loc["bias", "flops"] == 2 * 64 * 16 * 32
    assert k.loc["orphan", "op"] == "" and k.loc["orphan", "uncosted"] == "no enclosing op with shapes"
    assert meta["capture"]["profiler"]["record_shapes"] is True


def test_a_trace_without_shapes_imports_and_says_why(tmp_path):
    events = [_op("ProfilerStep#1", 0, 1000), _op("aten::mm", 20, 100), _launch(35, 1), _kernel("gemm", 300, 30, 1)]
    k, meta = _read(tmp_path, events)
    assert k.loc["gemm", "op"] == "aten::mm"  # still linked, by name
    assert "record_shapes=True" in k.loc["gemm", "uncosted"] and k.loc["gemm", "flops"] == -1
    assert meta["capture"]["profiler"]["record_shapes"] is False


def test_graph_replay_kernels_are_uncosted(tmp_path):
    events = [_op("ProfilerStep#1", 0, 1000), _op("aten::mm", 20, 100, dims=[[4, 4], [4, 4]], types=[BF, BF]),
              _launch(30, 9, name="cudaGraphLaunch"), _kernel("g0", 300, 30, 9), _kernel("g1", 340, 30, 9)]
    k, _ = _read(tmp_path, events)
    assert k["uncosted"].str.contains("CUDA graph replay").all() and (k["op"] == "").all()


def test_an_op_calls_kernels_carry_its_whole_work_and_its_id(tmp_path):
    """Three kernels under one aten::mm of 2*8*8*8 = 1024 flops and 384 bytes, timed 10:10:10 us:
    shares of 341.33 each, in integers that add up to the op's exactly; one op_id for the three."""
    events = [_op("ProfilerStep#1", 0, 1000), _op("aten::mm", 20, 100, dims=[[8, 8], [8, 8]], types=[BF, BF]),
              _launch(30, 1), _launch(40, 2), _launch(50, 3), _op("aten::add", 200, 50, dims=[[8], [8]], types=[BF, BF]),
              _launch(210, 4),
              _kernel("a", 300, 10, 1), _kernel("b", 320, 10, 2), _kernel("c", 340, 10, 3), _kernel("d", 360, 5, 4)]
    k, _ = _read(tmp_path, events)
    mm = k.loc[["a", "b", "c"]]
    assert mm["flops"].sum() == 1024 and sorted(mm["flops"]) == [341, 341, 342]
    assert mm["floor_bytes"].sum() == 384 and mm["op_id"].nunique() == 1
    assert k.loc["d", "op_id"] not in set(mm["op_id"]) and k.loc["d", "op_id"] >= 0
