"""The least work of one PyTorch tensor-list kernel launch, from the kernel's name and launch grid
alone: for ``_foreach_*`` and fused-optimizer kernels whose op the profiler recorded without
shapes (it records long tensor lists as empty), and for the same kernels replayed from a CUDA
graph, where no op is linked at all.

Why a bound can be read off the launch: PyTorch's ``multi_tensor_apply`` (ATen
``native/cuda/MultiTensorApply.cuh``, also built for ROCm) cuts every tensor of the lists into
chunks of ``CHUNK`` = 65,536 elements and gives each CTA of ``BLOCK`` = 512 threads exactly one
chunk. Only a tensor's last chunk can be partial, and one launch holds at most ``max_tensors``
tensors (by list depth and argument-buffer size, the tables below). So a launch of ``grid`` CTAs
covering ``t = min(grid, max_tensors)`` tensors at most processed at least

    elements >= (grid - t) * CHUNK + t

elements of each list. The kernel's template arguments say the rest: the element type and, for
the elementwise functors, how many lists each element reads (``r_args_depth``) and that one is
written; reductions (norms) write per chunk, not per element.

    bytes >= elements * (lists read + lists written) * element size

It is a lower bound (the partial chunks are counted as one element each), so a floor built on it
never exceeds the kernel's true minimum; the ledger labels it "launch grid".
"""
from __future__ import annotations

import re
from dataclasses import dataclass

CHUNK = 65536
BLOCK = 512
#: (max tensors per depth 1..5, max blocks) for the 4 KB kernel-argument build and the 32 KB one
#: (CUDA >= 12.1 with a driver that supports it, when the metadata carries ``true``)
_MAX_TENSORS = {False: (110, 64, 48, 36, 30), True: (770, 448, 336, 252, 210)}
_MAX_TENSORS_SCALARLIST = {False: (96, 64, 48, 36, 30), True: (672, 448, 336, 252, 210)}
_MAX_BLOCKS = {False: 320, True: 2240}

_KERNEL = re.compile(r"multi_tensor_apply_kernel<")
_META = re.compile(r"\b(TensorListMetadata|TensorListScalarListMetadata|FusedOptimizerTensorListMetadata)<([^<>]*)>")
_FUNCTOR = re.compile(r"\b(\w+Functor)<([^<>]*)>")
#: functors that read ``r_args_depth`` lists and write one list, per element (ATen ForeachFunctors.cuh)
_ELEMENTWISE = frozenset((
    "BinaryOpScalarFunctor", "BinaryOpScalarListFunctor", "BinaryOpListAlphaFunctor", "BinaryOpScalarTensorFunctor",
    "BinaryOpListFunctor", "UnaryOpFunctor", "PointwiseOpScalarFunctor", "PointwiseOpScalarListFunctor",
    "PointwiseOpListFunctor", "TernaryOpListFunctor", "TernaryOpScalarFunctor", "TernaryOpScalarListFunctor",
    "ZeroFunctor",
))
#: functors that only read their lists per element (their results are per chunk or per tensor)
_READ_ONLY = frozenset(("LpNormFunctor", "LpMaxFunctor"))
#: fused optimizers: every list is read, all but the gradients (list 1) written
_OPTIMIZER = frozenset(("FusedAdamMathFunctor", "FusedSgdMathFunctor"))
_ELEMENT_BYTES = {
    "c10::bfloat16": 2, "c10::half": 2, "float": 4, "double": 8, "long": 8, "long int": 8, "int": 4,
    "short": 2, "short int": 2, "bool": 1, "signed char": 1, "unsigned char": 1, "char": 1,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "c10::float8_e4m3fnuz": 1, "c10::float8_e5m2fnuz": 1,
}


@dataclass(frozen=True)
class LaunchWork:
    """Lower bounds on one launch: elements per list, bytes through HBM, and flops (one per
    element: these kernels are memory-bound)."""

    elements: int
    bytes: int
    flops: int


def _split(args: str) -> list[str]:
    return [a.strip() for a in args.split(",")]


def _ints(args: list[str]) -> list[int] | None:
    try:
        return [int(a.rstrip("u")) for a in args]
    except ValueError:
        return None


def _element_bytes(type_name: str) -> int | None:
    return _ELEMENT_BYTES.get(type_name.replace("at::", "").strip().lower())


def _dims(text: str) -> list[int] | None:
    try:
        dims = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        return None
    return dims or None


def _max_tensors(meta: str, depth: int, large: bool) -> int | None:
    if not 1 <= depth <= 5:
        return None
    table = _MAX_TENSORS_SCALARLIST if meta == "TensorListScalarListMetadata" else _MAX_TENSORS
    return table[large][depth - 1]


def tensor_list_launch_work(kernel_name: str, grid: str, block: str) -> LaunchWork | None:
    """Lower bounds on what one ``multi_tensor_apply`` launch did (module docstring), or None
    when the name is not such a kernel, its functor is not one whose traffic is known, or the
    launch does not look like ``multi_tensor_apply``'s (block size, grid beyond its limit)."""
    name = str(kernel_name).replace("(anonymous namespace)::", "").replace("at::native::", "")
    if not _KERNEL.search(name):
        return None
    meta_m = _META.search(name)
    if meta_m is None:
        return None
    fun_m = _FUNCTOR.search(name, meta_m.end())
    g, b = _dims(grid), _dims(block)
    if fun_m is None or g is None or b is None or b[0] != BLOCK or any(v != 1 for v in b[1:] + g[1:]):
        return None
    blocks = g[0]
    meta, meta_args = meta_m.group(1), _split(meta_m.group(2))
    large = meta_args[-1].lower() == "true"
    depth_arg = meta_args[1] if meta == "TensorListScalarListMetadata" else meta_args[0]
    depth = _ints([depth_arg])
    if depth is None:
        return None
    if blocks > _MAX_BLOCKS[large]:
        if large or meta_args[-1].lower() == "false" or blocks > _MAX_BLOCKS[True]:
            return None
        large = True  # a grid beyond the 4 KB build's limit: the 32 KB build, whose name may not say so
    max_t = _max_tensors(meta, depth[0], large)
    if max_t is None or blocks < 1:
        return None
    t = min(blocks, max_t)
    elements = (blocks - t) * CHUNK + t
    per_element = _bytes_per_element(fun_m.group(1), _split(fun_m.group(2)), depth[0])
    if per_element is None:
        return None
    return LaunchWork(elements=elements, bytes=elements * per_element, flops=elements)


def _bytes_per_element(functor: str, args: list[str], depth: int) -> int | None:
    """HBM bytes per element of each list for the functors whose traffic is known."""
    if functor == "CopyFunctor":  # CopyFunctor<dst_t, src_t, depth, r_args_depth, res_arg_index>
        if len(args) < 5:
            return None
        dst, src = _element_bytes(args[0]), _element_bytes(args[1])
        return None if dst is None or src is None else dst + src
    es = _element_bytes(args[0]) if args else None
    if es is None:
        return None
    if functor in _OPTIMIZER:  # <scalar_t, depth, ...>: all lists read, all but the gradients written
        return es * (2 * depth - 1)
    tail = _ints(args[-3:]) if len(args) >= 4 else None
    if tail is None or tail[0] != depth:
        return None
    _, reads, _ = tail
    if functor in _ELEMENTWISE:
        return es * (reads + 1)
    if functor in _READ_ONLY:
        return es * reads
    return None
