"""Copy-engine transfers between symmetric heaps, each block followed by an epoch flag write.

Why: a DMA copy engine moves a block over NVLink without taking a single SM away from the GEMM,
and a stream memory operation (``cuStreamWriteValue32``, which fences the stream's earlier writes
system-wide before it lands) publishes "block j of epoch e is here" without a kernel launch. The
GEMM then waits on that flag with the usual bounded acquire (``kernels/device/sync.py``). Iris's own
copy-engine ``put`` drives AMD SDMA queues only; on NVIDIA the driver's copy engines are reached
through ``cuMemcpyAsync`` on UVA addresses (the peers' heaps are mapped into this process).

Addresses are (rank, byte offset inside that rank's heap), so the same call pushes (destination =
a peer) or pulls (source = a peer). On CPU ranks (threads or processes sharing memory, Triton's
interpreter) the same calls copy bytes between the heaps' host views and store the flag at once:
the host thread is the "stream", so every earlier copy is complete before the flag is written.

``signal="kernel"`` replaces the stream memory operation by a one-program Triton kernel doing a
system-scope release ``atomic_xchg`` through Iris (for drivers without stream memory operations).
"""
from __future__ import annotations

import ctypes
from typing import Any

import torch
import triton

from taxmodel.errors import RunError
from taxmodel.kernels.device.sync import signal


@triton.jit
def _flag_kernel(flag_ptr, value, from_rank, to_rank, heap_bases):
    """Release-set one flag on ``to_rank``'s heap (one program, no shared memory: fits beside a GEMM)."""
    signal(flag_ptr, value, from_rank, to_rank, heap_bases)


class _Driver:
    """The two CUDA driver entry points used here, through ctypes (no extra package needed)."""

    _lib: Any = None

    @classmethod
    def lib(cls) -> Any:
        if cls._lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as exc:
                raise RunError(f"copy-engine transport needs the CUDA driver library (libcuda.so.1): {exc}") from exc
            lib.cuMemcpyAsync.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
            lib.cuMemcpyAsync.restype = ctypes.c_int
            write = getattr(lib, "cuStreamWriteValue32_v2", None) or lib.cuStreamWriteValue32
            write.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            write.restype = ctypes.c_int
            lib.write_value32 = write
            lib.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
            lib.cuMemsetD32Async.restype = ctypes.c_int
            cls._lib = lib
        return cls._lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RunError(f"{what} failed with CUDA driver error {rc}; use the 'kernel' flag signal or the "
                       "'sm' transport if this driver lacks stream memory operations or peer access")


class CopyEngine:
    """Block copies and flag writes between the ranks of one symmetric heap.

    ``heap`` must be the heap the buffers were allocated on (offsets are taken relative to it);
    ``signal`` is "mem" (stream memory operation) or "kernel" (see the module docstring).
    """

    def __init__(self, heap: Any, device: torch.device, signal: str = "mem") -> None:
        if signal not in ("mem", "kernel"):
            raise ValueError(f"unknown flag signal {signal!r}: use 'mem' or 'kernel'")
        self.heap = heap
        self.rank = heap.rank
        self.device = torch.device(device)
        self.signal = signal
        self.cuda = self.device.type == "cuda"
        self.bases = [int(b) for b in heap.heap_bases.tolist()]
        self.heap_bases = heap.heap_bases
        if self.cuda:
            _Driver.lib()
        elif not hasattr(heap, "peer"):
            raise RunError(f"{type(heap).__name__} gives no host view of the peers' heaps: the copy-engine "
                           "transport on CPU needs a ThreadHeap or a SharedMemoryHeap")

    def offset_of(self, tensor: torch.Tensor) -> int:
        return self.heap.offset_of(tensor)

    def copy(self, dst_rank: int, dst_off: int, src_rank: int, src_off: int, nbytes: int,
             stream: Any = None) -> None:
        """Copy ``nbytes`` from (src_rank, src_off) to (dst_rank, dst_off), asynchronously on ``stream``."""
        if nbytes <= 0:
            return
        if self.cuda:
            handle = ctypes.c_void_p(stream.cuda_stream if stream is not None else 0)
            _check(_Driver.lib().cuMemcpyAsync(self.bases[dst_rank] + dst_off, self.bases[src_rank] + src_off,
                                               nbytes, handle), "cuMemcpyAsync")
        else:
            dst = self.heap.peer(dst_rank)[dst_off:dst_off + nbytes]
            dst.copy_(self.heap.peer(src_rank)[src_off:src_off + nbytes])

    def write_flag(self, dst_rank: int, flags: torch.Tensor, index: int, value: int, stream: Any = None) -> None:
        """Set int32 flag ``flags[index]`` (a tensor on this rank's heap) on ``dst_rank``'s heap to
        ``value`` once every earlier copy on ``stream`` has landed."""
        off = self.offset_of(flags) + index * flags.element_size()
        if self.cuda:
            if self.signal == "mem":
                handle = ctypes.c_void_p(stream.cuda_stream if stream is not None else 0)
                _check(_Driver.lib().write_value32(handle, self.bases[dst_rank] + off, value & 0xFFFFFFFF, 0),
                       "cuStreamWriteValue32")
            else:
                with torch.cuda.stream(stream):
                    _flag_kernel[(1,)](flags[index:], value, self.rank, dst_rank, self.heap_bases, num_warps=1)
        else:
            view = self.heap.peer(dst_rank)[off:off + 4].view(torch.int32)
            view.fill_(value)

    def reset_flags(self, flags: torch.Tensor, stream: Any = None) -> None:
        """Zero this rank's int32 ``flags`` on ``stream`` (a memset node where a graph captures it)."""
        if self.cuda:
            handle = ctypes.c_void_p(stream.cuda_stream if stream is not None else 0)
            _check(_Driver.lib().cuMemsetD32Async(flags.data_ptr(), 0, flags.numel(), handle), "cuMemsetD32Async")
        else:
            flags.zero_()
