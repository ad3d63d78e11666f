"""The one vocabulary of kernel names (taxmodel/vocabulary.py): which kernels are a communication
library's, which collective a name runs, that the capture and the vendor importers classify kernels
by it alike, and the role patterns (collectives, vendor GEMMs, copies) the built-in workloads and the
advisor take from it."""
from __future__ import annotations

import re

import pandas as pd

from taxmodel import vocabulary
from taxmodel.trace import vendor_common
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


def test_role_patterns_name_other_libraries_kernels() -> None:
    gemms = ["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64",
             "cutlass3x_sm90_tensorop_s64x256x16gemm_bf16", "Cijk_Alik_Bljk_BBS_BH_MT128x128x64", "matmul",
             "hipblaslt_kernel", "wgmma_kernel"]
    assert all(re.search(vocabulary.GEMM_KERNELS, n) for n in gemms)
    assert not any(re.search(vocabulary.GEMM_KERNELS, n) for n in ("ag_copy_kernel", "ncclDevKernel_AllGather_RING_LL"))
    ag, rs = (vocabulary.COLLECTIVE_KERNELS[op] for op in (vocabulary.ALLGATHER, vocabulary.REDUCE_SCATTER))
    assert all(re.search(ag, n) for n in ("ncclDevKernel_AllGather_RING_LL", "rcclKernel_x", "all_gather", "AllGather"))
    assert all(re.search(rs, n) for n in ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter", "ReduceScatter"))
    assert not re.search(ag, "reduce_scatter") and not re.search(rs, "all_gather")
    assert re.search(vocabulary.MEMCPY, "Memcpy DtoD (Device -> Device)") and re.search(vocabulary.MEMSET, "Memset (Device)")
    assert all(re.search(vocabulary.SYMM_MEM_KERNELS, n) for n in ("Memcpy PtoP", "symm_mem_barrier", "copy_kernel"))


def test_any_name_combines_patterns_under_one_flag() -> None:
    both = vocabulary.any_name(vocabulary.MEMCPY, "(?i)reduce_kernel", "ce_put")
    assert both == "(?i)memcpy|reduce_kernel|ce_put"
    assert all(re.search(both, n) for n in ("MEMCPY HtoD", "Reduce_Kernel", "ce_put"))


def test_the_workloads_take_their_vendor_roles_from_the_vocabulary() -> None:
    from taxmodel.workload import get_workload, load_builtin_workloads

    load_builtin_workloads()
    ag, rs = (get_workload(w).variants() for w in ("ag_gemm", "gemm_rs"))
    assert ag["bsp"].roles[vocabulary.GEMM_KERNELS] == rs["bsp"].roles[vocabulary.GEMM_KERNELS] == "compute"
    assert ag["torch_fused"].roles[vocabulary.GEMM_KERNELS] == rs["torch_fused"].roles[vocabulary.GEMM_KERNELS] == "compute"
    assert ag["bsp"].roles[vocabulary.COLLECTIVE_KERNELS[vocabulary.ALLGATHER]] == "comm"
    assert rs["bsp"].roles[vocabulary.COLLECTIVE_KERNELS[vocabulary.REDUCE_SCATTER]] == "comm"
    assert get_workload("flash_decode").variants()["bsp"].roles[vocabulary.COLLECTIVE_KERNELS[vocabulary.ALLGATHER]] == "comm"
