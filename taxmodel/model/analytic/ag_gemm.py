"""All-Gather + GEMM: the kernels of each variant, with durations from shapes and hardware.

Per rank (W ranks, M global rows, A shard [M/W, K], B [K, N_loc], element size e):
- bsp: NCCL all_gather of M/W*K*e bytes per rank (collective model), then a vendor GEMM
  M x N_loc x K (W = 1: a device copy of A instead of the collective).
- pull and push: one persistent Triton GEMM (own rows first), each remote M-block consumed when
  its flag arrives (fill/drain pipeline, costs.pipeline_time; the GEMM cannot end before the
  slowest peer's blocks arrived: a synced fused kernel). The transport (``ModelParams.ag_transport``,
  as ``GemmConfig.transport``): "ce" copy engines, one stream per peer at the P2P copy bandwidth
  (pull from kernel revision 4 where the GEMM has at most ``gemm_tiles.CE_STEP_MAX_N`` columns per rank: every
  copy on one stream, peer by peer, each at the P2P copy bandwidth, ``pull_tiles_and_order``),
  the host enqueueing a copy and a flag write per block and peer before it launches the GEMM (that
  host time is exposed communication; none in a CUDA graph), pull zeroing its flags after the GEMM
  with one memset; "sm" a 32-program Triton copy kernel beside the GEMM;
  "direct" (pull) loads inside the GEMM, every remote A tile once per N-tile it feeds
  (ceil(N_loc/BLOCK_N) times the all-gather's bytes) at the peer-load bandwidth.
  With the copy kernel sharing the GEMM's SMs (``sm``, ``copy_program_bytes_per_s`` measured or
  fitted; push: ``copy_program_push_bytes_per_s`` where measured, else the pull rate, said in the
  assumptions): the kernel's 32 programs take its work items (one 2048-column piece of one M-block
  for one peer) in rounds, each item at one program's rate beside the GEMM, and the GEMM's waves wait for the
  rounds that bring their remote rows (``costs.arrival_waves_time``); the GEMM loses
  ``gemm_share_loss`` of the copy's time to it. Which kernel's programs reach the SMs first
  matters (``copy_first_share``): a copy program placed first holds its SM, and the GEMM program
  that would go there (the grid's last ones) starts only when the copy kernel ends (in the traces
  the copy then runs alone on its SMs and the GEMM loses nothing to it); a copy program placed
  after the GEMM's shares an SM with it, as above. Every rank draws its order on its own and the
  step ends with the slowest rank: the GEMM's modeled time is its expectation on the slowest rank
  (``expected_slowest``).
- torch_fused: W vendor GEMMs of M/W rows (own shard first) while copy engines bring the next
  shard; each later chunk starts after both its copy and the previous GEMM.
"""
from __future__ import annotations

from typing import Any, Mapping

from taxmodel.errors import InputError
from taxmodel.kernels.names import AG_GEMM_KERNEL, COPY_BLOCKS_KERNEL, VENDOR_GEMM
from taxmodel.hardware.specs import HardwareSpec
from taxmodel.trace.capture_meta import GATED_ALIGNMENTS
from taxmodel.vocabulary import ALLGATHER, LIBRARY_KERNEL_NAMES

from .collective_model import CollectiveModel
from .costs import (arrival_waves_time, cdiv, gemm_dram, gemm_time, l2_bytes, l2_kept_fraction, persistent_drain,
                    pipeline_time, shape_dtype, sm_count, stream_time)
from .params import ModelParams
from .timeline import KernelPlan
from .topology import topology

VARIANTS = ("bsp", "pull", "push", "torch_fused")
NCCL_AG = LIBRARY_KERNEL_NAMES[ALLGATHER]
FUSED = AG_GEMM_KERNEL
BLOCK_M, BLOCK_N = 128, 256  # GPU_CONFIG of kernels/ag_gemm/gemm_tiles.py (see ``pull_tiles_and_order``)
#: The memset that zeroes copy-engine pull's flags after its GEMM (``CopyEngine.reset_flags``).
FLAG_RESET = "Memset (flag reset)"
#: The copy kernel's programs and the columns of one work item (GPU_CONFIG's push_progs, push_chunk_k).
COPY_PROGRAMS, COPY_CHUNK_K = 32, 2048


def copy_first_share(params: ModelParams) -> float:
    """How often the copy kernel's programs reach the SMs before the GEMM's (the ``sm`` transport).

    The copy kernel is enqueued first (on its side stream), then the GEMM. When the iteration starts
    on an idle GPU (``start_alignment`` "host": the ranks leave a host barrier, then enqueue), the
    copy's programs are placed first, every time. When both kernels are queued behind earlier GPU
    work that releases them together (the device gate or the previous back-to-back step: the
    gated alignments), nothing orders the two: each goes first as often as the other (1/2).
    Why the order matters: a GEMM program is not placed beside a copy program already running on
    an SM (likely: its tile pipeline needs nearly all of the SM's shared memory), while a copy
    program (no shared memory) is placed beside a running GEMM program. The committed traces show both
    orders under the gated alignments and only the copy first after a host barrier
    (benchmarks/results/ag_gemm_copy_order.md)."""
    return 0.5 if params.start_alignment in GATED_ALIGNMENTS else 1.0


def expected_slowest(copy_first_s: float, gemm_first_s: float, share: float, world: int) -> float:
    """The GEMM's expected time on the slowest of ``world`` ranks, each rank's order drawn on its
    own (``share``: how often the copy goes first): a step's window closes with its slowest rank,
    so it is the slower time unless every rank drew the faster order."""
    slow, fast = max(copy_first_s, gemm_first_s), min(copy_first_s, gemm_first_s)
    p_fast = (1 - share) if gemm_first_s <= copy_first_s else share
    all_fast = p_fast ** max(int(world), 1)
    return all_fast * fast + (1 - all_fast) * slow


def late_programs(tiles: int, hw: HardwareSpec, copy_programs: int) -> int:
    """GEMM programs (the grid's last) that wait for an SM while ``copy_programs`` copy programs,
    placed first, each hold one: the grid (``min(tiles, SMs)``) beyond the SMs left free."""
    sms = sm_count(hw)
    return max(0, min(tiles, sms) - max(sms - copy_programs, 0))


def dims(shape: Mapping[str, int], world: int) -> tuple[int, int, int, int, int, str]:
    """(M, M per rank, N per rank, K, element bytes, dtype) after checking the split."""
    m, n, k = int(shape["M"]), int(shape["N"]), int(shape["K"])
    if min(m, n, k) < 1:
        raise InputError(f"ag_gemm: M, N and K must be positive (got M={m}, N={n}, K={k})")
    tp = bool(int(shape.get("tp", 0)))
    if m % world:
        raise InputError(f"ag_gemm: M={m} must be a multiple of the world size {world}")
    if tp and n % world:
        raise InputError(f"ag_gemm: tensor-parallel layout needs N={n} divisible by the world size {world}")
    elt, dtype = shape_dtype(shape)
    return m, m // world, (n // world if tp else n), k, elt, dtype


def plans(variant: str, shape: Mapping[str, int], world: int, hw: HardwareSpec, params: ModelParams,
          coll: CollectiveModel) -> tuple[list[list[KernelPlan]], dict[str, float], list[str]]:
    """Kernel plans of every rank, the component times (seconds) and variant-specific assumptions."""
    m, m_loc, n_loc, k, elt, dtype = dims(shape, world)
    shard = m_loc * k * elt
    notes: list[str] = []
    det: dict[str, float] = {}
    hv = params.host_launch_torch_s
    if variant == "bsp":
        det["gemm"] = gemm_time(m, n_loc, k, dtype, hw, params, kind="vendor", elt=elt)
        if world > 1:
            det["all_gather"] = coll.time(ALLGATHER, shard, world)
            first = KernelPlan(NCCL_AG, "comm", det["all_gather"], hv, collective=ALLGATHER)
        else:
            det["copy"] = stream_time(2 * shard, hw, params, triton=False)
            first = KernelPlan("Memcpy DtoD", "copy", det["copy"], hv)
        # DRAM bytes: the gathered A (written by the all-gather or copy, which reads the own shard)
        # stays in the L2 for the GEMM's first read as far as both kernels' traffic lets it
        gathered = m * k * elt
        rd, wr = gemm_dram(m, n_loc, k, elt, params.vendor_tile, hw)
        kept = l2_kept_fraction(gathered, gathered + shard, rd + wr, l2_bytes(hw)) * gathered
        rd, wr = gemm_dram(m, n_loc, k, elt, params.vendor_tile, hw, a_kept=kept)
        one = [first, KernelPlan(VENDOR_GEMM, "compute", det["gemm"], hv, dram_read_bytes=rd, dram_write_bytes=wr)]
        notes.append("bsp: all_gather from the collective model, then the vendor GEMM at the calibrated rate with "
                     f"{params.vendor_tile[0]}x{params.vendor_tile[1]} tile/wave quantization")
        return [list(one) for _ in range(world)], det, notes
    if variant in ("pull", "push"):
        return _fine_grained(variant, m, m_loc, n_loc, k, elt, dtype, world, hw, params, det, notes)
    if variant == "torch_fused":
        if world == 1:
            raise InputError("ag_gemm/torch_fused needs more than one rank")
        chunk = gemm_time(m_loc, n_loc, k, dtype, hw, params, kind="vendor", elt=elt)
        rd, wr = gemm_dram(m_loc, n_loc, k, elt, params.vendor_tile, hw)
        p2p = float((hw.extra or {}).get("p2p_copy_bytes_per_s") or hw.link_bytes_per_s)
        copy = shard / p2p + params.kernel_overhead_s
        det.update({"gemm_chunk": chunk, "copy_chunk": copy})
        one: list[KernelPlan] = [KernelPlan(VENDOR_GEMM, "compute", chunk, hv, dram_read_bytes=rd, dram_write_bytes=wr)]
        # Copies run one after another on a copy stream from the start; chunk i's GEMM can start
        # only after copy i is done and GEMM i-1 ended: its wait is modeled as a longer GEMM.
        one += [KernelPlan("Memcpy PtoP (symm_mem copy)", "comm", copy, hv / 2, stream=1) for _ in range(1, world)]
        gemm_end = chunk
        for step in range(1, world):
            start = max(gemm_end, step * copy)
            one.append(KernelPlan(VENDOR_GEMM, "compute", chunk + (start - gemm_end), hv, dram_read_bytes=rd,
                                  dram_write_bytes=wr))
            gemm_end = start + chunk
        notes.append("torch_fused: W chunked vendor GEMMs (M/W rows each), copies on copy-engine streams at the "
                     "P2P copy bandwidth; a chunk waiting for its copy shows as longer GEMM time")
        return [list(one) for _ in range(world)], det, notes
    raise InputError(f"ag_gemm has no variant '{variant}'; choose one of {', '.join(VARIANTS)}")


def _fine_grained(variant, m, m_loc, n_loc, k, elt, dtype, world, hw, params, det, notes):
    """pull and push: a persistent Triton GEMM (own rows first) fed by one of three transports."""
    shard = m_loc * k * elt
    ht = params.host_launch_triton_s
    transport = params.ag_transport
    rd, wr = gemm_dram(m, n_loc, k, elt, params.triton_tile, hw)  # the gathered rows: in this GPU's memory
    if world == 1:
        det["triton_gemm"] = gemm_time(m, n_loc, k, dtype, hw, params, kind="triton", elt=elt)
        return [[KernelPlan(FUSED, "fused", det["triton_gemm"], ht, dram_read_bytes=rd, dram_write_bytes=wr)]], det, notes
    if not topology(hw, world, params).single_domain:
        raise InputError(f"ag_gemm/{variant} at {world} GPUs spans several NVLink/xGMI domains: peer access through a "
                         "symmetric heap needs one domain; out of the model's scope")
    speed = params.triton_gemm_speed(m)
    if speed is not None:
        notes.append(f"Triton GEMM at {speed:.3f} of the vendor GEMM's speed at M={m} (measured by M: "
                     f"{params.sources.get('triton_gemm_speed_by_m', 'given')}); transport '{transport}'")
    else:
        notes.append(f"Triton GEMM at {params.triton_gemm_efficiency:.2f} of the vendor rate "
                     f"({params.sources.get('triton_gemm_efficiency', 'default')}); transport '{transport}'")
    blocks = cdiv(m_loc, BLOCK_M)
    block_n, step = BLOCK_N, False  # push, and the other transports: 128x256 tiles, one stream per peer
    if variant == "pull" and transport == "ce":
        block_n, step = pull_tiles_and_order(m_loc, n_loc, world, sm_count(hw), params.kernel_revision)
    narrow = params.narrow_tile_gemm_factor if block_n < BLOCK_N else 1.0  # 128x128 tiles: a slower GEMM
    if block_n < BLOCK_N:
        notes.append(f"pull/ce: 128x128 tiles (a small own slab, kernel revision 5), the GEMM {narrow:.2f}x as "
                     f"long as with 128x256 ({source_of(params, 'narrow_tile_gemm_factor', 'measured on one H200')})")
    flag = params.flag_roundtrip_s / 2
    if transport == "direct":
        if variant != "pull":
            raise InputError("transport 'direct' exists for pull only")
        gemm = gemm_time(m, n_loc, k, dtype, hw, params, kind="triton", elt=elt)
        n_tiles = cdiv(n_loc, BLOCK_N)
        peer_bw = params.peer_load_bytes_per_s or hw.link_bytes_per_s
        det.update({"triton_gemm": gemm, "remote_link": (world - 1) * shard * n_tiles / peer_bw})
        own = (gemm - params.kernel_overhead_s) / world
        remote = max(gemm - params.kernel_overhead_s - own, det["remote_link"])
        det["fused_kernel"] = params.kernel_overhead_s + own + params.peer_load_latency_s + remote
        notes.append(f"pull/direct: each remote A tile crosses the link once per N-tile ({n_tiles}x the all-gather's "
                     f"bytes) at {peer_bw / 1e9:.0f} GB/s peer-load bandwidth ({params.sources.get('peer_load_bytes_per_s', 'default')})")
        # remote A rows are loaded from the peers' memory, not this GPU's DRAM
        rd, wr = gemm_dram(m, n_loc, k, elt, params.triton_tile, hw, a_local=1.0 / world)
        return [[KernelPlan(FUSED, "fused", det["fused_kernel"], ht, dram_read_bytes=rd, dram_write_bytes=wr)]
                for _ in range(world)], det, notes
    arrivals = blocks  # pieces of a peer's slab that land one after another, each with its flag
    if transport == "ce":
        p2p = float((hw.extra or {}).get("p2p_copy_bytes_per_s") or hw.link_bytes_per_s / max(world - 1, 1))
        arrivals = ce_copies(blocks, world, params.kernel_revision, cdiv(n_loc, block_n), sm_count(hw), step=step)
        gemm = narrow * gemm_time(m, n_loc, k, dtype, hw, params, kind="triton", elt=elt)
        name = f"Memcpy PtoP ({'push' if variant == 'push' else 'pull'})"
        if step:
            # peer by peer on one stream: every copy alone on the pair at its P2P copy rate, no two
            # ranks reading one peer at once; the slabs' copies land one after another, each with
            # the engine's fixed cost per copy
            arrivals *= world - 1
            xfer = (world - 1) * shard / p2p + arrivals * params.ce_copy_fixed_s
            host_pre = 2 * arrivals * params.host_copy_call_s  # a copy and a flag write per copy
            copies = [KernelPlan(name, "comm", xfer, host_pre, stream=1)]
            lead = host_pre + ht
            notes.append(f"pull/ce: peer by peer on one stream (the GEMM's {n_loc} columns per rank: the "
                         f"copies last about as long as it), {arrivals} copies at {p2p / 1e9:.0f} GB/s one after another, "
                         f"{params.ce_copy_fixed_s * 1e6:.0f} us fixed each ({source_of(params, 'ce_copy_fixed_s', 'a 4x H200 trace')}), "
                         f"{2 * arrivals} "
                         f"calls of {params.host_copy_call_s * 1e6:.0f} us before the GEMM launch; the GEMM keeps "
                         "every SM")
        else:
            # each peer's slab at the pair's P2P copy rate, and all of them at the link's (a 4x H200 trace
            # shows a rank's pulls running one at a time on one engine, slower than this at m16384_tp)
            per_peer = shard / p2p
            xfer = max(per_peer, (world - 1) * shard / hw.link_bytes_per_s)
            host_pre = 2 * arrivals * params.host_copy_call_s  # per peer stream: a copy and a flag write per copy
            copies = [KernelPlan(name, "comm", xfer, host_pre, stream=1 + i) for i in range(world - 1)]
            lead = (world - 1) * host_pre + ht  # the GEMM's launch returns after every copy call and its own
            notes.append(f"{variant}/ce: copy engines at {p2p / 1e9:.0f} GB/s per peer pair, a peer's slab in "
                         f"{arrivals} copies, {2 * arrivals} calls of {params.host_copy_call_s * 1e6:.0f} us per "
                         "peer before the GEMM launch; the GEMM keeps every SM")
    elif transport == "sm":
        progs = COPY_PROGRAMS
        gemm = gemm_time(m, n_loc, k, dtype, hw, params, kind="triton", elt=elt)
        store_bw = min(params.peer_store_bytes_per_s or hw.link_bytes_per_s, progs * params.peer_store_bytes_per_s_per_sm)
        xfer = (world - 1) * shard / store_bw
        lead = ht
        if params.copy_program_rate(variant)[0] > 0:
            return _shared_copy(variant, m_loc, n_loc, k, elt, world, hw, params, det, notes, gemm, xfer, rd, wr)
        copies = [KernelPlan(COPY_BLOCKS_KERNEL, "comm", xfer, ht, stream=1)]
        notes.append(f"{variant}/sm: a {progs}-program copy kernel at {store_bw / 1e9:.0f} GB/s sharing the SMs with the GEMM")
    else:
        raise InputError(f"unknown ag_gemm transport {transport!r}; use ce, sm or direct")
    first = xfer / arrivals + flag
    # the last copy's tiles start when it lands and take a whole tile time each (a 4x H200 trace at
    # M=4096-16384, B [8192, 2048] per rank: the GEMM kernel ends one tile time after the last copy)
    tiles = world * blocks * cdiv(n_loc, block_n)
    tile_s = persistent_drain(gemm, params.kernel_overhead_s, tiles, sm_count(hw))
    pipe = pipeline_time(gemm, arrivals, xfer, first, local_fraction=1.0 / world, min_drain_s=tile_s)
    if transport == "ce":
        # the persistent GEMM's waves: each program's tiles one after another, a remote tile not before
        # its copy landed; the copies land one after another (one engine runs a rank's copies in turn)
        landings = arrivals if step else arrivals * (world - 1)
        pipe = max(pipe, arrival_waves_time(gemm, params.kernel_overhead_s, tiles, min(tiles, sm_count(hw)),
                                            blocks * cdiv(n_loc, block_n), landings, xfer / landings, flag))
    drain = max((gemm - params.kernel_overhead_s) * (1 - 1.0 / world) / arrivals, tile_s)
    det.update({"triton_gemm": gemm, "transfer": xfer, "pipeline": pipe})
    # the GEMM cannot finish before the slowest peer's blocks arrived (measured from its own start)
    sync_after = max(xfer + flag - lead, 0.0)
    gemm_plan = KernelPlan(FUSED, "fused", pipe - drain, ht, sync=True, post_s=drain, sync_after_s=sync_after,
                           dram_read_bytes=rd, dram_write_bytes=wr)
    after = []
    if transport == "ce" and variant == "pull":  # the flags zeroed after the GEMM: one small memset
        after = [KernelPlan(FLAG_RESET, "comm", params.kernel_overhead_s, params.host_copy_call_s)]
        notes.append("pull/ce: the rank's flags zeroed by one memset after the GEMM (the kernel overhead)")
    return [copies + [gemm_plan] + after for _ in range(world)], det, notes


def ce_copies(blocks: int, world: int, kernel_revision: int, n_tiles: int = 0, wave: int = 0,
              step: bool = False) -> int:
    """Copies (and flags) per peer slab of ``blocks`` M-blocks on the copy engines: one per block
    before kernel revision 3, the transport's default split since (``gemm_tiles.default_blocks_per_copy``;
    pulls peer by peer (``step``): one wave's blocks a copy, ``n_tiles`` N-tiles a block over
    ``wave`` programs)."""
    if kernel_revision < 3:
        return blocks
    from taxmodel.kernels.ag_gemm.gemm_tiles import default_blocks_per_copy

    return cdiv(blocks, default_blocks_per_copy(blocks, world, n_tiles, wave, step=step))


def pull_tiles_and_order(m_loc: int, n_loc: int, world: int, wave: int, kernel_revision: int) -> tuple[int, bool]:
    """pull's GEMM tile width on the copy engines and whether it pulls peer by peer, as the kernels
    of ``kernel_revision`` pick them with no config given (``AgGemm.shape_config``): 128x256 tiles
    and one stream per peer before revision 4; from it ``gemm_tiles.ce_order_for``, and from
    revision 5 ``gemm_tiles.first_wave_tiles`` first (``wave`` programs)."""
    if kernel_revision < 4:
        return BLOCK_N, False
    from taxmodel.kernels.ag_gemm.gemm_tiles import GPU_CONFIG, ce_order_for, first_wave_tiles

    cfg = first_wave_tiles(GPU_CONFIG, m_loc, n_loc, world, wave) if kernel_revision >= 5 else GPU_CONFIG
    return cfg.block_n, ce_order_for(cfg, n_loc) == "step"


def source_of(params: ModelParams, name: str, default_source: str) -> str:
    """Where parameter ``name`` came from, in words: its recorded source (a hardware file, a fit,
    given), else, for a default, ``default_source`` and that no calibration measured it."""
    src = params.sources.get(name, "default")
    return f"{default_source}; not calibrated" if src == "default" else src


def _shared_copy(variant, m_loc, n_loc, k, elt, world, hw, params, det, notes, gemm, link_s, rd, wr):
    """pull/push with the ``sm`` copy kernel at its measured rate beside the GEMM (the module docstring)."""
    ht = params.host_launch_triton_s
    blocks = cdiv(m_loc, BLOCK_M)
    chunk = min(COPY_CHUNK_K, cdiv(k, 64) * 64)
    items = blocks * cdiv(k, chunk) * (world - 1)
    progs = max(1, min(COPY_PROGRAMS, items))
    rounds = cdiv(items, progs)
    rate, rate_name, fallback = params.copy_program_rate(variant)  # push: its own mode's rate where measured
    round_s = BLOCK_M * chunk * elt / rate
    xfer = max(rounds * round_s, link_s) + params.kernel_overhead_s
    if xfer - params.kernel_overhead_s > rounds * round_s:  # link-bound: rounds stretched to the link's pace
        round_s = (xfer - params.kernel_overhead_s) / rounds
    flag = params.flag_roundtrip_s / 2
    alone = gemm
    gemm += params.gemm_share_loss * xfer
    tiles = world * blocks * cdiv(n_loc, BLOCK_N)
    own = blocks * cdiv(n_loc, BLOCK_N)
    grid = min(tiles, sm_count(hw))
    # the GEMM's programs placed first: the copy's share its SMs (the GEMM loses gemm_share_loss)
    gemm_first = arrival_waves_time(gemm, params.kernel_overhead_s, tiles, grid, own, rounds, round_s, flag)
    # the copy's programs placed first: each holds its SM until the copy kernel ends, and the
    # GEMM's last programs start then; the others run beside it and lose nothing to it
    late = late_programs(tiles, hw, progs)
    copy_first = arrival_waves_time(alone, params.kernel_overhead_s, tiles, grid, own, rounds, round_s, flag,
                                    late_programs=late, late_start_s=rounds * round_s)
    share = copy_first_share(params)
    fused = expected_slowest(copy_first, gemm_first, share, world)
    det.update({"triton_gemm": gemm, "transfer": xfer, "pipeline": fused,  # seconds only (rounds: in the note)
                "gemm_first": gemm_first, "copy_first": copy_first})
    notes.append(f"{variant}/sm: the copy kernel's {progs} programs move {items} items of {BLOCK_M}x{chunk} in "
                 f"{rounds} round(s) at {rate / 1e9:.1f} GB/s per program beside the GEMM ({rate_name}: "
                 f"{params.sources.get(rate_name, 'given')}); the GEMM's waves wait for the rounds "
                 f"that bring their rows and lose {params.gemm_share_loss:.2f} of the copy's time to it; where the "
                 f"copy's programs reach the SMs first ({share:.0%} of steps, '{params.start_alignment}' starts) "
                 f"the GEMM's last {late} programs wait for the copy to end ({copy_first * 1e6:.1f} against "
                 f"{gemm_first * 1e6:.1f} us)")
    if fallback:
        notes.append(fallback)
    copies = [KernelPlan(COPY_BLOCKS_KERNEL, "comm", xfer, ht, stream=1)]
    # the GEMM's last wave runs after the last round landed; before it the GEMM waits, as a synced
    # fused kernel, for the slowest peer's copy (a rank that started late delays its rows)
    drain = max(gemm - params.kernel_overhead_s, 0.0) / max(1, cdiv(tiles, min(tiles, sm_count(hw))))
    gemm_plan = KernelPlan(FUSED, "fused", fused - drain, ht, sync=True, post_s=drain,
                           sync_after_s=max(xfer + flag - ht, 0.0), dram_read_bytes=rd, dram_write_bytes=wr)
    return [copies + [gemm_plan] for _ in range(world)], det, notes


def cost(shape: Mapping[str, int], world: int, variant: str) -> dict[str, Any]:
    """The workload's own declared cost (what the ledger of a real bundle uses)."""
    from taxmodel.workload import get_workload

    return get_workload("ag_gemm").cost(dict(shape), world, variant).to_dict()
