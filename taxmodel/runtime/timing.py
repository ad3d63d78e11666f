"""How this project times work: the one place where a benchmark script, ``taxmodel calibrate`` and
the capture harness get a time from.

The method, piece by piece (each caller composes the pieces its results were always measured with,
so that the numbers stay comparable with the committed ones):

- **a sample**: ``calls`` back-to-back calls of a body between two CUDA events (device time, not
  host time; the host's monotonic clock on CPU), divided by ``calls`` (``Stopwatch``, ``time_ms``).
  ``Stopwatch(wait=False)`` leaves the end event unread until asked, so that samples can be queued
  back to back without the host waiting between them.
- **warm-up**: untimed calls before the first sample (``warm_up``; compiles, caches, lazy
  initializations), never counted.
- **interleaving**: the things compared take turns sample by sample (``interleave``,
  ``time_interleaved``; ``rotate`` also changes which goes first), so that drifts of clocks or
  temperature hit them alike.
- **CUDA-graph replays**: the body's calls captured once in a graph (``capture_graph``, after a
  warm-up on a side stream, ``side_stream_warm_up``) and a sample is one replay, so the host's
  launch cost is out of the time; eager batches where a caller measures what an eager loop sees.
- **several ranks**: a barrier before every sample and the maximum over ranks after it (the
  slowest rank sets the pace), a capture failing on any rank failing on all (``SampleTimer``).
- **the statistic**: the median of the samples, with their spread beside it (``spread``,
  ``decile_range``) so that a reader can judge the noise.
- **kernel time from a trace**: what a torch.profiler trace of a call saw (``traced_events``), the
  durations of the kernels of given names in it (``kernel_seconds``, ``median_seconds``) or of all
  its kernels (``traced_kernel_ms``): a kernel's own time, without launch latency or host gaps.
- **the clock** a measurement is handed (``CallTimer``), so that tests can hand a fake one.

``gpu_sleep`` makes a GPU busy-wait for a given time (the tax-injection harness uses it to make one
rank late) and is calibrated once per device.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Sequence, TypeVar

import torch

from taxmodel.runtime.graph import GraphBackend, GraphCaptureError

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def _is_cuda(device: torch.device | str | None) -> bool:
    return device is not None and torch.device(device).type == "cuda"


# --- one sample --------------------------------------------------------------------------------


class Stopwatch:
    """Elapsed time of a block: CUDA events on a GPU, the monotonic clock on CPU.

    With ``wait`` (the default) the block's end is waited for when it exits; with ``wait=False``
    only the end event is recorded, and reading ``ms``/``seconds`` waits for it (samples queued
    back to back, read once the GPU has run them all).

    >>> with Stopwatch("cpu") as sw: ...
    >>> sw.seconds
    """

    def __init__(self, device: torch.device | str | None = None, *, wait: bool = True) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.wait = wait
        self._ms: float | None = None  # GPU: CUDA events give milliseconds
        self._s: float | None = None  # CPU: the host clock gives seconds
        self._unread = False  # the end event is recorded but not yet read

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
            self._unread = True
            if self.wait:
                self._read_events()
        else:
            self._s = time.perf_counter() - self._t0

    def _read_events(self) -> None:
        if self._unread:
            self._end.synchronize()
            self._ms = self._start.elapsed_time(self._end)
            self._unread = False
        if self._ms is None and self._s is None:
            raise RuntimeError("Stopwatch read before its block ended")

    @property
    def ms(self) -> float:
        self._read_events()
        return self._ms if self._ms is not None else self._s * 1e3

    @property
    def seconds(self) -> float:
        self._read_events()
        return self._ms / 1e3 if self._ms is not None else self._s


def repeat(fn: Callable[[], object], n: int) -> Callable[[], None]:
    """One callable that calls ``fn`` ``n`` times back to back (a batch, or the body of a graph)."""
    def calls() -> None:
        for _ in range(n):
            fn()
    return calls


def time_ms(run: Callable[[], object], device: torch.device | str | None, calls: int = 1) -> float:
    """One sample: ``run()`` between two CUDA events (the host clock on CPU), waited for, in ms per
    call (``run`` makes ``calls`` calls)."""
    with Stopwatch(device) as sw:
        run()
    return sw.ms / calls


class CallTimer:
    """The clock a measurement is handed: ``elapsed_ms(fn)`` is one call of enqueued work timed on
    ``device`` (``time_ms``: CUDA events on a GPU, the host clock on a CPU, where gloo's collectives
    return when done), ``synchronize`` waits for the device. Tests hand a fake one instead."""

    def __init__(self, device: torch.device | str | None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def synchronize(self) -> None:
        synchronize(self.device)

    def elapsed_ms(self, fn: Callable[[], object]) -> float:
        return time_ms(fn, self.device)


def warm_up(runs: Callable[[], object] | Iterable[Callable[[], object]], rounds: int) -> None:
    """``rounds`` untimed rounds, each calling every one of ``runs`` once, in order (nothing is
    waited for: the first sample's start event comes after them on the stream)."""
    runs = [runs] if callable(runs) else list(runs)
    for _ in range(rounds):
        for run in runs:
            run()


def synchronize(device: torch.device | str | None) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for on CPU)."""
    if _is_cuda(device):
        torch.cuda.synchronize(device)


# --- several samples, several things compared ---------------------------------------------------


def sample_order(names: Sequence[K], samples: int, *, rotate: bool = False) -> Iterator[K]:
    """The order in which ``names`` take their ``samples`` turns: round-robin, one sample each per
    round; with ``rotate`` round ``s`` starts at ``names[s % len(names)]`` (the first one alternates
    too)."""
    n = len(names)
    for s in range(samples):
        first = s % n if rotate and n else 0
        yield from list(names[first:]) + list(names[:first])


def interleave(samplers: Mapping[K, Callable[[], T]], samples: int, *, rotate: bool = False,
               discard: int = 0) -> dict[K, list[T]]:
    """Per name, ``samples`` results of its sampler, the samplers taking turns (``sample_order``).
    The first ``discard`` rounds run the same way and are dropped (warm-up samples)."""
    out: dict[K, list[T]] = {name: [] for name in samplers}
    for name in sample_order(list(samplers), discard + samples, rotate=rotate):
        out[name].append(samplers[name]())
    return {name: values[discard:] for name, values in out.items()}


def time_interleaved(runs: Mapping[K, Callable[[], object]], samples: int, *, device: torch.device | str | None,
                     calls: int = 1, rotate: bool = False, deferred: bool = False) -> dict[K, list[float]]:
    """Per name, ``samples`` times (ms per call; each run makes ``calls`` calls) of its run, the runs
    taking turns (``interleave``). With ``deferred`` the samples are queued back to back and their
    events read after the last (no host wait between samples), else each is waited for."""
    if not deferred:
        return interleave({name: (lambda run=run: time_ms(run, device, calls)) for name, run in runs.items()},
                          samples, rotate=rotate)

    def queued(run: Callable[[], object]) -> Stopwatch:
        with Stopwatch(device, wait=False) as sw:
            run()
        return sw

    marks = interleave({name: (lambda run=run: queued(run)) for name, run in runs.items()}, samples, rotate=rotate)
    return {name: [sw.ms / calls for sw in watches] for name, watches in marks.items()}


def sample_ms(fn: Callable[[], object], *, device: torch.device | str | None, reps: int, calls: int = 1,
              warmup: int = 0, between: Callable[[], object] | None = None,
              watch: CallTimer | None = None) -> list[float]:
    """``warmup`` untimed calls of ``fn``, then ``reps`` samples of ``calls`` back-to-back calls (ms
    per call), each after ``between`` (a barrier, a cache flush) when given; ``watch`` times them
    (default: ``CallTimer(device)``)."""
    timer = SampleTimer(device, calls=calls, samples=reps, between=between or _nothing, watch=watch)
    warm_up(fn, warmup)
    timer.watch.synchronize()
    return timer.samples_of(repeat(fn, calls))


def median_ms(fn: Callable[[], object], *, device: torch.device | str | None, reps: int, calls: int = 1,
              warmup: int = 0, watch: CallTimer | None = None) -> float:
    """The median of ``sample_ms``: ms per call of ``fn``."""
    return statistics.median(sample_ms(fn, device=device, reps=reps, calls=calls, warmup=warmup, watch=watch))


def copy_bandwidth(src: torch.Tensor, *, reps: int, calls: int = 1, warmup: int = 3) -> float:
    """Achievable memory bandwidth (bytes read + written per second) of device-to-device copies of
    ``src`` into a tensor like it: every byte read once and written once, median over ``reps``."""
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device=src.device, reps=reps, calls=calls, warmup=warmup)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


# --- the statistic -----------------------------------------------------------------------------


def spread(values: Sequence[float], unit: str, prefix: str = "") -> dict[str, float]:
    """The median of ``values`` with their minimum and maximum, keyed ``<prefix>median_<unit>``,
    ``<prefix>min_<unit>``, ``<prefix>max_<unit>`` (the form of the results files)."""
    return {f"{prefix}median_{unit}": statistics.median(values), f"{prefix}min_{unit}": min(values),
            f"{prefix}max_{unit}": max(values)}


def decile_range(values: Sequence[float]) -> tuple[float, float]:
    """(10th, 90th percentile) of ``values`` (``statistics.quantiles``' default method); the median
    twice for a single value."""
    if len(values) < 2:
        med = statistics.median(values)
        return med, med
    q = statistics.quantiles(values, n=10)
    return q[0], q[-1]


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
    times = sorted(ms / 1e3 for ms in sample_ms(fn, device=dev, reps=reps, calls=inner, warmup=warmup,
                                                between=between))
    return BenchResult(median_s=statistics.median(times), min_s=times[0], p10_s=_quantile(times, 0.1),
                       p90_s=_quantile(times, 0.9), reps=reps, inner=inner, device=str(dev))


# --- CUDA graphs and ranks ---------------------------------------------------------------------


def _nothing() -> None:
    return None


def _same(value: T) -> T:
    return value


def side_stream_warm_up(body: Callable[[], object], times: int, *, device: torch.device | str | None = None,
                        backend: GraphBackend | None = None) -> None:
    """``times`` calls of ``body`` on a side stream, as a capture needs before it (lazy initializations
    of NCCL, the allocator or cuBLAS must not happen during a capture)."""
    with (backend or GraphBackend(device)).side_stream():
        warm_up(body, times)


def capture_graph(body: Callable[[], object], *, device: torch.device | str | None = None,
                  backend: GraphBackend | None = None) -> Any:
    """``body``'s launches captured once in a CUDA graph (after the queued work is done); a sample is
    then one ``replay()``. Raises GraphCaptureError where there are no graphs (a CPU run), saying so."""
    backend = backend or GraphBackend(device)
    why = backend.unavailable_reason()
    if why:
        raise GraphCaptureError(f"no CUDA graph to time: {why}")
    backend.synchronize()
    return backend.capture(body)


@dataclass
class SampleTimer:
    """Samples of a body: each ``calls`` back-to-back calls, after ``between`` (a barrier between
    ranks), its ms per call passed through ``reduce`` (the maximum over ranks), ``samples`` of them.

    ``eager`` times host-launched batches, ``graph`` replays of the batch captured in one CUDA graph;
    ``agree`` turns this rank's capture error (or None) into every rank's, so that a capture failing
    on any rank fails on all and no rank waits in a barrier for the others. ``watch`` is the clock
    (default: ``CallTimer(device)``).
    """

    device: torch.device | str | None
    calls: int
    samples: int
    between: Callable[[], object] = _nothing
    reduce: Callable[[float], float] = _same
    agree: Callable[[str | None], str | None] = _same
    backend: GraphBackend | None = None
    watch: CallTimer | None = None

    def __post_init__(self) -> None:
        self.watch = self.watch or CallTimer(self.device)

    def sample(self, run: Callable[[], object]) -> float:
        """One sample of ``run`` (which makes ``calls`` calls): ``between``, timed, ``reduce``d."""
        self.between()
        return self.reduce(self.watch.elapsed_ms(run) / self.calls)

    def samples_of(self, run: Callable[[], object]) -> list[float]:
        """``samples`` samples of ``run``."""
        return [self.sample(run) for _ in range(self.samples)]

    def eager(self, step: Callable[[], object]) -> list[float]:
        """Samples of ``calls`` host-launched steps, after one untimed batch of them."""
        batch = repeat(step, self.calls)
        batch()
        return self.samples_of(batch)

    def graph(self, step: Callable[[], object], side_warmup: int = 3) -> tuple[list[float] | None, Callable[[], object], str]:
        """Samples of replays of ``calls`` steps captured in one CUDA graph (after ``side_warmup``
        steps on a side stream and one untimed replay).

        Returns (the samples, or None when the capture failed on any rank; a callable that runs the
        steps once more the same way; the capture error). Where there are no graphs (CPU), eager
        samples instead, with ``step`` as that callable.
        """
        backend = self.backend or GraphBackend(self.device)
        if backend.unavailable_reason():
            return self.eager(step), step, ""
        side_stream_warm_up(step, side_warmup, backend=backend)
        self.between()
        graph, error = None, None
        try:
            graph = backend.capture(repeat(step, self.calls))
        except Exception as exc:  # noqa: BLE001 - returned to the caller, whose eager timings still stand
            error = f"{type(exc).__name__}: {exc}"[:300]
        error = self.agree(error)
        if error:
            backend.synchronize()
            self.between()
            return None, step, error
        graph.replay()  # warm-up replay
        return self.samples_of(graph.replay), graph.replay, ""


def max_over_ranks(value: float, device: torch.device | str | None, group: Any = None) -> float:
    """``value``'s maximum over the ranks of ``group`` (the slowest rank sets the pace); ``value``
    itself without a process group or on one rank."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def error_on_any_rank(error: str | None, device: torch.device | str | None, group: Any = None) -> str | None:
    """This rank's capture error (or None) made every rank's: when a capture failed anywhere, every
    rank gets an error (its own, or "capture failed on another rank"), so all take the same path."""
    if max_over_ranks(1.0 if error else 0.0, device, group) > 0:
        return error or "capture failed on another rank"
    return None


def rank_sample_timer(device: torch.device | str | None, calls: int, samples: int, *,
                      between: Callable[[], object], group: Any = None) -> SampleTimer:
    """``samples`` samples of ``calls`` steps (eager batches or graph replays), ms per step: each
    sample after ``between`` (a barrier), the maximum over ranks; a graph capture failing on any rank
    fails on every rank. What the benchmark scripts and the capture's un-profiled replays both use."""
    return SampleTimer(device, calls=calls, samples=samples, between=between,
                       reduce=lambda ms: max_over_ranks(ms, device, group),
                       agree=lambda error: error_on_any_rank(error, device, group))


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


# --- kernel time from a trace -------------------------------------------------------------------


def on_gpu(device: torch.device | str) -> bool:
    """Whether ``device`` runs kernels on a GPU (not Triton's interpreter), so a trace has their times."""
    from taxmodel.kernels.device.sync import interpreting

    return _is_cuda(device) and not interpreting()


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


def kernel_seconds(device: torch.device | str, body: Callable[[], object],
                   patterns: Mapping[str, str]) -> dict[str, list[float]]:
    """Per label, the durations (s) of the kernels whose names contain ``patterns[label]`` (a regular
    expression) in one traced call of ``body`` (``traced_events``): each kernel's own time, without
    launch latency or host gaps; two kernels that run at once on two streams are each timed whole.
    Off a GPU (Triton's interpreter) there is no device trace: every label gets the host time of
    ``body``, which says nothing about a GPU but lets the callers' fits run on the same rows."""
    if not on_gpu(device):
        with Stopwatch() as sw:
            body()
        return {label: [sw.seconds] for label in patterns}

    def traced() -> None:
        body()
        torch.cuda.synchronize(device)

    ev = traced_events(traced)
    ker = ev[ev["kind"] == "kernel"]
    dur = (ker["end_ns"] - ker["start_ns"]) * 1e-9
    name = ker["name"].astype(str)
    return {label: dur[name.str.contains(pat, regex=True)].tolist() for label, pat in patterns.items()}


def median_seconds(durations: Mapping[str, list[float]], label: str, what: str) -> float:
    """The median of ``durations[label]`` (``kernel_seconds``); RuntimeError naming ``what`` when the
    trace had none."""
    values = durations.get(label) or []
    if not values:
        raise RuntimeError(f"the profiler trace has no {what} kernels (no GPU profiler?)")
    return float(statistics.median(values))


def traced_kernel_ms(replay: Callable[[], object]) -> list[float]:
    """The durations (ms) of the GPU kernels that one call of ``replay`` runs, from a torch.profiler
    trace of it, as torch reads it (empty when the trace has none: no CUDA/ROCm profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    us = [e.time_range.end - e.time_range.start for e in prof.events()
          if getattr(e.device_type, "name", "") == "CUDA" and e.time_range.end > e.time_range.start]
    return [u / 1e3 for u in us]
