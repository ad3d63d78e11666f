"""GEMM + Reduce-Scatter: the kernels of each variant, with durations from shapes and hardware.

Per rank (W ranks; A_r [M, K/W], B_r [K/W, N]; the rank keeps M/W rows of C = sum_r A_r B_r;
element size e; one rank's output slab S = M/W * N * e bytes):
- bsp: the vendor GEMM M x N x K/W writes the whole partial product, then NCCL reduce_scatter
  with S bytes out per rank (collective model). W = 1: a device copy of the partial instead.
- fused (``kernels/gemm_rs``, reduction in its own kernel, the GPU default): one persistent Triton
  GEMM M x N x K/W computes the peers' tiles first and pushes each into its owner's receive slot
  (``(W-1) S`` bytes out per rank at the peer-store bandwidth, overlapping the GEMM); the kernel
  ends when both its tiles and its last push are done. Then ``rs_reduce_kernel`` waits (per
  tile, on flags) for every peer's pushes and sums the W slots: a memory-bound pass reading
  ``W S`` and writing ``S`` bytes. Its wait is on the slowest peer's pushes (a synced fused
  kernel in the timeline).
- torch_fused (``torch.ops.symm_mem.fused_matmul_reduce_scatter``): W vendor GEMMs of M/W rows,
  the peers' chunks first; after each, a symmetric-memory barrier of all ranks, a pull of S bytes
  from one peer at the P2P copy bandwidth and a second barrier, on a side stream, overlapping the
  next chunk's GEMM; then the own chunk, a final barrier and a sum over the W stacked partials
  (``(W+1) S`` bytes through HBM). PyTorch alternates two streams for the chunk GEMMs; the model
  keeps them on one (they share the SMs) and puts the barriers and copies on the other.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from taxmodel.errors import InputError
from taxmodel.kernels.names import GEMM_RS_KERNEL, RS_REDUCE_KERNEL, VENDOR_GEMM
from taxmodel.hardware.specs import HardwareSpec
from taxmodel.vocabulary import LIBRARY_KERNEL_NAMES, REDUCE_SCATTER

from .collective_model import CollectiveModel
from .costs import (cdiv, gemm_dram, gemm_time, l2_bytes, l2_kept_fraction, push_wave_time, shape_dtype, sm_count,
                    stream_time)
from .params import ModelParams
from .timeline import KernelPlan
from .topology import topology

VARIANTS = ("bsp", "fused", "torch_fused")
NCCL_RS = LIBRARY_KERNEL_NAMES[REDUCE_SCATTER]
FUSED_GEMM, FUSED_REDUCE = GEMM_RS_KERNEL, RS_REDUCE_KERNEL
SYMM_BARRIER = "c10d::symmetric_memory::barrier_kernel"
PEER_COPY = "Memcpy PtoP (symm_mem pull)"
SUM = "reduce_kernel (sum of stacked partials)"


def dims(shape: Mapping[str, int], world: int) -> tuple[int, int, int, int, int, str]:
    """(M, M per rank, N, K per rank, element bytes, dtype) after the workload's own split checks."""
    from taxmodel.kernels.gemm_rs.state import shape_dims

    m, m_loc, n, _, k_loc = shape_dims(shape, world)
    elt, dtype = shape_dtype(shape)
    return m, m_loc, n, k_loc, elt, dtype


def peers_done_share(world: int, blocks: int, spread: bool) -> float:
    """The share of a push GEMM's tiles up to its last peer tile: (W-1)/W with every peer's tile
    first; in the spread order (own blocks a round behind, ``tile_gemm.rs_spread_coords`` with lag
    1) all but the last own block, of ``blocks`` M-blocks per slab (the own tile that shares the
    last group's columns with the peers' last tiles left aside)."""
    if world <= 1:
        return 0.0
    if not spread:
        return (world - 1) / world
    return 1.0 - 1.0 / (world * max(1, blocks))


def push_finish(gemm_s: float, world: int, tiles: int, slots: int, push_s: float, overhead_s: float,
                peers_done: float | None = None) -> float:
    """When (after the GEMM's start) a push GEMM's last peer tile has left: pushing starts after the
    first wave and cannot end before the last peer tile is computed (``peers_done`` of the work,
    ``peers_done_share``; (W-1)/W when not given: every peer's tile first), nor before ``push_s``
    of link time: max(first wave + push, that share of the work + that tile's own share of the push)."""
    if world <= 1 or push_s <= 0:
        return 0.0
    work = max(gemm_s - overhead_s, 0.0)
    waves = max(1, cdiv(tiles, max(1, slots)))
    peer_tiles = max(1, tiles * (world - 1) // world)
    share = (world - 1) / world if peers_done is None else peers_done
    return overhead_s + max(work / waves + push_s, work * share + push_s / peer_tiles)


def push_phase_per_cta(world: int, tiles: int, programs: int, push_bytes: float, per_sm_bytes_per_s: float,
                       link_bytes_per_s: float, release_s: float, spread: bool = False) -> float:
    """Mean time a GEMM program spends pushing peer tiles (its ``store_push`` records): in waves of
    ``programs`` tiles that finish their products together and then push together, a wave of k
    pushing programs takes max(one tile at one SM's peer-store rate, k tiles at the GPU's
    peer-store bandwidth) plus the release that waits for the stores. Every peer's tile first: the
    first waves push with every program; ``spread``: every wave has (W-1)/W of its programs pushing
    (and the rest storing own tiles). This lock-step picture is an upper bound once later waves
    drift apart (docs/model.md)."""
    if world <= 1 or push_bytes <= 0 or programs <= 0:
        return 0.0
    peer_tiles = max(1, tiles * (world - 1) // world)
    tile = push_bytes / peer_tiles

    def wave(k: int) -> float:
        return push_wave_time(tile, k, per_sm_bytes_per_s, link_bytes_per_s, release_s)

    if spread:
        pushing = max(1, programs * (world - 1) // world)
        return peer_tiles / programs * wave(pushing)
    full, rest = divmod(peer_tiles, programs)
    return full * wave(programs) + (rest * wave(rest) / programs if rest else 0.0)


def plans(variant: str, shape: Mapping[str, int], world: int, hw: HardwareSpec, params: ModelParams,
          coll: CollectiveModel) -> tuple[list[list[KernelPlan]], dict[str, float], list[str]]:
    """Kernel plans of every rank, the component times (seconds) and variant-specific assumptions."""
    m, m_loc, n, k_loc, elt, dtype = dims(shape, world)
    slab = m_loc * n * elt  # one rank's rows of C (the reduce-scatter's output per rank)
    hv = params.host_launch_torch_s
    det: dict[str, float] = {}
    notes: list[str] = []
    if variant == "bsp":
        det["gemm"] = gemm_time(m, n, k_loc, dtype, hw, params, kind="vendor", elt=elt)
        rd, wr = gemm_dram(m, n, k_loc, elt, params.vendor_tile, hw)
        gemm = KernelPlan(VENDOR_GEMM, "compute", det["gemm"], hv, dram_read_bytes=rd, dram_write_bytes=wr)
        if world > 1:
            det["reduce_scatter"] = coll.time(REDUCE_SCATTER, slab, world)
            second = KernelPlan(NCCL_RS, "comm", det["reduce_scatter"], hv, collective=REDUCE_SCATTER)
        else:
            det["copy"] = stream_time(2 * m * n * elt, hw, params, triton=False)
            second = KernelPlan("Memcpy DtoD", "copy", det["copy"], hv)
        notes.append("bsp: the vendor GEMM of the whole partial product at the calibrated rate with "
                     f"{params.vendor_tile[0]}x{params.vendor_tile[1]} tile/wave quantization, then reduce_scatter "
                     "from the collective model")
        return [[gemm, second] for _ in range(world)], det, notes
    if variant == "fused":
        return _fused(m, m_loc, n, k_loc, elt, dtype, world, hw, params, det, notes)
    if variant == "torch_fused":
        return _torch_fused(m_loc, n, k_loc, elt, dtype, world, hw, params, det, notes)
    raise InputError(f"gemm_rs has no variant '{variant}'; choose one of {', '.join(VARIANTS)}")


def _fused(m, m_loc, n, k_loc, elt, dtype, world, hw, params, det, notes):
    """Persistent Triton GEMM pushing peer tiles, then the flag-waiting reduction kernel."""
    if world > 1 and not topology(hw, world, params).single_domain:
        raise InputError(f"gemm_rs/fused at {world} GPUs spans several NVLink/xGMI domains: peer stores through a "
                         "symmetric heap need one domain; out of the model's scope")
    slab = m_loc * n * elt
    ht = params.host_launch_triton_s
    gemm, eff, eff_key = _rs_gemm_time(m, n, k_loc, elt, dtype, world, hw, params)
    tm, tn = params.triton_tile
    tiles = world * cdiv(m_loc, tm) * cdiv(n, tn)  # an M-block never straddles two ranks' slabs
    store_bw = params.peer_store_bytes_per_s or hw.link_bytes_per_s
    push = (world - 1) * slab / store_bw
    latency = params.peer_load_latency_s if world > 1 else 0.0
    sms = sm_count(hw)
    blocks = cdiv(m_loc, tm)
    spread = params.rs_spread
    finish = push_finish(gemm, world, tiles, sms, push, params.kernel_overhead_s, peers_done_share(world, blocks, spread))
    per_sm = params.peer_store_bytes_per_s_per_sm or store_bw / sms
    programs = min(tiles, sms)
    comm = push_phase_per_cta(world, tiles, programs, (world - 1) * slab, per_sm, store_bw, latency, spread)
    # Revision 2 on (kernels/revisions.py): a program's pushes are stores it does not wait for: it
    # goes on to its next tile and releases its flags once, after its last tile, which waits for
    # the stores still in flight. Own tiles end the order (all of them, or from revision 6 the last
    # own block), so only programs whose last tile is a peer's (fewer of those own tiles than
    # programs) wait for a wave of pushes; the others for the release alone. Revision 1 signalled
    # each pushed tile with a system-scope release that waited for its stores: a program took its
    # products plus its push time.
    own_tiles = blocks * cdiv(n, tn)
    # the own tiles after the last peer tile: every own tile (peers first), or the last own block
    # (spread: own blocks a round behind the peers')
    own_tail = own_tiles if not spread else cdiv(n, tn)
    per_tile_release = params.kernel_revision < 2
    # A kernel time measured on this machine (calibrate's rs_gemm step: the whole kernel's traced
    # duration, its last pushes and its release included) already holds what the pushes after the
    # last product add; only a time built from GEMM rates takes them on top.
    measured_whole = eff_key in params.rs_measured_keys() and not per_tile_release
    if world <= 1:
        last_push = 0.0
    elif per_tile_release:
        last_push = comm
    elif measured_whole:
        last_push = 0.0
    elif programs > own_tail:
        peer_tile = (world - 1) * slab / max(1, tiles - own_tiles)
        last_push = push_wave_time(peer_tile, programs - own_tail, per_sm, store_bw, latency)
    else:
        last_push = latency
    kernel = max(gemm + last_push, finish + latency)
    # each reduce program (one own tile) waits on its tile's W flags one after another, then sums
    # the W slots: at the HBM rate when enough programs run, else at one program's rate per wave
    program = (world + 1) * tm * tn * elt / params.reduce_program_bytes_per_s
    waves = cdiv(own_tiles, sms)
    reduce_work = max(stream_time((world + 1) * slab, hw, params), waves * program + params.kernel_overhead_s) \
        + world * params.flag_wait_s
    flag = params.flag_roundtrip_s / 2 if world > 1 else 0.0
    det.update({"triton_gemm": gemm, "push": push, "push_done": finish + latency, "gemm_kernel": kernel,
                "last_push": last_push,
                "reduce": reduce_work, "reduce_program": program, "flag": flag, "push_per_program": comm})
    # The reduction waits for the slowest peer's last push, which landed (kernel - push_done)
    # before that peer's GEMM ended, i.e. before its own reduction started (less the kernel gap).
    sync_after = (finish + latency) - kernel - params.queued_gap_s
    # DRAM bytes: the GEMM reads its operands and writes its own slab here (peer tiles are stored
    # into the peers); the reduction reads the W slots, less what the L2 still holds of them after
    # the GEMM streamed its operands, and writes the slab
    g_rd, g_wr = gemm_dram(m, n, k_loc, elt, params.triton_tile, hw, c_local=1.0 / world)
    kept = l2_kept_fraction(world * slab, g_rd + g_wr, (world + 1) * slab, l2_bytes(hw))
    one = [KernelPlan(FUSED_GEMM, "fused", kernel, ht, comm_s=comm, dram_read_bytes=g_rd, dram_write_bytes=g_wr),
           KernelPlan(FUSED_REDUCE, "fused", 0.0, ht, sync=world > 1, post_s=reduce_work, sync_after_s=sync_after,
                      flag_latency_s=flag, dram_read_bytes=world * slab * (1.0 - kept), dram_write_bytes=slab)]
    src = params.sources
    notes.append(f"fused: Triton GEMM at {eff:.2f} of the vendor rate "
                 f"({eff_key}, {src.get(eff_key, 'default')}), {world - 1} of {world} slabs pushed at "
                 f"{store_bw / 1e9:.0f} GB/s peer-store bandwidth ({src.get('peer_store_bytes_per_s', 'default')}) "
                 "while it computes; the reduction kernel (reduce='kernel') waits for the slowest peer's pushes "
                 "+ half a flag round trip, then streams W slots in and the slab out (at the HBM rate, or, with few own tiles, "
                 f"one program per tile at {params.reduce_program_bytes_per_s / 1e9:.0f} GB/s "
                 f"({src.get('reduce_program_bytes_per_s', 'default')}) in waves of one per SM); reduce='tail' is not modeled; "
                 f"each GEMM program pushes for {comm * 1e6:.1f} us on average (store_push records: peer tiles in "
                 "waves that push together, each wave at the slower of one SM's peer-store rate and the GPU's "
                 "peer-store bandwidth shared by the wave; an upper bound once waves drift apart; tiles "
                 + ("in the spread order, (W-1)/W of each wave pushing" if spread else "of every peer first")
                 + "), "
                 + ("waiting for each pushed tile's stores (kernel revision 1: a release per tile)" if per_tile_release
                    else "overlapping its next tiles; " + (
                        f"the kernel's measured time ({eff_key}) holds its last pushes and its release" if measured_whole
                        else f"the kernel ends {last_push * 1e6:.1f} us after its GEMM (one release per program, after "
                             "the last pushes)")))
    return [list(one) for _ in range(world)], det, notes


def _rs_gemm_time(m: int, n: int, k_loc: int, elt: int, dtype: str, world: int, hw: HardwareSpec,
                  params: ModelParams) -> tuple[float, float, str]:
    """GEMM+RS's GEMM kernel's time, its speed against the vendor GEMM and where that came from:
    the vendor GEMM plus the measured cost of each byte pushed to the peers (rs_push_s_per_byte_by_m:
    it scales with the world size, where a speed measured at one world size does not), else the
    speed measured on this machine (rs_gemm_speed_by_m, the pushes included, rows of one rank), each
    of the kernel revision's tile order (their ``_peers_first`` twins before revision 6), else
    its fitted efficiency (rs_gemm_efficiency), else the tile GEMM's measured speed by M, else the
    Triton efficiency factor."""
    cost = params.rs_push_cost(m)
    if cost is not None:
        vendor = gemm_time(m, n, k_loc, dtype, hw, params, kind="vendor", elt=elt)
        kernel = vendor + m * n * elt * (world - 1) / world * cost
        return kernel, vendor / kernel, params.rs_measured_keys()[0]
    speed = params.rs_gemm_speed(m)
    if speed is not None:
        vendor = gemm_time(m, n, k_loc, dtype, hw, params, kind="vendor", elt=elt)
        return params.kernel_overhead_s + (vendor - params.kernel_overhead_s) / speed, speed, params.rs_measured_keys()[1]
    if params.rs_gemm_efficiency:
        own = replace(params, triton_gemm_efficiency=params.rs_gemm_efficiency, triton_gemm_speed_by_m=())
        return gemm_time(m, n, k_loc, dtype, hw, own, kind="triton", elt=elt), params.rs_gemm_efficiency, \
            "rs_gemm_efficiency"
    gemm = gemm_time(m, n, k_loc, dtype, hw, params, kind="triton", elt=elt)
    speed = params.triton_gemm_speed(m)
    if speed is not None:
        return gemm, speed, "triton_gemm_speed_by_m"
    return gemm, params.triton_gemm_efficiency, "triton_gemm_efficiency"


def _torch_fused(m_loc, n, k_loc, elt, dtype, world, hw, params, det, notes):
    """W chunked vendor GEMMs; per peer chunk a barrier, a P2P pull and a barrier on a side stream."""
    if world == 1:
        raise InputError("gemm_rs/torch_fused needs more than one rank")
    slab = m_loc * n * elt
    hv = params.host_launch_torch_s
    chunk = gemm_time(m_loc, n, k_loc, dtype, hw, params, kind="vendor", elt=elt)
    c_rd, c_wr = gemm_dram(m_loc, n, k_loc, elt, params.vendor_tile, hw)
    # the sum reads the W stacked partials (the own chunk's written last, beside the L2's) and writes the slab
    kept = l2_kept_fraction(slab, c_rd + c_wr, (world + 1) * slab, l2_bytes(hw))
    p2p = float((hw.extra or {}).get("p2p_copy_bytes_per_s") or hw.link_bytes_per_s)
    copy = slab / p2p + params.kernel_overhead_s
    barrier = params.flag_roundtrip_s
    total = stream_time((world + 1) * slab, hw, params, triton=False)
    det.update({"gemm_chunk": chunk, "copy_chunk": copy, "barrier": barrier, "sum": total})

    def bar(stream: int, after: int | None = None) -> KernelPlan:
        return KernelPlan(SYMM_BARRIER, "comm", barrier, hv, stream=stream, collective="barrier", after=after)

    one: list[KernelPlan] = [bar(0)]
    last_side = 0
    for _ in range(1, world):  # the peers' chunks: GEMM, then barrier - pull - barrier beside the next GEMM
        one.append(KernelPlan(VENDOR_GEMM, "compute", chunk, hv, dram_read_bytes=c_rd, dram_write_bytes=c_wr))
        one.append(bar(1, after=len(one) - 1))
        one.append(KernelPlan(PEER_COPY, "comm", copy, hv, stream=1))
        one.append(bar(1))
        last_side = len(one) - 1
    one.append(KernelPlan(VENDOR_GEMM, "compute", chunk, hv, dram_read_bytes=c_rd,  # own chunk, into its slot
                          dram_write_bytes=c_wr))
    one.append(bar(0, after=last_side))  # the main stream waits for the side stream, then all ranks
    one.append(KernelPlan(SUM, "compute", total, hv, dram_read_bytes=world * slab - kept * slab, dram_write_bytes=slab))
    notes.append("torch_fused: W chunked vendor GEMMs (M/W rows each) back to back; per peer chunk a symmetric-memory "
                 f"barrier ({barrier * 1e6:.1f} us, the flag round trip), a pull at {p2p / 1e9:.0f} GB/s (P2P copy "
                 "bandwidth) and a barrier on a side stream; then a barrier and the sum of the W stacked partials")
    return [list(one) for _ in range(world)], det, notes


def cost(shape: Mapping[str, int], world: int, variant: str) -> dict[str, Any]:
    """The workload's own declared cost (what the ledger of a real bundle uses)."""
    from taxmodel.workload import get_workload

    return get_workload("gemm_rs").cost(dict(shape), world, variant).to_dict()
