"""Per-shape tile configurations of the GEMM engine, tuned per GPU family and committed (issues 25, 34).

Why a table: one tile configuration does not suit every shape (a 128x256 tile leaves SMs idle at
M=1024 with N=2048, where smaller tiles fill the machine), and autotuning at every run would add
compile and timing work to every profile. ``benchmarks/bench_gemm.py --tune`` times a few
candidates per shape on the GPU (interleaved with cuBLAS) and writes the winners as JSON; the
entries below are that output, pasted, one table per GPU family (``FAMILY_TABLES``: the H100 and
the H200 differ in memory bandwidth, so short-K shapes may prefer other tiles). The family comes
from the device's name at run time (``device_family``). A family without a table, or a shape class
its table does not hold, keeps the caller's default (``GPU_CONFIG``); ``DEFAULT_NOTE`` says how far
that default was from cuBLAS where it was measured.

Shape class: each of M, N, K rounded up to a power of two, at least 1024 (``shape_class``), so
M=3000 runs with the M=4096 entry. Only tile fields are stored (``TILE_FIELDS``); the transport
fields of a ``GemmConfig`` stay the caller's. GEMM+RS's kernel takes the same fields except the
TMA store (its tiles go to their owners' receive buffers).

``TABLE_ENV`` names a JSON file ({class: {field: value}}) that replaces the device's table: how the
tuning run benchmarks its own output before it is committed.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

#: Environment variable naming a JSON table that replaces ``TABLE`` (tuning runs).
TABLE_ENV = "TAXMODEL_GEMM_TABLE"

#: The GemmConfig fields a table entry may set.
TILE_FIELDS = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps", "tma_store", "epi_split",
               "flatten", "wait_vote", "wait_horizon")

#: Tuned on one H100, Triton 3.6, with the engine's flattened loop (issue 34; ``bench_gemm.py --tune``: 10
#: candidates per shape, 16 interleaved samples each, with the impl that ships at the shape; the
#: benchmark after it: benchmarks/results/gemm_h100.md, the tuning records gemm_tune_h100.json).
_H100: dict[str, dict[str, Any]] = {
    "m1024-n8192-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2, "flatten": True},
    "m1024-n2048-k8192": {"block_m": 128, "block_n": 128, "block_k": 64, "num_stages": 6, "num_warps": 4, "group_m": 8, "tma_store": True, "epi_split": 1, "flatten": True},
    "m1024-n8192-k2048": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2, "flatten": True},
    "m4096-n8192-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 8, "tma_store": False, "flatten": True},
    "m4096-n2048-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 16, "tma_store": True, "epi_split": 2, "flatten": True},
    "m4096-n8192-k2048": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 16, "tma_store": True, "epi_split": 2, "flatten": True},
    "m8192-n8192-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 16, "tma_store": True, "epi_split": 2, "flatten": True},
    "m8192-n2048-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2, "flatten": True},
    "m8192-n8192-k2048": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 16, "tma_store": True, "epi_split": 2, "flatten": True},
}

#: Tuned on one H200, Triton 3.6, 2026-11-28 (``bench_gemm.py --tune --candidate-set table``: the
#: H100 table's distinct entries, and at the AG shapes the per-tile spinning wait beside the voting
#: one, 16 interleaved samples each; the benchmark after it: benchmarks/results/gemm_h200.md, the
#: tuning records gemm_tune_h200.json). One class chose the spinning wait (``wait_vote`` off), by
#: 0.4% in 16 samples: within the noise; kept as tuned.
_H200: dict[str, dict[str, Any]] = {
    "m1024-n8192-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2, "flatten": True},
    "m1024-n2048-k8192": {"block_m": 128, "block_n": 128, "block_k": 64, "num_stages": 6, "num_warps": 4, "group_m": 8, "tma_store": True, "epi_split": 1, "flatten": True, "wait_vote": False},
    "m1024-n8192-k2048": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2, "flatten": True},
    "m4096-n8192-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2, "flatten": True},
    "m4096-n2048-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2, "flatten": True},
    "m4096-n8192-k2048": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2, "flatten": True},
    "m8192-n8192-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2, "flatten": True},
    "m8192-n2048-k8192": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 8, "group_m": 8, "tma_store": True, "epi_split": 2, "flatten": True},
    "m8192-n8192-k2048": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3, "num_warps": 8, "group_m": 16, "tma_store": True, "epi_split": 2, "flatten": True},
}

#: One table per GPU family (``device_family``); a family missing here runs the default.
FAMILY_TABLES: dict[str, dict[str, dict[str, Any]]] = {"h100": _H100, "h200": _H200}

#: How far the default (``GPU_CONFIG``) was from cuBLAS where it was last measured.
DEFAULT_NOTE = ("default tiles (no table for this GPU): 0.976-1.025x of cuBLAS for the engine alone on one H100 "
                "at M=4096 and 8192, one run of 30 samples (benchmarks/results/gemm_rs_release_h100.md)")


def device_family(name: str) -> str | None:
    """The table family of a GPU named ``name`` (``torch.cuda.get_device_name``): ``h100``,
    ``h200``, or None for any other GPU (``NVIDIA H100 80GB HBM3`` -> ``h100``)."""
    m = re.search(r"\b(H100|H200|H800)\b", name.upper())
    if not m:
        return None
    return {"H800": "h100"}.get(m.group(1), m.group(1).lower())


def _bucket(x: int) -> int:
    return max(1024, 1 << max(0, int(x) - 1).bit_length())


def shape_class(m: int, n: int, k: int) -> str:
    """The table key of a GEMM of ``m`` x ``n`` x ``k`` (each dimension's power-of-two bucket)."""
    if min(m, n, k) < 1:
        raise ValueError(f"shape_class: dimensions must be positive, got M={m} N={n} K={k}")
    return f"m{_bucket(m)}-n{_bucket(n)}-k{_bucket(k)}"


def active_table(family: str | None) -> dict[str, dict[str, Any]]:
    """The table of GPU family ``family`` (empty for a family without one), or the JSON file
    ``TABLE_ENV`` names."""
    path = os.environ.get(TABLE_ENV, "").strip()
    if not path:
        return FAMILY_TABLES.get(family or "", {})
    with open(path) as f:
        table = json.load(f)
    for key, entry in table.items():
        unknown = set(entry) - set(TILE_FIELDS)
        if unknown:
            raise ValueError(f"{TABLE_ENV}={path}: entry {key} has unknown fields {sorted(unknown)}; "
                             f"allowed: {', '.join(TILE_FIELDS)}")
    return table


def tile_fields(m: int, n: int, k: int, family: str | None) -> dict[str, Any] | None:
    """The tile fields of GPU family ``family``'s table for this shape's class, or None when the
    class is not tuned there."""
    entry = active_table(family).get(shape_class(m, n, k))
    return dict(entry) if entry is not None else None
