"""Per-shape tile configurations of the tile GEMM, tuned on the device and committed (issue 25).

Why a table: one tile configuration does not suit every shape (a 128x256 tile leaves SMs idle at
M=1024 with N=2048, where smaller tiles fill the machine), and autotuning at every run would add
compile and timing work to every profile. ``benchmarks/bench_gemm.py --tune`` times a few
candidates per shape on the GPU (the A_LOCAL GEMM alone, interleaved with cuBLAS) and writes the
winners as JSON; the entries below are that output, pasted. A shape whose class is not in the table
keeps the caller's default (``GPU_CONFIG``).

Shape class: each of M, N, K rounded up to a power of two, at least 1024 (``shape_class``), so
M=3000 runs with the M=4096 entry. Only tile fields are stored (``TILE_FIELDS``); the transport
fields of a ``GemmConfig`` stay the caller's. GEMM+RS's kernel takes the tile sizes, stages, warps
and grouping; it has no TMA store or warp-specialized loop, so it ignores those two fields.

``TABLE_ENV`` names a JSON file ({class: {field: value}}) that replaces the committed table: how the
tuning run benchmarks its own output before it is committed.
"""
from __future__ import annotations

import json
import os
from typing import Any

#: Environment variable naming a JSON table that replaces ``TABLE`` (tuning runs).
TABLE_ENV = "TAXMODEL_GEMM_TABLE"

#: The GemmConfig fields a table entry may set.
TILE_FIELDS = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps", "tma_store", "epi_split",
               "warp_specialize")

#: Tuned on one H200, Triton 3.6 (``bench_gemm.py --tune``, 16 interleaved samples per candidate;
#: benchmarks/results/gemm_tune_h200.json, gemm_h200.md); keys from ``shape_class``.
TABLE: dict[str, dict[str, Any]] = {
    "m1024-n8192-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2},
    "m1024-n2048-k8192": {"block_m": 128, "block_n": 128, "block_k": 64, "num_stages": 5, "num_warps": 8, "group_m": 8},
    "m1024-n8192-k2048": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2},
    "m4096-n8192-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2},
    "m4096-n2048-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2},
    "m4096-n8192-k2048": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 16, "tma_store": True, "epi_split": 2},
    "m8192-n8192-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 16, "tma_store": True, "epi_split": 2},
    "m8192-n2048-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 8, "warp_specialize": True},
    "m8192-n8192-k2048": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2},
}


def _bucket(x: int) -> int:
    return max(1024, 1 << max(0, int(x) - 1).bit_length())


def shape_class(m: int, n: int, k: int) -> str:
    """The table key of a GEMM of ``m`` x ``n`` x ``k`` (each dimension's power-of-two bucket)."""
    if min(m, n, k) < 1:
        raise ValueError(f"shape_class: dimensions must be positive, got M={m} N={n} K={k}")
    return f"m{_bucket(m)}-n{_bucket(n)}-k{_bucket(k)}"


def active_table() -> dict[str, dict[str, Any]]:
    """``TABLE``, or the JSON file ``TABLE_ENV`` names."""
    path = os.environ.get(TABLE_ENV, "").strip()
    if not path:
        return TABLE
    with open(path) as f:
        table = json.load(f)
    for key, entry in table.items():
        unknown = set(entry) - set(TILE_FIELDS)
        if unknown:
            raise ValueError(f"{TABLE_ENV}={path}: entry {key} has unknown fields {sorted(unknown)}; "
                             f"allowed: {', '.join(TILE_FIELDS)}")
    return table


def tile_fields(m: int, n: int, k: int) -> dict[str, Any] | None:
    """The table's tile fields for this shape's class, or None when the class is not tuned."""
    entry = active_table().get(shape_class(m, n, k))
    return dict(entry) if entry is not None else None
