"""The names other libraries' kernels have in traces, and the role each name plays, defined once:
which kernels belong to a collective-communication library, which collective a kernel or a c10d
call runs (one spelling per collective), which are a vendor library's GEMMs, which are copies, and
the short labels the advisor prints.

Every importer, the capture, the advisor, the analytic model and the built-in workloads' role
patterns ask here, so that "is this a comm kernel" or "is this a GEMM" has one answer whichever
profiler produced the trace and whoever asks. Imports nothing of taxmodel: it sits at the bottom of
the package beside ``workload.py`` (whose ``Variant.roles`` these patterns fill), below the kernels
(which declare their roles with it) and the trace layer (whose importers classify with it). The
names of the project's own kernels are ``taxmodel.kernels.names``.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

#: Libraries whose kernels are collectives (NVIDIA NCCL, AMD RCCL, Microsoft MSCCL).
COMM_LIBRARIES = ("nccl", "rccl", "msccl")

#: A kernel of a collective-communication library: its name contains the library's name
#: (``ncclDevKernel_AllGather_RING_LL``, ``ncclKernel_AllReduce_...``, ``mscclKernel_...``).
COMM_KERNEL = re.compile("(?i)" + "|".join(COMM_LIBRARIES))

#: The collective a library kernel runs, read from its name (group ``op``: ``AllGather`` in
#: ``ncclDevKernel_AllGather_RING_LL``, ``ReduceScatter`` in ``rcclKernelDebug_ReduceScatter_...``).
#: ``\b(?=(\w*?X))\1`` takes the first library name of a word once and for all (an atomic group
#: Python 3.10 can run): ``X\w*?Kernel`` alone retries from every X of a long word.
KERNEL_OP = re.compile(r"(?i)\b(?=(\w*?(?:" + "|".join(COMM_LIBRARIES) + r")))\1\w*?Kernel(?:Debug)?_(?P<op>[A-Za-z]+)")

ALLGATHER = "allgather"
ALLREDUCE = "allreduce"
REDUCE_SCATTER = "reduce_scatter"

#: Needle in a name squashed to lower-case letters -> the one spelling of that collective, tried in
#: order (the longer names first: "reducescatter" before "reduce", "sendrecv" before "send").
COLLECTIVE_SPELLINGS: tuple[tuple[str, str], ...] = (
    ("reducescatter", REDUCE_SCATTER), ("allgather", ALLGATHER), ("allreduce", ALLREDUCE),
    ("alltoall", "alltoall"), ("broadcast", "broadcast"), ("sendrecv", "sendrecv"),
    ("send", "send"), ("recv", "recv"), ("barrier", "barrier"), ("gather", "gather"),
    ("scatter", "scatter"), ("reduce", "reduce"), ("bcast", "broadcast"),
)
#: Every spelling ``normalize_collective`` can return for a collective it recognizes.
COLLECTIVES = frozenset(op for _, op in COLLECTIVE_SPELLINGS)

UNKNOWN_COLLECTIVE = "collective"
"""Stand-in op for a communication kernel whose name does not say which collective it runs
(e.g. RCCL's ``ncclDevKernel_Generic``); its collectives are numbered under this key."""

#: Short labels of the collectives that fuse with a GEMM or attention (the advisor's "AG+GEMM").
SHORT_LABELS = {ALLGATHER: "AG", REDUCE_SCATTER: "RS", ALLREDUCE: "AR"}

#: Names the analytic model gives the library kernels it predicts (as NCCL names them on NVIDIA).
LIBRARY_KERNEL_NAMES = {ALLGATHER: "ncclDevKernel_AllGather_RING_LL",
                        REDUCE_SCATTER: "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"}



def any_name(*patterns: str) -> str:
    """One case-insensitive regular expression for a kernel name that any of ``patterns`` (regular
    expressions or plain names, each with or without its own ``(?i)``) matches: role patterns are
    combined with it (a second ``(?i)`` inside one expression is an error)."""
    return "(?i)" + "|".join(p.removeprefix("(?i)") for p in patterns)


#: A collective's kernels (``Variant.roles``, ``Intermediate`` producers and consumers), by
#: collective: every kernel of a communication library, and kernels named after the collective
#: (``all_gather_...``, ``reduce_scatter_...``: torch's, a user's own).
COLLECTIVE_KERNELS = {ALLGATHER: any_name(COMM_KERNEL.pattern, "all_?gather"),
                      REDUCE_SCATTER: any_name(COMM_KERNEL.pattern, "reduce_?scatter")}

#: The GEMMs of vendor libraries and frameworks, by what their names contain: cuBLAS (``nvjet_...``
#: on Hopper, ``sm90_xmma_gemm_...``, ``cutlass...``, ``...cublas...``), hipBLASLt and Tensile
#: (``Cijk_...``, ``...hipblaslt...``), a Hopper ``wgmma`` kernel, anything called ``gemm``/``matmul``.
GEMM_KERNELS = any_name("gemm", "matmul", "nvjet", "cutlass", "xmma", "cublas", "Cijk", "wgmma", "hipblaslt")

#: Copies as the importers name them (``Memcpy DtoD (Device -> Device)``, ``Memcpy PtoP``), and memsets.
MEMCPY = "(?i)memcpy"
MEMSET = "(?i)memset"

#: What torch's symmetric memory (``torch.ops.symm_mem``'s fused ops) runs beside the GEMM to move
#: and synchronize: copies (its copy kernels and the copy engines') and barriers.
SYMM_MEM_KERNELS = any_name(MEMCPY, "copy", "symm", "barrier")


def normalize_collective(name: str) -> str:
    """One spelling for a collective however it was written: a c10d name (``_allgather_base``,
    ``reduce_scatter_tensor_coalesced``), a kernel's op (``AllGather``) or a user's
    (``all_gather``) -> ``allgather``, ``reduce_scatter``, ... A name with no known collective in
    it comes back squashed to lower-case letters."""
    key = re.sub(r"[^a-z]", "", str(name).lower())
    for token in ("base", "coalesced", "intotensor", "tensor"):
        key = key.replace(token, "")
    for needle, op in COLLECTIVE_SPELLINGS:
        if needle in key:
            return op
    return key


def is_comm_kernel(name: str) -> bool:
    """Whether a kernel named ``name`` belongs to a collective-communication library."""
    return COMM_KERNEL.search(str(name)) is not None


def comm_kernels(names: pd.Series) -> np.ndarray:
    """``is_comm_kernel`` for every name (each distinct name matched once)."""
    codes, uniq = pd.factorize(names.astype(str))
    return pd.Series(uniq).str.contains(COMM_KERNEL, regex=True).to_numpy(bool)[codes]


def kernel_collectives(names: pd.Series) -> pd.Series:
    """The collective each library kernel runs, from its name (``UNKNOWN_COLLECTIVE`` when the
    name does not say one); "" for kernels of no communication library."""
    names = names.astype(str)
    codes, uniq = pd.factorize(names)
    uniq = pd.Series(uniq, dtype=object)
    token = uniq.str.extract(KERNEL_OP)["op"].fillna("")
    op = token.map(lambda t: normalize_collective(t) if t else "")  # a loop over distinct names
    op = op.where(op.isin(COLLECTIVES), UNKNOWN_COLLECTIVE)
    op = op.where(uniq.str.contains(COMM_KERNEL, regex=True), "")
    return pd.Series(op.to_numpy(object)[codes] if len(names) else np.zeros(0, object), index=names.index,
                     dtype=object)
