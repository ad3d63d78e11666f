"""Fine-grained GEMM + Reduce-Scatter: each finished tile of the partial product is pushed into
its owner's receive buffer with an epoch flag, and the owner sums the ``world`` contributions of
each of its tiles as their flags arrive (kernels and protocol: ``tiles.py``).

Reduction placement (``RsConfig.reduce``): ``"kernel"`` (default) launches ``rs_reduce_kernel``
after ``gemm_rs_kernel`` on the same stream; ``"tail"`` reduces inside the GEMM's persistent
programs after their compute tiles (one launch fewer; on the interpreter one program, see
``tiles.py``). Both are the same code (``reduce_tile``), so the CPU tests cover both.

Why no atomic-add variant (fp32 ``atomic_add`` of each tile into the owner's accumulator): the
sum order would depend on arrival order (results not bitwise reproducible between runs), every
element becomes a remote fp32 atomic (twice the link bytes of a bf16 store, and atomics are the
slowest link traffic), the accumulator must be zeroed before each iteration (an extra pass that
races with early peers unless double-buffered) and the owner still needs a counter flag and a
pass that converts fp32 to the output dtype. Slots + flags keep the link bytes at bf16 and the
result deterministic for the same cost of one read pass on the owner.

CUDA graphs (``graph_safe``): ``run`` passes the same arguments every iteration and changes
nothing on the host. The epoch lives in device memory (``GemmRsState.epochs``, the GEMM's epoch
slots): each GEMM program reads its slot and stores the advanced epoch back at its end, and the
reduce kernel reads the advanced value (slot 0); each kernel picks the receive buffer's half
from the epoch's parity itself (``tiles.py``, "Epochs").
A captured iteration therefore replays as the next iteration, and eager launches and replays may
be mixed. In-kernel records under a graph: the record pointer is fixed at capture
(``taxmodel.runtime.graph.GraphRecordSlots``).

In-kernel records (``ctx.instrument``; kernels/device/trace.py, docs/records.md): the GEMM records
``compute`` per tile and ``store_push`` per tile pushed to a peer, the reduction ``flag_wait`` and
``combine`` per output tile (``tiles.py``). Without instrumentation both kernels compile with
``INSTRUMENT=False`` and hold no record code.
"""
from __future__ import annotations

import torch

from taxmodel.kernels.device.epochs import new_epoch_slots
from taxmodel.kernels.device.sync import check_errors

from .tiles import (KERNEL_NAMES, flag_rows, gemm_record_layout, launch_gemm_rs, launch_rs_reduce, reduce_record_layout,
                    slot_row_stride)
from .state import (FUSED_GEMM_KERNEL, FUSED_REDUCE_KERNEL, GemmRsState, GemmRsVariant, heap_bytes,
                       symmetric_heap)


def prepare(st: GemmRsState) -> None:
    """Receive buffer (two parities x world slots of this rank's rows) and flags on the heap."""
    if st.cfg.reduce not in ("kernel", "tail"):
        raise ValueError(f"gemm_rs fused: unknown reduce placement {st.cfg.reduce!r} (use 'kernel' or 'tail')")
    heap = symmetric_heap(st, heap_bytes(st.shape, st.world, "fused", st.dtype, st.cfg))
    st.recv = heap.empty((2, st.world, st.m_loc, slot_row_stride(st.n)), st.dtype)  # rows 16-element aligned
    st.flags = heap.zeros((flag_rows(st.m_loc, st.n, st.cfg.gemm), st.world), torch.int32)
    st.epochs = new_epoch_slots(st.out.device)  # the GEMM's, one per program (tiles.py, "Epochs")
    st.cache["heap_bases"] = heap.heap_bases.to(st.out.device)
    _record_buffers(st)
    if st.out.is_cuda:
        _compile(st)


def _record_buffers(st: GemmRsState) -> None:
    """In-kernel record buffers of both kernels when ``ctx.instrument`` is set (else None)."""
    cfg, dev = st.cfg, st.out.device
    tail = cfg.reduce == "tail"
    st.rec_gemm = st.ctx.record_buffer(FUSED_GEMM_KERNEL,
                                       gemm_record_layout(st.m_loc, st.n, st.world, cfg.gemm, tail, dev), dev)
    st.rec_reduce = None if tail else st.ctx.record_buffer(FUSED_REDUCE_KERNEL,
                                                           reduce_record_layout(st.m_loc, st.n, cfg.gemm), dev)


def _compile(st: GemmRsState) -> None:
    """Compile both kernels before any rank waits on another (a peer still compiling its GEMM must
    not use up our spin budget). A failure here only means compiling at the first run."""
    try:
        _launch(st, warmup_only=True)
    except Exception as exc:  # noqa: BLE001 - compile at the first launch instead, bounded waits still apply
        st.cache["warmup_error"] = f"{type(exc).__name__}: {exc}"


def _launch(st: GemmRsState, warmup_only: bool = False) -> None:
    """Enqueue one iteration: the same arguments every time (the kernels read the epoch and pick the
    receive buffer's half on the device)."""
    cfg, tail = st.cfg, st.cfg.reduce == "tail"
    common = dict(rank=st.rank, world=st.world, m_loc=st.m_loc, epochs=st.epochs, budget=st.budget, sync=st.sync,
                  cfg=cfg.gemm, rows=cfg.reduce_rows, count=st.count, seen=st.seen, warmup_only=warmup_only)
    with st.ctx.kernel(FUSED_GEMM_KERNEL):
        launch_gemm_rs(st.a, st.b, st.recv, st.out, st.flags, st.cache["heap_bases"], st.err, tail=tail,
                       spread=cfg.spread, lag=cfg.lag, records=st.rec_gemm, **common)
    if not tail:
        with st.ctx.kernel(FUSED_REDUCE_KERNEL):
            launch_rs_reduce(st.recv, st.out, st.flags, st.err, warps=cfg.reduce_warps, records=st.rec_reduce, **common)


def run(st: GemmRsState) -> None:
    _launch(st)


def check(st: GemmRsState) -> None:
    """Raise RunError if a reduction gave up waiting on a flag (reads the error buffer: a host sync)."""
    check_errors(st.err, KERNEL_NAMES, st.ctx, st.sync)


VARIANT = GemmRsVariant(
    name="fused",
    run=run,
    roles={FUSED_GEMM_KERNEL: "fused", FUSED_REDUCE_KERNEL: "fused"},
    needs_heap=True,
    fine_grained=True,
    description="persistent Triton GEMM pushes each partial tile into its owner's receive slot (in rounds of one "
                "block of every peer, own blocks a round behind) with an epoch flag; the owner sums the world slots "
                "of each tile as its flags arrive",
    prepare=prepare,
    graph_safe=True,  # epoch and receive-buffer half live on the device (see above): replays stay correct
)
