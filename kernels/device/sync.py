"""Flags between ranks: bounded acquire-waits and release-sets that every fine-grained kernel shares.

Why one module: a spin-wait that never ends hangs a whole machine, so every wait in every kernel is
bounded the same way and reports the same way. A waiting kernel gives up after a deadline, writes
(rank, peer, flag index, kernel id, ...) into a small error buffer, stops waiting (every later wait
in that launch returns at once), and the host turns the record into a ``RunError`` with
``check_errors``.

The deadline is measured with the clock the hardware offers (``MODE``, a constexpr chosen on the host
by ``sync_mode``):

- ``SYNC_NVIDIA``: the GPU global timer (``%globaltimer``, nanoseconds);
- ``SYNC_AMD``: ``s_memrealtime`` (a 100 MHz counter, 10 ns per tick);
- ``SYNC_POLL``: Triton's interpreter (``TRITON_INTERPRET=1``) has no device clock; ``now`` reads the
  host's monotonic clock (ns) there, so waits are bounded by wall-clock time as on a GPU. (Counting
  polls instead made the bound depend on the machine's speed: at an assumed 10,000 polls per second a
  30 s wait lasted 40 s on a loaded 2-core machine.)

``spin_budget`` converts seconds into the unit of the mode. Flags hold epochs (iteration numbers,
counting from 1): a producer sets a flag to the current epoch and a consumer waits until the flag is
at least that epoch, so flags never need a reset between iterations (no host barrier race).

Device functions (call them from your own ``@triton.jit`` kernels):
    now(MODE) -> int64 timestamp: ns (NVIDIA), 10-ns ticks (AMD), host ns (interpreter)
    wait_geq(flag_ptr, target, budget, err_ptr, rank, peer, flag_index, kernel_id, MODE[, GPU_SCOPE, VOTE])
        -> ok (int1)
    signal(flag_ptr, value, from_rank, to_rank, heap_bases, MODE)  # release-set on a peer's heap (sys scope)
    cta_barrier(MODE)                                           # __syncthreads that keeps loops pipelined
    signal_add(flag_ptr, value, from_rank, to_rank, heap_bases) # release-add (arrival counters)
    signal_local(flag_ptr, value)                               # release-set on this rank's memory
    fence_tma_after_acquire(MODE)                               # before TMA reads of data a flag guarded
"""
from __future__ import annotations

import os
import time
from typing import Any

import iris
import torch
import triton
import triton.language as tl

from taxmodel.errors import RunError

SYNC_POLL = 0
SYNC_NVIDIA = 1
SYNC_AMD = 2

#: Error buffer layout (int64): what a kernel that gave up records, first failure wins.
ERR_FIELDS = ("failed", "rank", "peer", "flag_index", "kernel_id", "target", "seen", "waited")
ERR_LEN = len(ERR_FIELDS)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def sync_mode(device: torch.device | str | None = None) -> int:
    """The clock a wait should use on ``device`` (a constexpr argument for the kernels)."""
    dev = torch.device(device) if device is not None else None
    if interpreting() or dev is None or dev.type == "cpu":
        return SYNC_POLL
    if getattr(torch.version, "hip", None):
        return SYNC_AMD
    return SYNC_NVIDIA


def spin_budget(timeout_s: float, mode: int) -> int:
    """``timeout_s`` in the unit ``now(mode)`` counts in: 10-ns ticks on AMD, ns elsewhere (the
    interpreter's clock is the host's)."""
    if timeout_s <= 0:
        raise ValueError("spin timeout must be positive")
    if mode == SYNC_AMD:
        return int(timeout_s * 1e8)
    return max(1, int(timeout_s * 1e9))


def budget_seconds(units: int, mode: int) -> float:
    """Inverse of ``spin_budget`` (for messages)."""
    if mode == SYNC_AMD:
        return units / 1e8
    return units / 1e9


def new_error_buffer(device: torch.device | str) -> torch.Tensor:
    """A zeroed error record for one rank's kernels (int64 [ERR_LEN])."""
    return torch.zeros(ERR_LEN, dtype=torch.int64, device=device)


def check_errors(err: torch.Tensor, kernel_name: str | dict[int, str], ctx: Any = None,
                 mode: int | None = None) -> None:
    """Raise ``RunError`` if a kernel recorded a give-up in ``err``; reads the buffer (a host sync).

    ``kernel_name`` is a name, or a mapping kernel id -> name when several kernels share ``err``.
    """
    rec = [int(v) for v in err.detach().to("cpu").tolist()]
    if rec[0] == 0:
        return
    f = dict(zip(ERR_FIELDS, rec))
    if isinstance(kernel_name, dict):
        name = kernel_name.get(f["kernel_id"], f"kernel#{f['kernel_id']}")
    else:
        name = kernel_name
    if mode is None:
        mode = sync_mode(err.device)
    waited = budget_seconds(f["waited"], mode)
    amount = f"{waited:.3g} s"
    timeout = getattr(ctx, "spin_timeout_s", None)
    hint = (f" (spin timeout {timeout} s)" if timeout is not None else "")
    raise RunError(
        f"rank {f['rank']}: kernel {name} gave up waiting on flag {f['flag_index']} from rank {f['peer']} "
        f"after {amount}{hint}: it expected epoch >= {f['target']} and saw {f['seen']}. A peer rank "
        "crashed, was never launched, or is far slower; check the other ranks' logs, or raise the "
        "spin timeout if a peer is still compiling its kernels."
    )


def host_clock_ns() -> int:
    """The interpreter's stand-in for a device clock: the host's monotonic clock (ns), shared by
    every process of the host. Called from ``now`` only in its interpreter branch, which the GPU
    compiler prunes (``MODE`` is a constexpr); the builtin mark keeps Triton's dependency scan,
    which rejects plain Python callables in kernels, from refusing it."""
    return time.perf_counter_ns()


host_clock_ns.__triton_builtin__ = True  # type: ignore[attr-defined]


@triton.jit
def now(MODE: tl.constexpr):
    """A timestamp in the unit of ``MODE``: %globaltimer ns (1), s_memrealtime 10-ns ticks (2), or
    under the interpreter (0) the host's monotonic ns."""
    if MODE == 1:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                      is_pure=False, pack=1)
    elif MODE == 2:
        t = tl.inline_asm_elementwise("s_memrealtime $0\n s_waitcnt lgkmcnt(0)", "=s", [],
                                      dtype=tl.int64, is_pure=False, pack=1)
    else:
        t = tl.full((), host_clock_ns(), tl.int64)
    return t


@triton.jit
def cta_barrier(MODE: tl.constexpr):
    """Every thread of the program reaches this point before any goes on, and their memory
    operations before it are ordered before everything after it (``__syncthreads``).

    On NVIDIA (``MODE`` 1) an explicit ``bar.sync 0``, elsewhere ``tl.debug_barrier``. Why: Triton's
    software pipeliner (3.6, sm_90) leaves a loop unpipelined when its body holds
    ``tl.debug_barrier`` (one stage of loads in flight instead of ``num_stages``), and the GEMM
    engine's flattened tile loop holds the flag waits and releases (kernels/device/tile_gemm.py).
    The inline assembly has side effects, so neither LLVM nor ptxas moves memory operations across it.
    """
    if MODE == 1:
        tl.inline_asm_elementwise("bar.sync 0;\n mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.debug_barrier()


@triton.jit
def acquire_load(flag_ptr, GPU_SCOPE: tl.constexpr):
    """``*flag_ptr`` (a 32-bit flag) read by every thread with its own acquire (``ld.acquire``, system
    or GPU scope; NVIDIA only): a load, not a read-modify-write, so it costs one trip to L2."""
    tl.static_assert(flag_ptr.dtype.element_ty.primitive_bitwidth == 32, "acquire_load reads 32-bit flags")
    if GPU_SCOPE:
        v = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [flag_ptr], dtype=tl.int32,
                                      is_pure=False, pack=1)
    else:
        v = tl.inline_asm_elementwise("ld.acquire.sys.global.b32 $0, [$1];", "=r,l", [flag_ptr], dtype=tl.int32,
                                      is_pure=False, pack=1)
    return v


@triton.jit
def cta_all(pred):
    """1 in every thread if ``pred`` (an int32, per thread) is non-zero in every thread of the
    program, else 0: one CTA barrier that also votes (``bar.red.and``, CUDA's ``__syncthreads_and``;
    NVIDIA only). Every thread's memory operations before it are ordered before everything after."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred vote_in, vote_all; setp.ne.s32 vote_in, $1, 0; bar.red.and.pred vote_all, 0, vote_in; "
        "selp.s32 $0, 1, 0, vote_all; }",
        "=r,r", [pred], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def wait_geq(flag_ptr, target, budget, err_ptr, rank, peer, flag_index, kernel_id, MODE: tl.constexpr,
             GPU_SCOPE: tl.constexpr = False, VOTE: tl.constexpr = False):
    """Spin until ``*flag_ptr >= target`` with acquire semantics (system scope, or GPU scope with
    ``GPU_SCOPE`` for a flag only this GPU's programs release); bounded by ``budget``.

    Returns 1 if the flag arrived, 0 if this wait (or an earlier one of this launch sharing
    ``err_ptr``) gave up; on a give-up the first failure is recorded in ``err_ptr``.

    ``VOTE`` (NVIDIA, 32-bit flags): first every thread reads the flag once with its own acquire
    load and the program votes in one barrier (``cta_all``); when every thread saw it, the wait is
    over: one L2 trip and one barrier, where the spin below costs two trips (the volatile reads,
    then the acquire atomic) and two barriers. The GEMM engine waits once per remote tile, mostly on
    flags that already hold the epoch, so that difference is paid per tile. Otherwise (or without
    ``VOTE``) the bounded spin decides.
    """
    if VOTE and MODE == 1:
        arrived = cta_all((acquire_load(flag_ptr, GPU_SCOPE) >= target).to(tl.int32)) != 0
        ok = arrived
        if not arrived:  # the vote's outcome is the same in every thread: no divergent barriers
            ok = _spin_geq(flag_ptr, target, budget, err_ptr, rank, peer, flag_index, kernel_id, MODE, GPU_SCOPE)
    else:
        ok = _spin_geq(flag_ptr, target, budget, err_ptr, rank, peer, flag_index, kernel_id, MODE, GPU_SCOPE)
    return ok


@triton.jit
def _spin_geq(flag_ptr, target, budget, err_ptr, rank, peer, flag_index, kernel_id, MODE: tl.constexpr,
              GPU_SCOPE: tl.constexpr):
    """``wait_geq``'s bounded spin (its docstring)."""
    failed = tl.load(err_ptr, volatile=True)
    seen = tl.load(flag_ptr, volatile=True).to(tl.int64)
    target64 = tl.cast(target, tl.int64)
    start = now(MODE)
    waited = tl.full((), 0, tl.int64)
    while (seen < target64) & (waited < budget) & (failed == 0):
        seen = tl.load(flag_ptr, volatile=True).to(tl.int64)
        waited = now(MODE) - start
        failed = tl.load(err_ptr, volatile=True)
    # The loop ran in every thread on its own (a scalar lives in every thread), so threads can leave
    # it disagreeing: one saw the flag land, another timed out or saw another program's give-up.
    # Branching on such a per-thread outcome put CTA barriers (the atomics' broadcasts, the
    # caller's pipeline) in divergent code: misaligned barriers, and a CTA that hangs for good
    # instead of giving up. So the outcome is decided once per program: after a barrier the flag is
    # read again by a scalar atomic (one thread, broadcast to all), which is also the acquire and,
    # its result being used, one that no compiler drops (Triton 3.6 dropped the unused one). Flags
    # only grow, so a flag any thread saw is seen again.
    cta_barrier(MODE)
    if GPU_SCOPE:
        seen = tl.atomic_add(flag_ptr, tl.cast(0, flag_ptr.dtype.element_ty), sem="acquire", scope="gpu")
    else:
        seen = tl.atomic_add(flag_ptr, tl.cast(0, flag_ptr.dtype.element_ty), sem="acquire", scope="sys")
    seen = seen.to(tl.int64)
    ok = seen >= target64  # the same in every thread of the program
    if not ok:
        # First failure wins (the swap fails once err is set); the result is broadcast, too.
        old = tl.atomic_cas(err_ptr, tl.full((), 0, tl.int64), tl.full((), 1, tl.int64), sem="acq_rel",
                            scope="gpu")
        if old == 0:
            tl.store(err_ptr + 1, tl.cast(rank, tl.int64))
            tl.store(err_ptr + 2, tl.cast(peer, tl.int64))
            tl.store(err_ptr + 3, tl.cast(flag_index, tl.int64))
            tl.store(err_ptr + 4, tl.cast(kernel_id, tl.int64))
            tl.store(err_ptr + 5, target64)
            tl.store(err_ptr + 6, seen)
            tl.store(err_ptr + 7, waited)
    # Every thread's later reads follow the acquire (issued by one thread).
    cta_barrier(MODE)
    return ok


@triton.jit
def signal(flag_ptr, value, from_rank, to_rank, heap_bases, MODE: tl.constexpr = 0):
    """Release-set ``*flag_ptr`` (a pointer into this rank's heap) on ``to_rank``'s heap to ``value``.

    Everything this program stored before (to any rank) is visible to whoever acquires the flag.
    ``MODE`` (``sync_mode``) picks the CTA barrier (``cta_barrier``).
    """
    # Every thread's stores first (the release below is issued once per program), then release.
    cta_barrier(MODE)
    v = tl.cast(value, flag_ptr.dtype.element_ty)
    iris.atomic_xchg(flag_ptr, v, from_rank, to_rank, heap_bases, sem="release", scope="sys")


@triton.jit
def signal_add(flag_ptr, value, from_rank, to_rank, heap_bases):
    """Release-add ``value`` to a counter flag on ``to_rank``'s heap (for flags that count arrivals
    of the pieces of one block: the consumer waits until the count reaches pieces x epochs)."""
    tl.debug_barrier()
    v = tl.cast(value, flag_ptr.dtype.element_ty)
    iris.atomic_add(flag_ptr, v, from_rank, to_rank, heap_bases, sem="release", scope="sys")


@triton.jit
def signal_local(flag_ptr, value):
    """Release-set a flag in this rank's own memory (system scope: copy engines and peers may read it)."""
    tl.debug_barrier()
    tl.atomic_xchg(flag_ptr, tl.cast(value, flag_ptr.dtype.element_ty), sem="release", scope="sys")


@triton.jit
def fence_tma_after_acquire(MODE: tl.constexpr):
    """Order TMA (async-proxy) reads after an acquire done by ordinary loads (NVIDIA Hopper+).

    A no-op elsewhere; call it between ``wait_geq`` and tensor-descriptor loads of the guarded data.
    """
    if MODE == 1:
        tl.inline_asm_elementwise("fence.proxy.async.global;\n mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)

