"""All-Gather + GEMM: the kernels of each variant, with durations from shapes and hardware.

Per rank (W ranks, M global rows, A shard [M/W, K], B [K, N_loc], element size e):
- bsp: NCCL all_gather of M/W*K*e bytes per rank (collective model), then a vendor GEMM
  M x N_loc x K (W = 1: a device copy of A instead of the collective).
- pull: one persistent Triton GEMM; own rows first (1/W of the tiles), then remote rows loaded
  from the peers' heaps. Every remote A tile is loaded once per N-tile that uses it (the local L2
  does not cache peer memory), so the link moves ceil(N_loc/BLOCK_N) times the all-gather's bytes:
  time = own part + max(remote compute, remote link bytes / peer-load bandwidth) + first-load latency.
- push: a push kernel (P programs, side stream) stores the shard into every peer block by block,
  each block followed by a flag; the Triton GEMM on the other SMs computes own tiles first, then
  each remote block when its flag arrives: fill/drain pipeline (common.pipeline_time), and it
  cannot finish before the slowest peer's pushes (a synced fused kernel).
- torch_fused: W vendor GEMMs of M/W rows (own shard first) while copy engines bring the next
  shard; each later chunk starts after both its copy and the previous GEMM.
"""
from __future__ import annotations

from typing import Any, Mapping

from taxmodel.errors import InputError
from taxmodel.model.hardware import HardwareSpec

from . import common as c

VARIANTS = ("bsp", "pull", "push", "torch_fused")
ELT = {16: 2, 15: 2, 32: 4}
NCCL_AG = "ncclDevKernel_AllGather_RING_LL"
VENDOR_GEMM = "nvjet_gemm"
FUSED = "ag_gemm_kernel"
PUSH = "push_rows_kernel"
BLOCK_M, BLOCK_N, PUSH_PROGS, PUSH_CHUNK_K = 128, 256, 16, 1024  # GPU_CONFIG of kernels/ag_gemm/gemm_tiles.py


def dims(shape: Mapping[str, int], world: int) -> tuple[int, int, int, int, int, str]:
    """(M, M per rank, N per rank, K, element bytes, dtype) after checking the split."""
    m, n, k = int(shape["M"]), int(shape["N"]), int(shape["K"])
    tp = bool(int(shape.get("tp", 0)))
    if m % world:
        raise InputError(f"ag_gemm: M={m} must be a multiple of the world size {world}")
    if tp and n % world:
        raise InputError(f"ag_gemm: tensor-parallel layout needs N={n} divisible by the world size {world}")
    code = int(shape.get("dtype", 16))
    dtype = {16: "bf16", 15: "fp16", 32: "fp32"}.get(code, "bf16")
    return m, m // world, (n // world if tp else n), k, ELT.get(code, 2), dtype


def plans(variant: str, shape: Mapping[str, int], world: int, hw: HardwareSpec, params: c.ModelParams,
          coll: c.CollectiveModel) -> tuple[list[list[c.KernelPlan]], dict[str, float], list[str]]:
    """Kernel plans of every rank, the component times (seconds) and variant-specific assumptions."""
    m, m_loc, n_loc, k, elt, dtype = dims(shape, world)
    num_sms = hw.num_sms or 132
    shard = m_loc * k * elt
    notes: list[str] = []
    det: dict[str, float] = {}
    ht, hv = params.host_launch_triton_s, params.host_launch_torch_s
    if variant == "bsp":
        det["gemm"] = c.gemm_time(m, n_loc, k, dtype, hw, params, kind="vendor", elt=elt)
        if world > 1:
            det["all_gather"] = coll.time("allgather", shard, world)
            first = c.KernelPlan(NCCL_AG, "comm", det["all_gather"], hv, collective="allgather")
        else:
            det["copy"] = c.stream_time(2 * shard, hw, params, triton=False)
            first = c.KernelPlan("Memcpy DtoD", "copy", det["copy"], hv)
        one = [first, c.KernelPlan(VENDOR_GEMM, "compute", det["gemm"], hv)]
        notes.append("bsp: all_gather from the collective model, then the vendor GEMM at the calibrated rate with "
                     f"{params.vendor_tile[0]}x{params.vendor_tile[1]} tile/wave quantization")
        return [list(one) for _ in range(world)], det, notes
    if variant == "pull":
        gemm = c.gemm_time(m, n_loc, k, dtype, hw, params, kind="triton", sms=num_sms, elt=elt)
        det["triton_gemm"] = gemm
        if world > 1:
            if not c.topology(hw, world, params).single_domain:
                raise InputError(f"ag_gemm/pull at {world} GPUs spans several NVLink/xGMI domains: peer loads through a "
                                 "symmetric heap need one domain; out of the model's scope")
            n_tiles = c.cdiv(n_loc, BLOCK_N)
            peer_bw = params.peer_load_bytes_per_s or hw.link_bytes_per_s
            det["remote_link"] = (world - 1) * shard * n_tiles / peer_bw
            own = (gemm - params.kernel_overhead_s) / world
            remote = max(gemm - params.kernel_overhead_s - own, det["remote_link"])
            det["pull_kernel"] = params.kernel_overhead_s + own + params.peer_load_latency_s + remote
            notes.append(f"pull: each remote A tile crosses the link once per N-tile ({n_tiles}x the all-gather's bytes) "
                         f"at {peer_bw / 1e9:.0f} GB/s peer-load bandwidth ({params.sources.get('peer_load_bytes_per_s', 'default')})")
        else:
            det["pull_kernel"] = gemm
        notes.append(f"Triton GEMM at {params.triton_gemm_efficiency:.2f} of the vendor rate "
                     f"({params.sources.get('triton_gemm_efficiency', 'default')})")
        return [[c.KernelPlan(FUSED, "fused", det["pull_kernel"], ht)] for _ in range(world)], det, notes
    if variant == "push":
        if world == 1:
            gemm = c.gemm_time(m, n_loc, k, dtype, hw, params, kind="triton", elt=elt)
            det["triton_gemm"] = gemm
            return [[c.KernelPlan(FUSED, "fused", gemm, ht)]], det, notes
        if not c.topology(hw, world, params).single_domain:
            raise InputError(f"ag_gemm/push at {world} GPUs spans several NVLink/xGMI domains: out of the model's scope")
        gemm = c.gemm_time(m, n_loc, k, dtype, hw, params, kind="triton", sms=num_sms - PUSH_PROGS, elt=elt)
        store_bw = min(params.peer_store_bytes_per_s or hw.link_bytes_per_s,
                       PUSH_PROGS * params.peer_store_bytes_per_s_per_sm)
        push_total = (world - 1) * shard / store_bw
        blocks = c.cdiv(m_loc, BLOCK_M)
        flag = params.flag_roundtrip_s / 2
        first = shard / blocks / store_bw + flag
        pipe = c.pipeline_time(gemm, blocks, push_total, first, local_fraction=1.0 / world)
        det.update({"triton_gemm": gemm, "push": push_total, "pipeline": pipe})
        # The GEMM waits for the slowest peer's pushes: ready = that peer's start + its pushes.
        lead = ht  # the push launch returns one Triton launch before the GEMM's
        drain = (gemm - params.kernel_overhead_s) * (1 - 1.0 / world) / blocks
        own_work = pipe - drain
        sync_after = max(push_total + flag - lead, 0.0)
        one = [c.KernelPlan(PUSH, "comm", push_total, ht, stream=1),
               c.KernelPlan(FUSED, "fused", own_work, ht, sync=True, post_s=drain, sync_after_s=sync_after)]
        notes.append(f"push: {PUSH_PROGS} push programs at {params.peer_store_bytes_per_s_per_sm / 1e9:.0f} GB/s per SM "
                     f"(capped by {store_bw / 1e9:.0f} GB/s), the GEMM on {num_sms - PUSH_PROGS} SMs; fill = one block + "
                     "half a flag round trip, drain = the last block's tiles")
        return [list(one) for _ in range(world)], det, notes
    if variant == "torch_fused":
        if world == 1:
            raise InputError("ag_gemm/torch_fused needs more than one rank")
        chunk = c.gemm_time(m_loc, n_loc, k, dtype, hw, params, kind="vendor", elt=elt)
        p2p = float((hw.extra or {}).get("p2p_copy_bytes_per_s") or hw.link_bytes_per_s)
        copy = shard / p2p + params.kernel_overhead_s
        det.update({"gemm_chunk": chunk, "copy_chunk": copy})
        one: list[c.KernelPlan] = [c.KernelPlan(VENDOR_GEMM, "compute", chunk, hv)]
        # Copies run one after another on a copy stream from the start; chunk i's GEMM can start
        # only after copy i is done and GEMM i-1 ended: its wait is modeled as a longer GEMM.
        one += [c.KernelPlan("Memcpy PtoP (symm_mem copy)", "comm", copy, hv / 2, stream=1) for _ in range(1, world)]
        gemm_end = chunk
        for step in range(1, world):
            start = max(gemm_end, step * copy)
            one.append(c.KernelPlan(VENDOR_GEMM, "compute", chunk + (start - gemm_end), hv))
            gemm_end = start + chunk
        notes.append("torch_fused: W chunked vendor GEMMs (M/W rows each), copies on copy-engine streams at the "
                     "P2P copy bandwidth; a chunk waiting for its copy shows as longer GEMM time")
        return [list(one) for _ in range(world)], det, notes
    raise InputError(f"ag_gemm has no variant '{variant}'; choose one of {', '.join(VARIANTS)}")


def cost(shape: Mapping[str, int], world: int, variant: str) -> dict[str, Any]:
    """The workload's own declared cost (what the ledger of a real bundle uses)."""
    from taxmodel.runtime.workload import get_workload

    return get_workload("ag_gemm").cost(dict(shape), world, variant).to_dict()
