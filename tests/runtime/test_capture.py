"""CPU capture: record_function ranges and gloo collectives become kernel rows; roles, iterations."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch.profiler import record_function

from taxmodel.errors import InputError, UnavailableError
from taxmodel.runtime.context import RankContext
from taxmodel.runtime.inject import INJECTED_ROLES, Injection
from taxmodel.runtime.worker import check_output
from taxmodel.trace import schema
from taxmodel.trace.capture import (TorchTracer, assign_roles, emulated_gpu_rows, finish_events, get_tracer,
                                    renumber_iterations)


def _marker(rank, name, start, end, iteration=-1, stream=7):
    return {"rank": rank, "device": -1, "stream": stream, "kind": "marker", "role": "other", "name": name,
            "start_ns": start, "end_ns": end, "iteration": iteration, "collective_id": "", "collective_op": ""}


def test_emulated_rows_from_ranges():
    rows = []
    for rank in (0, 1):
        rows += [
            _marker(rank, "gloo:barrier", 0, 5),  # harness barrier, outside iterations
            _marker(rank, "ProfilerStep#3", 10, 100, 3),
            _marker(rank, "kernel::gemm", 20, 40, 3),
            _marker(rank, "gloo:all_gather", 12 + rank, 30, 3, stream=9),
            _marker(rank, "kernel::combine", 50, 50, 3),  # zero length: still one ns
        ]
    out = emulated_gpu_rows(pd.DataFrame(rows))
    k = out[out["kind"] == "kernel"].sort_values(["rank", "start_ns"])
    assert k["name"].tolist() == ["gloo:barrier", "gloo:all_gather", "gemm", "combine"] * 2
    assert k["stream"].tolist() == [1, 1, 0, 0] * 2
    assert k["device"].tolist() == [0] * 4 + [1] * 4
    assert k["collective_op"].tolist() == ["barrier", "allgather", "", ""] * 2
    assert k["collective_id"].tolist() == ["0:0", "0:1", "", ""] * 2
    assert k["role"].tolist() == ["comm", "comm", "other", "other"] * 2
    combine = k[k["name"] == "combine"]
    assert (combine["end_ns"] - combine["start_ns"]).tolist() == [1, 1]
    # The ProfilerStep range stays a marker.
    assert out[out["kind"] == "marker"]["name"].tolist() == ["ProfilerStep#3", "ProfilerStep#3"]


def test_roles_from_variant_patterns_keep_comm():
    ev = pd.DataFrame([
        {"kind": "kernel", "name": "gemm_kernel", "role": "compute"},
        {"kind": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "role": "comm"},
        {"kind": "kernel", "name": "push_fused", "role": "compute"},
        {"kind": "kernel", "name": "spin_kernel(long)", "role": "compute"},
        {"kind": "memcpy", "name": "Memcpy DtoD", "role": "copy"},
        {"kind": "launch", "name": "cudaLaunchKernel", "role": "other"},
    ])
    roles = {**INJECTED_ROLES, r"push": "fused", r"gemm": "compute"}
    out = assign_roles(ev, roles)
    assert out["role"].tolist() == ["compute", "comm", "fused", "other", "copy", "other"]
    # An explicit pattern may re-label even a NCCL kernel.
    assert assign_roles(ev, {"nccl": "fused"})["role"].tolist()[1] == "fused"


def test_renumber_iterations_per_repetition():
    ev = pd.DataFrame({"repetition": [0, 0, 0, 1, 1, 1], "iteration": [7, 9, -1, 12, 12, 13]})
    assert renumber_iterations(ev)["iteration"].tolist() == [0, 1, -1, 0, 0, 1]


def test_torch_tracer_cpu_round_trip(tmp_path):
    """A real torch.profiler session of kernel:: ranges in ProfilerStep ranges -> schema rows."""
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    x = torch.randn(64, 64)
    per_rep = []
    for rep in range(2):
        tracer = TorchTracer(torch.device("cpu"))
        with tracer:
            for it in range(3):
                with record_function(f"ProfilerStep#{it + 10}"):
                    with ctx.kernel("matmul"):
                        y = x @ x
                    with ctx.kernel("relu"):
                        y.relu_()
        path = tmp_path / f"rank0.rep{rep}{tracer.file_suffix}"
        path.write_bytes(tracer.export())
        events, meta = TorchTracer.read([path])
        per_rep.append(events)
    events = finish_events(per_rep, {"matmul": "compute", "relu": "compute"}, emulated=True)
    events = schema.normalize_events(events)
    schema.validate_events(events)
    k = events[events["kind"] == "kernel"].sort_values(["repetition", "start_ns"])
    assert k["name"].tolist() == ["matmul", "relu"] * 6
    assert k["repetition"].tolist() == [0] * 6 + [1] * 6
    assert k["iteration"].tolist() == [0, 0, 1, 1, 2, 2] * 2
    assert set(k["role"]) == {"compute"} and set(k["device"]) == {0} and set(k["stream"]) == {0}
    assert (k["end_ns"] > k["start_ns"]).all()
    # Kernels of one iteration lie inside that iteration's marker.
    steps = events[events["name"].str.startswith("ProfilerStep")]
    for (rep, it), grp in k.groupby(["repetition", "iteration"]):
        st = steps[(steps["repetition"] == rep) & (steps["iteration"] == it)].iloc[0]
        assert grp["start_ns"].min() >= st["start_ns"] and grp["end_ns"].max() <= st["end_ns"]


def test_kernel_context_is_a_noop_name_on_gpu_contexts():
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cuda", 0), backend="nccl")
    with ctx.kernel("anything"):  # must not touch CUDA or the profiler
        pass


def test_tracer_registry():
    assert get_tracer("torch") is TorchTracer
    with pytest.raises(UnavailableError, match="unknown tracer 'nope'"):
        get_tracer("nope")


def test_injection_parse():
    inj = Injection.parse(["sleep_rank=1:250", "extra_launches=3,extra_copy=1"])
    assert inj == Injection(sleep_rank=1, sleep_us=250.0, extra_launches=3, extra_copy=True)
    assert inj.active and not Injection().active
    for bad in ("sleep_rank=1", "extra_launches=-1", "warp=9", "extra_launches"):
        with pytest.raises(InputError, match="--inject"):
            Injection.parse([bad])


def test_check_output_reports_mismatch():
    ref = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    assert check_output(ref.to(torch.bfloat16), ref, 1e-2, 1e-2) is None
    bad = ref.clone()
    bad[1, 2] = 99.0
    msg = check_output(bad, ref, 1e-3, 1e-3)
    assert msg.startswith("1 of 6 elements outside") and "flat index 5" in msg and "got 99" in msg
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert check_output(nan, ref, 1.0, 1.0).startswith("1 of 6")
    assert "shape" in check_output(ref[:1], ref, 1.0, 1.0)
