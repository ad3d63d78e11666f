"""The Kineto importer speaks the one communication vocabulary (taxmodel/vocabulary.py): the
collective of an RCCL, MSCCL or NCCL debug kernel whose event carries no collective metadata
comes from its name as every other importer reads it; and a GPU event without an ``args`` object
is imported with a note saying what it lost."""
from __future__ import annotations

import pytest

from kineto_fixtures import build_trace, write_trace
from taxmodel.trace import importers
from taxmodel.vocabulary import kernel_collectives

NAMES = {  # a comm kernel name -> the collective it runs
    "rcclKernel_ReduceScatter_Sum_bf16_RING_LL": "reduce_scatter",
    "mscclKernel_AllReduce_Sum_f32_LL128": "allreduce",
    "ncclKernelDebug_AllGather_RING_LL": "allgather",
    "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "broadcast",
    "rcclDevKernelDebug_AllReduce_Sum_f16": "allreduce",
    "ncclDevKernel_Generic": "collective",  # RCCL's: the name says no collective (vocabulary.UNKNOWN_COLLECTIVE)
}


def test_comm_kernels_without_metadata_get_their_collective_from_the_vocabulary(tmp_path):
    doc, _ = build_trace(0, 1, steps=len(NAMES))
    comm = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_AllGather")]
    assert len(comm) == len(NAMES)
    for e, name in zip(comm, NAMES):
        e["name"] = name
        del e["args"]["Collective name"]  # as a trace without PyTorch's record_param_comms metadata
    events, _, _ = importers.import_traces([write_trace(tmp_path / "t.json", doc)])
    got = events.loc[events["role"] == "comm"].sort_values("start_ns")
    assert list(got["name"]) == list(NAMES)
    assert list(got["collective_op"]) == list(NAMES.values())
    # what every other importer gets from the vocabulary for the same names
    assert list(kernel_collectives(got["name"])) == list(NAMES.values())


@pytest.mark.parametrize("drop", [None, "missing"])
def test_a_gpu_event_without_args_is_noted(tmp_path, drop):
    doc, _ = build_trace(0, 1, steps=3)
    gemm = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"] == "gemm_kernel"]
    if drop is None:
        gemm[1]["args"] = None
    else:
        del gemm[1]["args"]
    events, meta, _ = importers.import_traces([write_trace(tmp_path / "t.json", doc)])
    gpu_rows = int(events["kind"].isin(["kernel", "memcpy", "memset"]).sum())
    notes = [n for n in meta["notes"] if "have no 'args' object" in n]
    assert notes == [f"kineto: t.json: 1 of {gpu_rows} GPU activities have no 'args' object (null or missing): their "
                     "launch call (correlation) is unknown, so their iteration comes from GPU-side annotations only (-1 "
                     "without them) and they carry no grid, bytes or collective"]
    row = events[events["name"] == "gemm_kernel"].sort_values("start_ns").iloc[1]
    assert row["correlation"] == -1 and row["iteration"] == 2  # from the GPU-side ProfilerStep#2 range


def test_no_note_when_every_gpu_event_has_args(tmp_path):
    doc, _ = build_trace(0, 1, steps=2)
    _, meta, _ = importers.import_traces([write_trace(tmp_path / "t.json", doc)])
    assert not [n for n in meta["notes"] if "'args'" in n]
