"""`taxmodel calibrate`'s tile_gemm and copy_share steps: the All-Gather+GEMM kernels, measured alone
and side by side, where the analytic model took fitted numbers from other GPUs before (issue 33).

tile_gemm (rank 0, one GPU): the workloads' persistent tile GEMM in its ``A_LOCAL`` mode (every row
of A already local: the GEMM alone, ``gemm_tiles.launch_ag_gemm`` with the committed per-shape
tiles of ``config_for_shape``) and ``torch.matmul`` (cuBLAS, hipBLASLt) on the same operands, at
M = 1024 .. 16384 rows (N = K = 8192, the workloads' shapes). Each kernel's median device time from
a trace. The model divides the vendor GEMM's time by the tile GEMM's speed relative to it, per M
(``model.calibration.gemm_speed_by_m``): the Triton GEMM's efficiency depends on M.

copy_share (every rank): the All-Gather copy kernel (``transport.copy_blocks_kernel``, the ``sm``
transport of the fine-grained variants) in both of its modes: pull (every peer's slab loaded into
this rank's gathered buffer) and push (this rank's slab stored into every peer's buffer), each
timed alone and while the persistent GEMM runs beside it on another stream (as the pull and push
variants enqueue them), and the GEMM alone and beside it, at M = 1024 and 8192; one row per (M,
mode). All ranks copy at once, as in the workload. In the workload the copy kernel shares its SMs
with the GEMM and ran 1.2-1.8x the bandwidth model on 4 H200s; what the model needs is the rate of
one copy program while it shares, per mode (``model.calibration.copy_share_fit``): on 2 H200s at
M=1024 the push-mode kernel took 33 us where the pull-mode one took 55.6 us. On one GPU the "peer"
is a second half of the GPU's own memory (``microbench.PseudoPeerHeap``): the sharing is the same,
the link is not. The push rows write every launch into the same rows of the peer's buffer (the
push variant alternates two parities of it: the same bytes, twice the heap).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from taxmodel.kernels.names import AG_GEMM_KERNEL, COPY_BLOCKS_KERNEL
from taxmodel.runtime.timing import kernel_seconds, median_seconds, on_gpu, repeat, synchronize

#: Rows M of the tile GEMM's grid (N = K = ``GEMM_NK``), and of the copy kernel's.
GEMM_MS = (1024, 4096, 8192, 16384)
COPY_MS = (1024, 8192)
#: The copy kernel's modes the copy_share step measures, in the order it runs them at each M.
COPY_MODES = ("pull", "push")
GEMM_NK = 8192
#: The interpreter's shapes (CPU tests: the code paths, not the numbers).
CPU_GEMM_MS, CPU_NK = (32, 64), 32
#: Back-to-back calls traced per point (after a warm-up that compiles).
REPEATS = 10


def _operands(m: int, n: int, k: int, device: torch.device, a: torch.Tensor | None = None):
    """(A, B, C) of one GEMM: bf16 on a GPU, fp32 in the interpreter (its bf16 dots are wrong)."""
    dtype = torch.bfloat16 if on_gpu(device) else torch.float32
    g = torch.Generator(device=device)
    g.manual_seed(1234 + m)
    if a is None:
        a = torch.randn(m, k, generator=g, device=device, dtype=torch.float32).to(dtype)
    b = (torch.randn(k, n, generator=g, device=device, dtype=torch.float32) * k ** -0.5).to(dtype)
    return a, b, torch.empty(m, n, device=device, dtype=dtype)


def tile_gemm_launcher(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, rank: int, world: int, m_loc: int,
                       cfg: Any) -> Callable[[], None]:
    """One ``A_LOCAL`` launch of the workloads' tile GEMM on these operands (TMA where it runs)."""
    from taxmodel.kernels.ag_gemm.gemm_tiles import A_LOCAL, launch_ag_gemm, make_descriptor, tma_available
    from taxmodel.kernels.device import sync

    descs = {}
    if cfg.use_tma and tma_available():
        descs = {"a_desc": make_descriptor(a, [cfg.block_m, cfg.block_k]),
                 "b_desc": make_descriptor(b, [cfg.block_k, cfg.block_n])}
    err = sync.new_error_buffer(c.device)
    mode = sync.sync_mode(c.device)

    def launch() -> None:
        launch_ag_gemm(a, b, c, mode=A_LOCAL, rank=rank, world=world, m_loc=m_loc, cfg=cfg, err=err, sync=mode, **descs)
    return launch


def measure_tile_gemm(device: torch.device, ms: tuple[int, ...] | None = None, nk: int | None = None) -> dict:
    """Per M: the tile GEMM's and the vendor GEMM's median kernel time (s) on the same operands. At
    the smallest M also the tile GEMM with the narrow tiles pull takes where its own slab is small
    (``gemm_tiles.NARROW_TILES``, 128 columns; the interpreter keeps its 16-column tiles, the
    narrowest ``tl.dot`` takes): row ``narrow``, its ``tile_s`` beside the same M's row
    (``narrow_tile_gemm_factor``)."""
    gpu = on_gpu(device)
    ms = ms or (GEMM_MS if gpu else CPU_GEMM_MS)
    nk = nk or (GEMM_NK if gpu else CPU_NK)
    rows = []
    for m in ms:
        rows.append(_gemm_point(device, m, nk, nk))
        if gpu:
            torch.cuda.empty_cache()
    narrow = _gemm_point(device, min(ms), nk, nk, narrow=True)
    return {"n": nk, "k": nk, "rows": rows, "narrow": narrow}


def _gemm_point(device: torch.device, m: int, n: int, k: int, narrow: bool = False) -> dict:
    from dataclasses import replace

    from taxmodel.kernels.ag_gemm.gemm_tiles import NARROW_TILES, config_for_shape

    a, b, c = _operands(m, n, k, device)
    ref = torch.empty_like(c)
    cfg = config_for_shape(m, n, k, device)
    if narrow and on_gpu(device):  # pull's first-wave tiles (the interpreter's 16-column tiles stay: tl.dot's least)
        cfg = replace(cfg, **NARROW_TILES)
    tile = tile_gemm_launcher(a, b, c, rank=0, world=1, m_loc=m, cfg=cfg)

    def vendor() -> None:
        torch.matmul(a, b, out=ref)

    tile()  # compiles
    vendor()
    synchronize(device)
    err = float((c.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))
    if not err < 0.05:
        raise RuntimeError(f"the tile GEMM at M={m} N={n} K={k} disagrees with torch.matmul (max relative error {err:.3g})")
    reps = REPEATS if on_gpu(device) else 1
    t = median_seconds(kernel_seconds(device, repeat(tile, reps), {"tile": AG_GEMM_KERNEL}), "tile", "tile GEMM")
    v = median_seconds(kernel_seconds(device, repeat(vendor, reps), {"vendor": "."}), "vendor", "vendor GEMM")
    return {"m": m, "n": n, "k": k, "tile_s": t, "vendor_s": v, "config": cfg.tile_label()}


def measure_copy_share(device: torch.device, heap: Any, rank: int, world: int,
                       barrier: Callable[[], None], ms: tuple[int, ...] | None = None, nk: int | None = None,
                       modes: tuple[str, ...] = COPY_MODES) -> dict:
    """Per M and copy mode (``modes``: "pull", "push"): the copy kernel's and the GEMM's median kernel
    time (s), each alone and side by side; each row names its ``mode``.
    ``heap``: the ranks' symmetric heap (``world`` ranks), or a ``PseudoPeerHeap`` (``world`` 2, one GPU);
    ``barrier`` lines the ranks up before each traced batch (all ranks copy at once)."""
    from taxmodel.kernels.ag_gemm.gemm_tiles import GemmConfig, config_for_shape, default_config, k_pieces
    from taxmodel.kernels.ag_gemm.transport import copy_plan
    from taxmodel.kernels.device import sync

    gpu = on_gpu(device)
    ms = ms or (COPY_MS if gpu else CPU_GEMM_MS)
    nk = nk or (GEMM_NK if gpu else CPU_NK)
    unknown = [mode for mode in modes if mode not in COPY_MODES]
    if unknown:
        raise ValueError(f"copy_share: unknown copy mode(s) {unknown}; modes: {', '.join(COPY_MODES)}")
    sync_mode = sync.sync_mode(device)
    reps = REPEATS if gpu else 1
    side = torch.cuda.Stream(device=device) if gpu else None
    rows = []
    for m in ms:
        heap.reset()
        m_loc = m // world
        base: GemmConfig = config_for_shape(m, nk, nk, device, dataclasses.replace(default_config(device), transport="sm"))
        programs, items, chunk, _ = copy_plan(m_loc, nk, world, base)
        dtype = torch.bfloat16 if gpu else torch.float32
        gathered = heap.empty((m, nk), dtype)
        gathered.normal_()
        flags = heap.zeros((world * -(-m_loc // base.block_m) * k_pieces(base, nk),), torch.int32)
        _, b, c = _operands(m, nk, nk, device, a=gathered)
        gemm = tile_gemm_launcher(gathered, b, c, rank=rank, world=world, m_loc=m_loc, cfg=base)
        for mode in modes:
            rows.append(_copy_share_point(device, gathered, flags, heap, gemm, side, mode=mode, m=m, nk=nk,
                                          m_loc=m_loc, rank=rank, world=world, cfg=base, sync_mode=sync_mode,
                                          barrier=barrier, reps=reps, programs=programs, items=items, chunk=chunk))
        gathered = flags = b = c = gemm = None  # drop the buffers before the next size (rebinding: closures use them)
    return {"rows": rows}


def _copy_share_point(device: torch.device, gathered: torch.Tensor, flags: torch.Tensor, heap: Any,
                      gemm: Callable[[], None], side: Any, *, mode: str, m: int, nk: int, m_loc: int, rank: int,
                      world: int, cfg: Any, sync_mode: int, barrier: Callable[[], None], reps: int, programs: int,
                      items: int, chunk: int) -> dict:
    """One row of the copy_share step: the copy kernel in ``mode`` alone, the GEMM alone, and both as
    the pull/push variant enqueues them (the copy on a side stream first, then the GEMM)."""
    from taxmodel.kernels.ag_gemm.gemm_tiles import piece_cols
    from taxmodel.kernels.ag_gemm.transport import launch_copy_blocks
    from taxmodel.kernels.device.epochs import new_epoch_slots

    epochs = new_epoch_slots(device)
    pull = mode == "pull"

    def copy() -> None:
        launch_copy_blocks(gathered, flags, heap.heap_bases, pull=pull, m_loc=m_loc, rank=rank, world=world,
                           cfg=cfg, epochs=epochs, sync=sync_mode)

    def both() -> None:  # as the pull and push variants enqueue them: the copy on a side stream, then the GEMM
        if side is None:
            copy()
            gemm()
            return
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            copy()
        gemm()
        torch.cuda.current_stream(device).wait_stream(side)

    both()  # compiles both kernels (the copy in this mode)
    synchronize(device)
    names = {"copy": COPY_BLOCKS_KERNEL, "gemm": AG_GEMM_KERNEL}
    timed: dict[str, dict[str, list[float]]] = {}
    for label, body in (("alone_copy", copy), ("alone_gemm", gemm), ("shared", both)):
        barrier()
        timed[label] = kernel_seconds(device, repeat(body, reps), names)
    barrier()  # every rank's copies have landed before any rank reuses the buffers (a push writes the peers')
    return {"m": m, "n": nk, "k": nk, "world": world, "m_loc": m_loc, "mode": mode, "programs": programs,
            "items": items, "item_bytes": cfg.block_m * piece_cols(cfg, nk) * gathered.element_size(), "chunk_k": chunk,
            "copy_alone_s": median_seconds(timed["alone_copy"], "copy", f"{mode} copy"),
            "gemm_alone_s": median_seconds(timed["alone_gemm"], "gemm", "tile GEMM"),
            "copy_shared_s": median_seconds(timed["shared"], "copy", f"{mode} copy"),
            "gemm_shared_s": median_seconds(timed["shared"], "gemm", "tile GEMM")}


#: Rows M of GEMM+RS's GEMM kernel's points (N = K = ``GEMM_NK``, each rank K / W).
RS_MS = (1024, 4096, 8192)


def measure_rs_gemm(device: torch.device, heap: Any, rank: int, world: int, barrier: Callable[[], None],
                    ms: tuple[int, ...] | None = None, nk: int | None = None) -> dict:
    """Per M: GEMM+RS's GEMM kernel (``gemm_rs_kernel``, reduction in its own kernel, the workload's
    per-shape tiles and tile order, which each row names: ``order``) as this rank launches it,
    every rank at once pushing its peers' tiles into their owners' receive slots on ``heap``, and the vendor GEMM on the same shard [M, K/W] x
    [K/W, N]: median kernel times (s). The GEMM kernel waits on nothing (the owners' reductions
    do), so launches follow one another without them. ``heap``: the ranks' symmetric heap, or a
    ``PseudoPeerHeap`` (``world`` 2 on one GPU: pushes into a second half of its own memory)."""
    from taxmodel.kernels.ag_gemm.gemm_tiles import config_for_shape
    from taxmodel.kernels.device import sync
    from taxmodel.kernels.device.epochs import new_epoch_slots
    from taxmodel.kernels.gemm_rs.state import default_rs_config
    from taxmodel.kernels.gemm_rs.tiles import flag_rows, launch_gemm_rs
    from taxmodel.kernels.names import GEMM_RS_KERNEL
    from taxmodel.model.calibration import rs_order

    gpu = on_gpu(device)
    ms = ms or (RS_MS if gpu else tuple(m * world for m in CPU_GEMM_MS))
    nk = nk or (GEMM_NK if gpu else CPU_NK * world)
    mode = sync.sync_mode(device)
    budget = sync.spin_budget(5.0, mode)
    reps = REPEATS if gpu else 1
    base = default_rs_config(device)
    rows = []
    for m in ms:
        heap.reset()
        m_loc, k_loc = m // world, nk // world
        cfg = config_for_shape(m, nk, k_loc, device, base=base.gemm)
        a, b, ref = _operands(m, nk, k_loc, device)
        recv = heap.zeros((2, world, m_loc, nk), a.dtype)
        flags = heap.zeros((flag_rows(m_loc, nk, cfg), world), torch.int32)
        out = torch.empty(m_loc, nk, device=device, dtype=a.dtype)
        epochs = new_epoch_slots(device)  # per M: every launch on one buffer needs the same grid
        err = sync.new_error_buffer(device)

        def rs() -> None:
            launch_gemm_rs(a, b, recv, out, flags, heap.heap_bases, err, rank=rank, world=world, m_loc=m_loc,
                           epochs=epochs, budget=budget, sync=mode, cfg=cfg, tail=False, rows=base.reduce_rows,
                           spread=base.spread, lag=base.lag)

        def vendor() -> None:
            torch.matmul(a, b, out=ref)

        recv[:, rank].fill_(float("nan"))
        rs()  # compiles
        vendor()
        synchronize(device)
        half = int(epochs[0].item()) % 2  # the half this launch wrote into (its epoch's parity; slot 0)
        own = recv[half, rank].float()  # this rank's own rows of its partial product, in its own slot
        want = ref[rank * m_loc:(rank + 1) * m_loc].float()
        err_rel = float((own - want).abs().max() / want.abs().max().clamp_min(1e-6))
        if not err_rel < 0.05:
            raise RuntimeError(f"GEMM+RS's GEMM at M={m} N={nk} K/W={k_loc} disagrees with torch.matmul "
                               f"(max relative error {err_rel:.3g})")
        barrier()
        t = kernel_seconds(device, repeat(rs, reps), {"rs": GEMM_RS_KERNEL})
        barrier()
        v = kernel_seconds(device, repeat(vendor, reps), {"vendor": "."})
        sync.check_errors(err, "calibration GEMM+RS", None, mode)
        rows.append({"m": m, "n": nk, "k": nk, "k_loc": k_loc, "world": world, "config": cfg.tile_label(),
                     "order": rs_order(base.spread),
                     "element_bytes": a.element_size(), "rs_s": median_seconds(t, "rs", "GEMM+RS GEMM"),
                     "vendor_s": median_seconds(v, "vendor", "vendor GEMM")})
        a = b = ref = recv = flags = out = None  # drop the buffers before the next size
    return {"rows": rows}
