"""What the calibration's microbenchmarks of the workloads' own kernels share: each kernel's device
time as a trace sees it, and where those kernels run.

``kernel_seconds`` traces one call of a body (``timing.traced_events``: torch.profiler, read by
taxmodel's Kineto importer) and returns the durations of the kernels whose names match each pattern,
so a measurement is the kernel's own time, without launch latency or host gaps; two kernels that run
at once on two streams are each timed whole. In Triton's interpreter (CPU tests: the code paths at
tiny sizes) there is no device trace: every pattern gets the host time of the body, which says
nothing about a GPU but lets the fits run on the same rows.

``pseudo_peer_heap`` gives one GPU a two-rank symmetric heap on itself (``heap_bases`` of two halves
of one buffer), so that a kernel written for peers (the All-Gather copy kernel) runs where no peer
exists: its loads and stores then go through the GPU's own memory instead of a link. A calibration
on one GPU measures what it can that way and says so.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping

import torch

from taxmodel.runtime.heap import SymmetricHeap


def on_gpu(device: torch.device | str) -> bool:
    """Whether ``device`` runs kernels on a GPU (not Triton's interpreter)."""
    from taxmodel.kernels.device.sync import interpreting

    return torch.device(device).type == "cuda" and not interpreting()


def kernel_seconds(device: torch.device | str, body: Callable[[], object],
                   patterns: Mapping[str, str]) -> dict[str, list[float]]:
    """Per label, the durations (s) of the kernels whose names contain ``patterns[label]`` (a regular
    expression) in one traced call of ``body``; on CPU the host time of ``body``, once per label."""
    if not on_gpu(device):
        t0 = time.perf_counter()
        body()
        dt = time.perf_counter() - t0
        return {label: [dt] for label in patterns}
    from taxmodel.runtime.timing import traced_events

    def traced() -> None:
        body()
        torch.cuda.synchronize(device)

    ev = traced_events(traced)
    ker = ev[ev["kind"] == "kernel"]
    dur = (ker["end_ns"] - ker["start_ns"]) * 1e-9
    name = ker["name"].astype(str)
    return {label: dur[name.str.contains(pat, regex=True)].tolist() for label, pat in patterns.items()}


def median_seconds(durations: Mapping[str, list[float]], label: str, what: str) -> float:
    """The median of ``durations[label]``; RuntimeError naming ``what`` when the trace had none."""
    values = durations.get(label) or []
    if not values:
        raise RuntimeError(f"the profiler trace has no {what} kernels (no GPU profiler?)")
    return float(statistics.median(values))


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


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
