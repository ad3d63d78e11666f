"""Timing helpers shared by the capture harness and the workloads' benchmark scripts.

GPU work is timed with CUDA events (device time, not host time); CPU work with the host's
monotonic clock. ``bench`` reports the median of many timed repetitions, the statistic every
benchmark table in this project uses, with the spread beside it so that a reader can judge
the noise. ``gpu_sleep`` makes a GPU busy-wait for a given time (the tax-injection harness uses
it to make one rank late) and is calibrated once per device.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch


def _is_cuda(device: torch.device | str | None) -> bool:
    return device is not None and torch.device(device).type == "cuda"


class Stopwatch:
    """Elapsed time of a block, in seconds: CUDA events on a GPU, the monotonic clock on CPU.

    >>> with Stopwatch("cpu") as sw: ...
    >>> sw.seconds
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._seconds: float | None = None

    def __enter__(self) -> "Stopwatch":
        if _is_cuda(self.device):
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        if _is_cuda(self.device):
            self._end.record()
            self._end.synchronize()
            self._seconds = self._start.elapsed_time(self._end) / 1e3
        else:
            self._seconds = time.perf_counter() - self._t0

    @property
    def seconds(self) -> float:
        if self._seconds is None:
            raise RuntimeError("Stopwatch read before its block ended")
        return self._seconds


@dataclass(frozen=True)
class BenchResult:
    """Times of one call in seconds over ``reps`` repetitions (each the mean of ``inner`` calls)."""

    median_s: float
    min_s: float
    p10_s: float
    p90_s: float
    reps: int
    inner: int
    device: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return (f"median {self.median_s * 1e6:.1f} us (p10 {self.p10_s * 1e6:.1f}, p90 {self.p90_s * 1e6:.1f}, "
                f"{self.reps} reps x {self.inner})")


def _quantile(sorted_values: list[float], q: float) -> float:
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bench(fn: Callable[[], Any], *, device: torch.device | str | None = None, reps: int = 20, inner: int = 1,
          warmup: int = 3, between: Callable[[], Any] | None = None) -> BenchResult:
    """Median of ``reps`` timings of ``inner`` back-to-back calls of ``fn`` (after ``warmup`` calls).

    ``between`` runs untimed before each repetition (e.g. a barrier between ranks, or a cache
    flush), so that repetitions are independent.
    """
    if reps < 1 or inner < 1:
        raise ValueError("bench needs reps >= 1 and inner >= 1")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    for _ in range(warmup):
        fn()
    if _is_cuda(dev):
        torch.cuda.synchronize(dev)
    times = []
    for _ in range(reps):
        if between is not None:
            between()
        with Stopwatch(dev) as sw:
            for _ in range(inner):
                fn()
        times.append(sw.seconds / inner)
    times.sort()
    return BenchResult(median_s=statistics.median(times), min_s=times[0], p10_s=_quantile(times, 0.1),
                       p90_s=_quantile(times, 0.9), reps=reps, inner=inner, device=str(dev))


# --- making a GPU (or a CPU rank) late on purpose ----------------------------------------------

_CYCLES_PER_US: dict[str, float] = {}
_CALIBRATION_CYCLES = 2_000_000


def spin_cycles_per_us(device: torch.device | str) -> float:
    """GPU clock cycles per microsecond as ``torch.cuda._sleep`` sees them (measured once per device)."""
    key = str(torch.device(device))
    if key not in _CYCLES_PER_US:
        with torch.cuda.device(torch.device(device)):
            torch.cuda._sleep(1000)  # load the kernel
            torch.cuda.synchronize()
            samples = []
            for _ in range(5):
                with Stopwatch(device) as sw:
                    torch.cuda._sleep(_CALIBRATION_CYCLES)
                samples.append(_CALIBRATION_CYCLES / (sw.seconds * 1e6))
        _CYCLES_PER_US[key] = statistics.median(samples)
    return _CYCLES_PER_US[key]


def gpu_sleep(us: float, device: torch.device | str) -> None:
    """Enqueue a GPU busy-wait of about ``us`` microseconds on the current stream (no host wait).

    On CPU the host sleeps instead (emulated ranks run their work synchronously).
    """
    if us <= 0:
        return
    if _is_cuda(device):
        torch.cuda._sleep(int(us * spin_cycles_per_us(device)))
    else:
        time.sleep(us / 1e6)


SLEEP_KERNEL_PATTERN = r"spin_kernel|taxmodel_inject_sleep"
"""Kernel names of the injected sleep (torch.cuda._sleep's kernel; the CPU stand-in)."""


def traced_events(body: Callable[[], object], *, host: bool = False):
    """What a torch.profiler trace of ``body()`` saw, as taxmodel's Kineto importer reads it (events
    with ns times; the GPU's kernels, and with ``host`` the host's launch calls too)."""
    import os
    import tempfile
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile

    from taxmodel.trace import kineto

    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if host else [])
    with profile(activities=activities) as prof:
        body()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "calibrate_trace.json")
        prof.export_chrome_trace(path)
        events, _ = kineto.read([Path(path)])
    return events
