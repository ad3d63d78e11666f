"""Where the calibration's microbenchmarks of the workloads' own kernels run when peers are
missing. (Their kernels' device times come from a trace: ``timing.kernel_seconds``.)

``PseudoPeerHeap`` gives one GPU a two-rank symmetric heap on itself (``heap_bases`` of two halves
of one buffer), so that a kernel written for peers (the All-Gather copy kernel) runs where no peer
exists: its loads and stores then go through the GPU's own memory instead of a link. A calibration
on one GPU measures what it can that way and says so. ``LocalHeap`` is a heap of one rank.
"""
from __future__ import annotations

import torch

from taxmodel.runtime.heap import SymmetricHeap
from taxmodel.runtime.timing import synchronize


class PseudoPeerHeap(SymmetricHeap):
    """Two "ranks" on one GPU: one buffer of ``2 x nbytes``, rank 0 the first half, rank 1 the
    second (``heap_bases`` as Iris translates pointers); tensors are allocated in rank 0's half,
    each with its twin ``nbytes`` further in rank 1's."""

    def __init__(self, nbytes: int, device: torch.device | str) -> None:
        super().__init__()
        self.rank, self.world_size, self.device = 0, 2, torch.device(device)
        n = (int(nbytes) + 4095) // 4096 * 4096
        self._both = torch.zeros(2 * n, dtype=torch.uint8, device=self.device)
        self._local = self._both[:n]
        base = self._both.data_ptr()
        self.heap_bases = torch.tensor([base, base + n], dtype=torch.int64, device=self.device)

    def barrier(self) -> None:
        synchronize(self.device)

    def close(self) -> None:
        self._both = self._local = None  # type: ignore[assignment]


class LocalHeap(SymmetricHeap):
    """One rank on one GPU: a symmetric heap of a single rank (``heap_bases`` holds its own base), so
    that a kernel written for peers runs at world size 1, as ``taxmodel profile -n 1`` runs it: its
    pushes to "every rank" are stores into its own memory, and no wait has a peer."""

    def __init__(self, nbytes: int, device: torch.device | str) -> None:
        super().__init__()
        self.rank, self.world_size, self.device = 0, 1, torch.device(device)
        n = (int(nbytes) + 4095) // 4096 * 4096
        self._local = torch.zeros(n, dtype=torch.uint8, device=self.device)
        self.heap_bases = torch.tensor([self._local.data_ptr()], dtype=torch.int64, device=self.device)

    def barrier(self) -> None:
        synchronize(self.device)

    def close(self) -> None:
        self._local = None  # type: ignore[assignment]
