"""The one communication vocabulary (taxmodel/trace/vocabulary.py): which kernels are a
communication library's, which collective a name runs, and that the capture and the vendor
importers classify kernels by it alike."""
from __future__ import annotations

import pandas as pd

from taxmodel.trace import vendor_common, vocabulary
from taxmodel.trace.capture import assign_roles

NAMES = {  # kernel name -> (comm?, collective the vendor importers give it)
    "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": (True, "allgather"),
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": (True, "allreduce"),
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": (True, "reduce_scatter"),
    "rcclKernelDebug_AllToAll_RING": (True, "alltoall"),
    "mscclKernel_Sum_bf16_LL": (True, vocabulary.UNKNOWN_COLLECTIVE),  # no collective in the name
    "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)": (True, vocabulary.UNKNOWN_COLLECTIVE),
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": (False, ""),
    "ag_gemm_kernel": (False, ""),
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>": (False, ""),
}


def test_comm_kernels_and_their_collectives() -> None:
    names = pd.Series(list(NAMES) * 2)  # repeated names: matched once each, answered for every row
    want_comm = [c for c, _ in NAMES.values()] * 2
    want_op = [op for _, op in NAMES.values()] * 2
    assert vocabulary.comm_kernels(names).tolist() == want_comm
    assert [vocabulary.is_comm_kernel(n) for n in names] == want_comm
    assert vocabulary.kernel_collectives(names).tolist() == want_op
    assert vocabulary.kernel_collectives(pd.Series([], dtype=object)).tolist() == []


def test_capture_and_vendor_importers_agree_on_roles() -> None:
    names = pd.Series(list(NAMES))
    role, _ = vendor_common.classify_kernels(names)
    events = pd.DataFrame({"kind": "kernel", "name": names, "role": "other"})
    captured = assign_roles(events, {r"ag_gemm_kernel": "fused"})["role"]
    assert role.tolist() == ["comm" if c else "compute" for c, _ in NAMES.values()]
    assert captured.tolist() == [r if n != "ag_gemm_kernel" else "fused" for n, r in zip(names, role)]


def test_one_spelling_per_collective() -> None:
    cases = {"_allgather_base": "allgather", "allgather_into_tensor_coalesced": "allgather", "all_gather": "allgather",
             "AllGather": "allgather", "_reduce_scatter_base": "reduce_scatter", "ReduceScatter": "reduce_scatter",
             "reduce_scatter_tensor_coalesced": "reduce_scatter", "all_reduce": "allreduce", "AllReduce": "allreduce",
             "all_to_all": "alltoall", "SendRecv": "sendrecv", "bcast": "broadcast", "Generic": "generic"}
    for name, want in cases.items():
        assert vocabulary.normalize_collective(name) == want, name
    assert {vocabulary.SHORT_LABELS[vocabulary.normalize_collective(n)] for n in ("all_gather", "AllGather")} == {"AG"}
