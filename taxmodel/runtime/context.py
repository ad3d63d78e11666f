"""What one rank knows about the run it takes part in, handed to every workload call.

A workload never asks torch.distributed or the environment directly: it gets a ``RankContext``
(rank, world size, device, process group, symmetric heap, whether kernels run in Triton's
interpreter) so that the same code runs as real GPU ranks, as CPU processes, or as threads in a
unit test.

``run_in_threads`` is the cheapest way to exercise a fine-grained protocol: every rank is a
thread of this process with a ``ThreadHeap``, kernels run in Triton's interpreter
(``TRITON_INTERPRET=1`` must be set before the kernel module is imported).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import torch

from taxmodel.errors import RunError
from taxmodel.runtime.heap import SymmetricHeap, ThreadHeap, make_heap
from taxmodel.runtime.records import RecordBuffer, record_buffer

KERNEL_RANGE_PREFIX = "kernel::"
"""Prefix of the record_function ranges that stand for kernels on CPU (see ``RankContext.kernel``)."""

T = TypeVar("T")


@dataclass
class RankContext:
    """One rank's view of the run.

    ``backend`` is the torch.distributed backend ("nccl", "gloo"), or "threads" for ranks that
    are threads of one process (``group`` is then None and ``barrier`` goes through the heap).
    ``spin_timeout_s`` bounds every in-kernel wait on a flag. ``instrument`` asks fused kernels to
    write in-kernel trace records (phase timings) where they support it.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    group: Any = None
    heap: SymmetricHeap | None = None
    interpret: bool = False
    spin_timeout_s: float = 60.0
    instrument: bool = False
    records: Any = None  # taxmodel.runtime.records.RecordBook of the instrumented kernels (made on first use)
    injector: Any = None  # taxmodel.runtime.inject.Injector while the harness injects taxes

    @property
    def is_cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    @property
    def emulated(self) -> bool:
        """True when no GPU runs the kernels (CPU tensors, Triton interpreter): kernel rows in
        traces then come from ``kernel()`` ranges rather than from a GPU tracer."""
        return not self.is_cuda

    def kernel(self, name: str) -> contextlib.AbstractContextManager:
        """Mark the enqueueing of one kernel named ``name``.

        On a GPU this does nothing (the tracer sees the real kernel). On CPU the work runs
        synchronously inside the range, so a ``record_function("kernel::<name>")`` range is the
        kernel's execution, and capture turns it into a kernel row.

        It is also where the tax-injection harness adds work between stages (extra launches,
        an extra copy of an intermediate), so workloads wrap every launch in it on every device.
        """
        if self.injector is not None:
            self.injector.before_kernel(name)
        if self.is_cuda:
            return contextlib.nullcontext()
        return torch.profiler.record_function(KERNEL_RANGE_PREFIX + name)

    def new_heap(self, nbytes: int) -> SymmetricHeap:
        """A new symmetric heap of ``nbytes`` on every rank, from the provider that fits this
        context's device (collective: every rank asks in the same order). Workloads ask the
        context rather than the runtime's heap module, so ``kernels/`` imports nothing above it."""
        return make_heap(self, nbytes)

    def record_buffer(self, kernel: str, layout: Any, device: torch.device | str) -> RecordBuffer | None:
        """Kernel ``kernel``'s in-kernel record buffer when ``instrument`` is set, else None (the
        kernel then compiles without records). ``layout``: a ``kernels.device.records.RecordLayout``
        or a CTA count; see ``taxmodel.runtime.records.record_buffer``."""
        return record_buffer(self, kernel, layout, device)

    def synchronize(self) -> None:
        """Wait for this rank's queued GPU work (no-op on CPU)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        """All ranks meet here, with their queued GPU work finished."""
        self.synchronize()
        if self.backend == "threads":
            if self.heap is None:
                raise RunError("a thread-rank context needs a heap to synchronize through")
            self.heap.barrier()
            return
        if self.world_size > 1:
            import torch.distributed as dist

            if self.backend == "nccl" and self.is_cuda:
                dist.barrier(group=self.group, device_ids=[torch.device(self.device).index or 0])
            else:
                dist.barrier(group=self.group)
        self.synchronize()


_INTERPRETER_SHIM_LOCK = threading.Lock()


def make_interpreter_thread_safe() -> None:
    """Let several threads run Triton-interpreter kernels at the same time.

    Triton's interpreter keeps the current program id and grid in one global builder and
    patches ``triton.language`` for the duration of each launch, restoring it when the launch
    ends. With ranks as threads, one rank's kernel finishing would unpatch the language under a
    peer still spinning on a flag, and program ids would leak between ranks. This makes the
    grid state thread-local and the patching reference-counted (patched while any launch runs),
    and rewrites kernels' source one thread at a time (``_serialize_rewrites``). Idempotent; a no-op when the interpreter's internals are not the ones this was written for.
    """
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return
    with _INTERPRETER_SHIM_LOCK:
        if getattr(interp, "_taxmodel_thread_safe", False):
            return
        builder_cls = getattr(interp, "InterpreterBuilder", None)
        real_patch = getattr(interp, "_patch_lang", None)
        if builder_cls is None or real_patch is None:
            return
        local = threading.local()

        def _attr(name: str) -> property:
            return property(lambda self: getattr(local, name, None), lambda self, v: setattr(local, name, v))

        builder_cls.grid_idx = _attr("grid_idx")
        builder_cls.grid_dim = _attr("grid_dim")

        # Launches in flight over all threads; the first one's scope restores the language.
        state: dict[str, Any] = {"depth": 0, "scope": None}
        lock = threading.RLock()

        class _SharedScope:
            def __init__(self) -> None:
                self._done = False

            def restore(self) -> None:
                with lock:
                    if self._done:
                        return
                    self._done = True
                    local.launches -= 1
                    state["depth"] -= 1
                    if state["depth"] == 0 and state["scope"] is not None:
                        state["scope"].restore()
                        state["scope"] = None

        def patch_lang(fn: Any) -> Any:
            with lock:
                if getattr(local, "launches", 0) > 0:
                    # A device function called from a kernel this thread runs: its scope is
                    # never restored by the interpreter, so it must not count as a launch.
                    return real_patch(fn)
                if state["depth"] == 0:
                    state["scope"] = real_patch(fn)
                else:
                    real_patch(fn)  # patches what this fn sees; the first scope restores it
                state["depth"] += 1
                local.launches = 1
                return _SharedScope()

        interp._patch_lang = patch_lang
        _serialize_rewrites(interp)
        interp._taxmodel_thread_safe = True


def _serialize_rewrites(interp: Any) -> None:
    """One thread at a time rewrites a kernel's source for the interpreter (``ast.parse`` and
    ``compile`` on its first call): CPython 3.11 keeps the AST constructor's recursion depth in
    interpreter-wide state, and two threads parsing at once failed a thread-rank test in CI with
    "AST constructor recursion depth mismatch"."""
    rewriter = getattr(interp, "FunctionRewriter", None)
    real = getattr(rewriter, "rewrite_ast", None)
    if real is None:
        return
    lock = threading.Lock()

    def rewrite_ast(self: Any) -> Any:
        with lock:
            return real(self)

    rewriter.rewrite_ast = rewrite_ast


def thread_contexts(world_size: int, heap_bytes: int = 1 << 20, *, interpret: bool = True,
                    spin_timeout_s: float = 30.0) -> list[RankContext]:
    """One context per thread-rank, sharing a ``ThreadHeap`` group (CPU tensors)."""
    make_interpreter_thread_safe()
    heaps = ThreadHeap.group(world_size, heap_bytes)
    return [
        RankContext(rank=r, world_size=world_size, local_rank=r, device=torch.device("cpu"), backend="threads",
                    group=None, heap=heaps[r], interpret=interpret, spin_timeout_s=spin_timeout_s)
        for r in range(world_size)
    ]


def run_in_threads(world_size: int, fn: Callable[[RankContext], T], heap_bytes: int = 1 << 20, *,
                   timeout_s: float = 120.0, spin_timeout_s: float = 30.0) -> list[T]:
    """Run ``fn(ctx)`` on ``world_size`` thread-ranks; return the results in rank order.

    The first exception of any rank is re-raised (as RunError naming the rank, chained); a rank
    still running after ``timeout_s`` is a RunError. Kernels run in Triton's interpreter only if
    ``TRITON_INTERPRET=1`` was set before they were defined.
    """
    ctxs = thread_contexts(world_size, heap_bytes, spin_timeout_s=spin_timeout_s)
    results: list[Any] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def body(ctx: RankContext) -> None:
        try:
            results[ctx.rank] = fn(ctx)
        except BaseException as exc:  # noqa: BLE001 - reported below with the rank
            errors[ctx.rank] = exc
            ctx.heap._barrier.abort()  # type: ignore[union-attr]  # release peers waiting on us

    threads = [threading.Thread(target=body, args=(c,), name=f"rank{c.rank}", daemon=True) for c in ctxs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    hung = [i for i, t in enumerate(threads) if t.is_alive()]
    # A rank whose own error caused others to fail is the one worth reporting: prefer
    # errors that are not the broken-barrier echo.
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    primary = [(r, e) for r, e in failed if "barrier broken" not in str(e)] or failed
    if primary:
        rank, exc = primary[0]
        raise RunError(f"rank {rank}: {type(exc).__name__}: {exc}") from exc
    if hung:
        raise RunError(f"rank(s) {hung} still running after {timeout_s:g} s (a spin-wait that never ends?)")
    return results
