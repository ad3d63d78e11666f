"""CUDA-graph profiling (``taxmodel profile --graph``): capture one iteration, replay it per step.

Why: under torch.profiler the host needs longer to enqueue one fine-grained iteration than the
GPU needs to run it (tens of ms of profiled host time against a fraction of a ms of GPU time),
so an eager profiled loop measures the profiler. Decode and inference loops replay CUDA graphs;
so does ``--graph``: after the eager warm-up and correctness check, one iteration's launches
(the variant's ``run`` plus the tax injector's hooks) are captured once, and every traced
iteration is one ``graph.replay()`` (one ``cudaGraphLaunch``) between barriers.

Pieces, each small enough to test without a GPU (``tests/runtime/test_profile_graph.py``):

- ``eager_reason``: whether a variant can be captured at all (mode, device, ``Variant.graph_safe``).
- ``EagerIteration`` / ``GraphIteration``: what the traced loop calls once per iteration.
- ``GraphBackend``: the few CUDA calls capture needs (side stream, capture, synchronize), behind
  one small class so tests can pass a fake; ``capture_iteration`` orders them (warm-up on a side
  stream, barriers, capture with ``capture_error_mode="thread_local"`` so that NCCL's watchdog
  thread may query events meanwhile).
- ``GraphRecordSlots`` / ``assign_graph_record_iterations``: in-kernel records (``--instrument``)
  under a graph. A graph freezes the record pointer its kernels got at capture, so the eager
  scheme (one buffer per iteration, switched between launches) cannot work. Instead one buffer
  per kernel holds a whole repetition (emptied in place before each, outside the trace; its
  records appended through a cursor, kernels/device/trace.py's append mode), and on
  rank 0 the records are told apart by time: the one clock offset (per rank and repetition) at
  which the records fit inside the traced launches of their kernel places each record in its
  launch, hence its iteration.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import pandas as pd

from taxmodel.errors import InputError, RunError

GRAPH_MODES = ("off", "auto", "require")
"""off: eager launches; auto (``--graph``): capture what can be captured, profile the rest
eagerly (the bundle says which); require (``--graph-strict``): capture every variant or stop."""

GRAPH_NOTE = ("CUDA graph: every iteration is one replay (one graph launch) of one captured iteration; "
              "launch_tax shows the graph launch, later kernels of the replay are queued (kernel_gap)")


def check_mode(mode: str) -> str:
    if mode not in GRAPH_MODES:
        raise InputError(f"graph mode '{mode}': choose one of {', '.join(GRAPH_MODES)}")
    return mode


def eager_reason(mode: str, variant: Any, backend: "GraphBackend") -> str | None:
    """Why ``variant`` runs with eager launches in this run, or None when it is captured."""
    if mode == "off":
        return "graph capture not requested"
    why = backend.unavailable_reason()
    if why:
        return why
    if not getattr(variant, "graph_safe", False):
        return (f"variant '{variant.name}' is not graph-safe (its run() keeps per-iteration state on the host, "
                "so one captured iteration cannot be replayed; see Variant.graph_safe)")
    return None


# --- what the traced loop calls once per iteration ---------------------------------------------


class IterationRunner(Protocol):
    graph: bool

    def __call__(self) -> None:
        """Run one iteration and wait until the GPU finished it."""

    def launch(self) -> None:
        """Enqueue one iteration and return at once (``wait`` waits for it)."""

    def wait(self) -> None:
        """Wait until the GPU finished everything enqueued."""

    def close(self) -> None:
        """Release what the runner holds (a graph's memory pool)."""


class EagerIteration:
    """Launch every kernel of one iteration from the host, then wait."""

    graph = False

    def __init__(self, step: Callable[[], None], wait: Callable[[], None]) -> None:
        self.step, self.wait = step, wait

    def launch(self) -> None:
        """Enqueue the iteration without waiting (back-to-back steps)."""
        self.step()

    def __call__(self) -> None:
        self.launch()
        self.wait()

    def close(self) -> None:
        pass


class GraphIteration:
    """Replay the captured iteration (one graph launch), then wait."""

    graph = True

    def __init__(self, graph: Any, wait: Callable[[], None]) -> None:
        self._graph, self.wait = graph, wait

    def launch(self) -> None:
        """Enqueue the replay without waiting (back-to-back steps)."""
        self._graph.replay()

    def __call__(self) -> None:
        self.launch()
        self.wait()

    def close(self) -> None:
        if self._graph is not None and hasattr(self._graph, "reset"):
            self._graph.reset()
        self._graph = None


# --- capture -------------------------------------------------------------------------------------


class GraphCaptureError(RunError):
    """Capturing one iteration into a graph failed on this rank (the caller decides: eager or stop)."""


class GraphBackend:
    """The CUDA calls of a capture on ``device`` (HIP graphs through the same torch API on ROCm)."""

    name = "cuda"

    def __init__(self, device: Any) -> None:
        self.device = device

    def unavailable_reason(self) -> str | None:
        import torch

        if torch.device(self.device).type != "cuda":
            return "CPU run: there are no CUDA graphs (kernels run synchronously in Triton's interpreter)"
        return None

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        """Run the block on a fresh stream that waits for, and is waited for by, the current one."""
        import torch

        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            yield
        torch.cuda.current_stream(self.device).wait_stream(side)

    def capture(self, step: Callable[[], None]) -> Any:
        import torch

        graph = torch.cuda.CUDAGraph()
        # thread_local: NCCL's watchdog thread may query events while this thread captures.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            step()
        return graph

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)


BACKENDS: dict[str, type[GraphBackend]] = {"cuda": GraphBackend}


def register_backend(cls: type[GraphBackend]) -> type[GraphBackend]:
    """Make a backend selectable by name (spec key ``graph_backend``; tests register a fake)."""
    BACKENDS[cls.name] = cls
    return cls


def get_backend(name: str, device: Any) -> GraphBackend:
    if name not in BACKENDS:
        raise InputError(f"graph backend '{name}' unknown; available: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name](device)


def capture_iteration(step: Callable[[], None], *, backend: GraphBackend, between: Callable[[], None],
                      warmup: int = 2, before_capture: Callable[[], None] | None = None) -> GraphIteration:
    """Capture one call of ``step`` (enqueue one iteration, no host sync) into a graph.

    ``warmup`` calls of ``step`` run first on a side stream (lazy initializations of NCCL, the
    allocator or cuBLAS must not happen during capture), each followed by ``between`` (a barrier:
    ranks run their warm-up steps together, as fine-grained variants need). ``before_capture``
    runs right before the capture (e.g. point record buffers at the graph's slots). Raises
    GraphCaptureError when the capture itself fails; the warm-up's errors propagate as they are.
    """
    for _ in range(max(int(warmup), 0)):
        with backend.side_stream():
            step()
        between()
    if before_capture is not None:
        before_capture()
    try:
        graph = backend.capture(step)
    except Exception as exc:  # noqa: BLE001 - any capture failure becomes one message for the caller
        first = (str(exc).strip().splitlines() or [""])[0]
        raise GraphCaptureError(f"{type(exc).__name__}: {first}"[:400]) from exc
    return GraphIteration(graph, backend.synchronize)


_PRIMED: set[str] = set()


def prime_tracer(tracer_cls: Any, device: Any) -> None:
    """One short session of the run's own tracer before the first capture of this process.

    CUPTI initialized for the first time after a graph was captured has invalidated graphs or
    missed their kernels on some CUDA versions. A session before the capture makes every
    capture happen after that initialization, as every variant but the first would anyway. It is
    an ordinary session (the same tracer and activities as the traced loop, one tiny kernel
    inside), since sessions like it are known to leave later ones working; an empty one has
    been reported to leave activity collection dead on some stacks."""
    import torch

    key = f"{getattr(tracer_cls, 'name', tracer_cls)}:{device}"
    if key in _PRIMED:
        return
    tracer = tracer_cls(device)
    with tracer:
        torch.ones(1, device=device).add_(1)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    _PRIMED.add(key)


# --- in-kernel records under a graph -------------------------------------------------------------


class GraphRecordSlots:
    """One record buffer per instrumented kernel for a whole repetition of graph replays.

    ``install`` (before the capture) points every kernel at its slot, whose address the graph
    then keeps; ``rearm`` (before each repetition's traced loop, outside the trace) empties the
    slots in place and installs them again (``RecordBook.drain`` forgets them); ``drain`` returns
    the records with iteration -1 (unknown until ``assign_graph_record_iterations`` on rank 0).
    The buffers are in append mode (kernels/device/trace.py): fixed slots would keep only the last
    replay, so here every record takes a slot with an atomic, room for ``iterations`` launches.
    """

    def __init__(self, book: Any, iterations: int) -> None:
        from taxmodel.kernels.device.trace import RecordLayout
        from taxmodel.runtime.records import new_buffer

        self.book = book
        n = max(int(iterations), 1)
        self.slots = {name: new_buffer(RecordLayout(buf.layout.ctas * n, buf.layout.per_cta), buf.device, append=True)
                      for name, buf in book.buffers.items()}

    def install(self) -> None:
        for name, buf in self.book.buffers.items():
            if name in self.slots:
                buf.slots, buf.current = [self.slots[name]], 0

    def rearm(self) -> None:
        from taxmodel.runtime.records import clear_buffer

        for slot in self.slots.values():
            clear_buffer(slot)
        self.install()

    def uninstall(self) -> None:
        for buf in self.book.buffers.values():
            buf.slots, buf.current = [], -1

    def drain(self, rank: int, repetition: int) -> pd.DataFrame:
        return self.book.drain(rank, repetition).assign(iteration=-1)


def assign_graph_record_iterations(events: pd.DataFrame, records: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Give records drained from ``GraphRecordSlots`` (iteration -1) the iteration of the traced
    launch they ran in; return (records, how many could not be placed: they keep -1 and are then
    dropped as unmatched by ``records.merge_records``).

    Records carry the device clock, kernel rows the tracer's; on one rank the two differ by an
    offset that is constant over a repetition (what drifts is far below the gaps between
    iterations). Per (rank, repetition, kernel name) the offset is found from containment: a
    record at offset ``o`` fits launch j when ``[start + o, end + o]`` lies inside the launch
    (widened by a quarter of the smallest gap between its launches, for the clocks' jitter;
    widened launches stay disjoint, so a record fits at most one). A sweep over the offsets at
    which each record fits some launch finds the offsets fitting the most records; the middle of
    that range is taken, and each record goes to the launch it then fits. Pauses inside a launch
    (CTAs run one after another in Triton's interpreter) do not matter, only the launch bounds.
    Nothing is guessed: when two separate offset ranges fit equally many records (e.g. one
    iteration wrote none, so the rest fit shifted by one launch too), that group stays unplaced.
    """
    out = records.copy()
    if out.empty:
        return out, 0
    it_out = np.full(len(out), -1, dtype=np.int64)
    kern = events[(events["kind"] == "kernel") & (events["iteration"] >= 0)]
    launches = {k: (grp.sort_values("start_ns", kind="stable")[["start_ns", "end_ns", "iteration"]].to_numpy(np.int64))
                for k, grp in kern.groupby(["rank", "repetition", "name"], sort=False)}
    start_all = out["start_ns"].to_numpy(np.int64)
    end_all = out["end_ns"].to_numpy(np.int64)
    for key, idx in out.groupby(["rank", "repetition", "name"], sort=False).indices.items():
        spans = launches.get(key)
        if spans is None or len(spans) == 0:
            continue
        idx = np.asarray(idx)
        placed = _place_by_offset(start_all[idx], end_all[idx], spans)
        it_out[idx] = placed
    out["iteration"] = it_out
    return out, int((it_out < 0).sum())


def _place_by_offset(start: np.ndarray, end: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Iteration of each record (-1: unplaced) given launch ``spans`` rows (start, end,
    iteration) sorted by start; see ``assign_graph_record_iterations``."""
    s_k, e_k, iters = spans[:, 0], spans[:, 1], spans[:, 2]
    gaps = s_k[1:] - e_k[:-1]
    tol = int(max(gaps.min(), 0) // 4) if len(gaps) else 0
    lo_k, hi_k = s_k - tol, e_k + tol
    lo = lo_k[None, :] - start[:, None]  # offsets at which record i starts inside launch j
    hi = hi_k[None, :] - end[:, None]  # ... and ends inside it
    fits = hi >= lo
    if not fits.any():
        return np.full(len(start), -1, dtype=np.int64)
    # Coverage sweep: +1 where a (record, launch) offset range opens, -1 after it closes.
    points = np.concatenate([lo[fits], hi[fits] + 1])
    delta = np.concatenate([np.ones(int(fits.sum()), np.int64), -np.ones(int(fits.sum()), np.int64)])
    order = np.lexsort((delta, points))  # at equal points, closings (-1) before openings
    points, delta = points[order], delta[order]
    uniq, first = np.unique(points, return_index=True)
    cover = np.cumsum(delta)[np.r_[first[1:] - 1, len(points) - 1]]  # coverage from uniq[i] to uniq[i+1]
    best = cover.max()
    at_best = np.flatnonzero(cover == best)
    # Separate best ranges (not adjacent segments): ambiguous, place nothing.
    if len(at_best) > 1 and (np.diff(at_best) > 1).any():
        return np.full(len(start), -1, dtype=np.int64)
    a, b = uniq[at_best[0]], uniq[min(at_best[-1] + 1, len(uniq) - 1)] - 1
    offset = (int(a) + int(b)) // 2
    inside = (lo <= offset) & (offset <= hi) & fits
    placed = np.full(len(start), -1, dtype=np.int64)
    has = inside.any(axis=1)
    placed[has] = iters[inside[has].argmax(axis=1)]
    return placed


def graph_trace_notes(events: pd.DataFrame, backend: str) -> list[str]:
    """Notes about a graph capture's trace that a reader must see (kernels the tracer missed)."""
    if backend != "cuda":
        return []
    gpu = events[events["kind"].isin(("kernel", "memcpy", "memset")) & (events["iteration"] >= 0)]
    if len(gpu) and not (gpu["graph_id"] >= 0).any():
        return ["--graph: no traced GPU activity inside an iteration carries a graph id; the tracer may not "
                "have linked the replays' kernels to their graph launch"]
    if gpu.empty:
        return ["--graph: the trace holds no GPU activity inside any iteration; the tracer did not record the "
                "graph replays' kernels (CUPTI initialized after the capture?)"]
    return []

