"""Symmetric heaps: memory every rank can address, for kernels that load and store into peers.

Iris's device functions (``iris.load/store/atomic_*``) take a pointer into the caller's heap
and a ``heap_bases`` table (one address per rank) and translate the pointer to the same offset
in the target rank's heap. Any provider works as long as (1) every rank's heap is mapped into
every rank's address space and (2) every rank allocates the same tensors in the same order, so
a tensor sits at the same offset everywhere. The providers here differ only in where the bytes
come from:

- ``TorchSymmetricHeap`` (NVIDIA): one ``torch.distributed._symmetric_memory`` allocation per
  rank; ``heap_bases`` are its peer pointers (Iris's own host setup needs DMA-BUF/HIP and fails
  on NVIDIA).
- ``IrisHeap`` (AMD): Iris's own host object, ``iris.iris(heap_size)``.
- ``SharedMemoryHeap`` (CPU, ranks as processes): one shared-memory file per rank, mapped by
  every rank; ``heap_bases`` are the local addresses of those mappings, so raw-pointer loads
  in Triton's interpreter (``TRITON_INTERPRET=1``) reach peers.
- ``ThreadHeap`` (CPU, ranks as threads of one process, for unit tests): plain CPU tensors.

NVLink multicast is never used: no provider calls a multicast API (see ``NO_MULTICAST_ENV``).
"""
from __future__ import annotations

import mmap
import os
import threading
import uuid
from pathlib import Path
from typing import Any, Sequence

import torch

from taxmodel.errors import RunError, UnavailableError

ALIGNMENT = 256
"""Byte alignment of every sub-allocation: enough for any dtype and for vectorized loads."""

NO_MULTICAST_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""Environment that keeps NVLink multicast (NVLS) off; set in every rank and launcher child."""


def disable_multicast(env: dict[str, str] | None = None) -> dict[str, str]:
    """Set ``NO_MULTICAST_ENV`` in ``env`` (default: this process's environment); return it."""
    target = os.environ if env is None else env
    target.update(NO_MULTICAST_ENV)
    return target  # type: ignore[return-value]


def _align(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def _shape_tuple(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)


class SymmetricHeap:
    """One rank's view of a symmetric heap: its own bytes plus the peers' base addresses.

    Subclasses provide ``_local`` (a uint8 tensor: this rank's heap), ``heap_bases``, and
    ``barrier()``. Allocation is a bump allocator over ``_local`` at ``ALIGNMENT``-byte offsets;
    because every rank makes the same allocations in the same order, offsets match.
    """

    rank: int
    world_size: int
    device: torch.device
    heap_bases: torch.Tensor  # int64 [world_size] on ``device``
    _local: torch.Tensor  # uint8 [nbytes]

    def __init__(self) -> None:
        self._offset = 0

    # -- allocation ------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return int(self._local.numel())

    @property
    def used_bytes(self) -> int:
        return self._offset

    def empty(self, shape: int | Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """An uninitialized tensor on this rank's heap (same offset on every rank)."""
        shape = _shape_tuple(shape)
        count = 1
        for s in shape:
            count *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        size = count * itemsize
        start = _align(self._offset)
        if start + size > self.nbytes:
            raise RunError(
                f"rank {self.rank}: symmetric heap full ({self.nbytes} bytes, {start} used, "
                f"{size} more asked for a {list(shape)} {dtype} tensor); raise the heap size"
            )
        self._offset = start + size
        return self._local[start:start + size].view(dtype).view(shape)

    def zeros(self, shape: int | Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        t = self.empty(shape, dtype)
        t.zero_()
        return t

    def reset(self) -> None:
        """Forget every allocation (tensors handed out earlier must no longer be used)."""
        self._offset = 0

    def offset_of(self, tensor: torch.Tensor) -> int:
        """Byte offset of ``tensor`` inside this rank's heap."""
        off = tensor.data_ptr() - self._local.data_ptr()
        if not 0 <= off < self.nbytes:
            raise ValueError("tensor does not live on this symmetric heap")
        return off

    # -- synchronization -------------------------------------------------------------------
    def barrier(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release the heap (idempotent)."""

    def __enter__(self) -> "SymmetricHeap":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size}, nbytes={self.nbytes}, used={self._offset})"


# --- CPU: ranks as threads ---------------------------------------------------------------------


class ThreadHeap(SymmetricHeap):
    """Ranks as threads of one process: each rank's heap is a CPU tensor, all share one table.

    Build a whole group with ``ThreadHeap.group(world_size, nbytes)``; hand heap ``r`` to the
    thread playing rank ``r``.
    """

    def __init__(self, rank: int, buffers: list[torch.Tensor], heap_bases: torch.Tensor,
                 barrier: threading.Barrier) -> None:
        super().__init__()
        self.rank = rank
        self.world_size = len(buffers)
        self.device = torch.device("cpu")
        self._buffers = buffers
        self._local = buffers[rank]
        self.heap_bases = heap_bases
        self._barrier = barrier

    @classmethod
    def group(cls, world_size: int, nbytes: int, barrier_timeout_s: float = 120.0) -> list["ThreadHeap"]:
        buffers = [torch.zeros(_align(nbytes), dtype=torch.uint8) for _ in range(world_size)]
        bases = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
        barrier = threading.Barrier(world_size, timeout=barrier_timeout_s)
        return [cls(r, buffers, bases, barrier) for r in range(world_size)]

    def peer(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s whole heap as uint8 (for tests that inspect what peers wrote)."""
        return self._buffers[rank]

    def barrier(self) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError as exc:
            raise RunError(f"rank {self.rank}: heap barrier broken (another rank failed or timed out)") from exc


# --- CPU: ranks as processes -------------------------------------------------------------------


def _shm_dir() -> Path:
    d = Path("/dev/shm")
    if d.is_dir() and os.access(d, os.W_OK):
        return d
    import tempfile

    return Path(tempfile.gettempdir())


class SharedMemoryHeap(SymmetricHeap):
    """Ranks as processes on one host: one shared-memory file per rank, mapped by every rank.

    Rank 0 picks a unique name prefix and broadcasts it over ``group`` (a gloo process group;
    ``None`` only for world size 1). Each rank creates and sizes its own file, all ranks map all
    files, and the files are unlinked once everyone has mapped them, so nothing is left in
    /dev/shm even if a rank dies later. ``heap_bases`` holds the local address of every
    mapping; they differ between processes, which is exactly what Iris's translation expects.
    """

    def __init__(self, rank: int, world_size: int, nbytes: int, group: Any = None) -> None:
        super().__init__()
        import torch.distributed as dist

        if world_size > 1 and not (dist.is_available() and dist.is_initialized()):
            raise RunError("SharedMemoryHeap needs torch.distributed initialized (gloo) for more than one rank")
        self.rank, self.world_size, self.device = rank, world_size, torch.device("cpu")
        self._group = group
        nbytes = _align(max(int(nbytes), ALIGNMENT))
        prefix = [f"taxmodel-heap-{uuid.uuid4().hex[:12]}"] if rank == 0 else [None]
        if world_size > 1:
            dist.broadcast_object_list(prefix, src=0, group=group)
        directory = _shm_dir()
        paths = [directory / f"{prefix[0]}-r{r}" for r in range(world_size)]
        self.paths = paths  # unlinked once mapped; kept to show nothing is left behind
        self._maps: list[mmap.mmap] = []
        self._views: list[torch.Tensor] = []
        try:
            fd = os.open(paths[rank], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, nbytes)
            finally:
                os.close(fd)
            self._dist_barrier()
            for p in paths:
                fd = os.open(p, os.O_RDWR)
                try:
                    m = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                finally:
                    os.close(fd)
                self._maps.append(m)
                self._views.append(torch.frombuffer(m, dtype=torch.uint8))
            self._dist_barrier()
        finally:
            try:
                os.unlink(paths[rank])
            except FileNotFoundError:
                pass
        self._local = self._views[rank]
        self.heap_bases = torch.tensor([v.data_ptr() for v in self._views], dtype=torch.int64)

    def _dist_barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier(group=self._group)

    def peer(self, rank: int) -> torch.Tensor:
        return self._views[rank]

    def barrier(self) -> None:
        self._dist_barrier()

    def close(self) -> None:
        # Tensors made by torch.frombuffer keep exported buffers alive; drop them first.
        self._views = []
        self._local = torch.empty(0, dtype=torch.uint8)
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass  # a tensor handed out by empty() is still alive; the OS frees it at exit
        self._maps = []


# --- NVIDIA: torch symmetric memory ------------------------------------------------------------


class TorchSymmetricHeap(SymmetricHeap):
    """NVIDIA: one ``torch.distributed._symmetric_memory`` allocation; peers' pointers as bases."""

    def __init__(self, rank: int, world_size: int, nbytes: int, device: torch.device, group: Any = None) -> None:
        super().__init__()
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        disable_multicast()
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        self._group = group if group is not None else dist.group.WORLD
        self._local = symm_mem.empty(_align(int(nbytes)), dtype=torch.uint8, device=self.device)
        group_name = self._group.group_name
        self._handle = symm_mem.rendezvous(self._local, group_name)
        ptrs = [int(p) for p in self._handle.buffer_ptrs]
        if len(ptrs) != world_size:
            raise RunError(f"rank {rank}: symmetric-memory rendezvous gave {len(ptrs)} peer pointers for {world_size} ranks")
        self.heap_bases = torch.tensor(ptrs, dtype=torch.int64, device=self.device)
        self._local.zero_()
        self.barrier()

    def barrier(self) -> None:
        import torch.distributed as dist

        torch.cuda.synchronize(self.device)
        dist.barrier(group=self._group, device_ids=[self.device.index] if self.device.index is not None else None)
        torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self._handle = None


# --- AMD: Iris ---------------------------------------------------------------------------------


class IrisHeap(SymmetricHeap):
    """AMD: Iris's own heap (``iris.iris(heap_size)``). Untested here (no AMD GPU available)."""

    def __init__(self, nbytes: int) -> None:
        super().__init__()
        try:
            import iris
        except ImportError as exc:
            raise UnavailableError("IrisHeap needs Iris: pip install tokenspeed-iris") from exc
        self._iris = iris.iris(_align(int(nbytes)))
        self.rank = int(self._iris.get_rank())
        self.world_size = int(self._iris.get_num_ranks())
        self.device = torch.device(self._iris.get_device())
        self.heap_bases = self._iris.get_heap_bases().to(torch.int64)
        self._local = torch.empty(0, dtype=torch.uint8)

    @property
    def nbytes(self) -> int:
        return int(self._iris.heap_size)

    def empty(self, shape: int | Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._iris.empty(*_shape_tuple(shape), dtype=dtype)

    def zeros(self, shape: int | Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._iris.zeros(*_shape_tuple(shape), dtype=dtype)

    def offset_of(self, tensor: torch.Tensor) -> int:
        return tensor.data_ptr() - int(self.heap_bases[self.rank].item())

    def reset(self) -> None:
        raise UnavailableError("IrisHeap cannot forget allocations; make a new heap instead")

    def barrier(self) -> None:
        self._iris.barrier()


def make_heap(ctx: Any, nbytes: int) -> SymmetricHeap:
    """The provider that fits ``ctx`` (a RankContext): CUDA -> torch symmetric memory,
    ROCm -> Iris, CPU -> shared memory between the rank processes."""
    device = torch.device(ctx.device)
    if device.type == "cuda":
        if getattr(torch.version, "hip", None):
            return IrisHeap(nbytes)
        return TorchSymmetricHeap(ctx.rank, ctx.world_size, nbytes, device, ctx.group)
    if device.type == "cpu":
        return SharedMemoryHeap(ctx.rank, ctx.world_size, nbytes, ctx.group)
    raise UnavailableError(f"no symmetric heap for device type '{device.type}'; use --device cuda or cpu")
