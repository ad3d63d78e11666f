"""The timing method (taxmodel/runtime/timing.py) on CPU: the order in which compared things take
their samples, warm-up never counted, per-call division and medians, deferred reads, the rank hooks
of ``SampleTimer`` and its graph path with a stand-in backend (and without graphs on CPU)."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch

from taxmodel.runtime import timing
from taxmodel.runtime.graph import GraphBackend, GraphCaptureError


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A host clock that only moves when a test says so (``clock[0] += seconds``)."""
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    return now


def test_sample_order_is_round_robin_and_rotates_the_first() -> None:
    assert list(timing.sample_order(["a", "b", "c"], 2)) == ["a", "b", "c", "a", "b", "c"]
    assert list(timing.sample_order(["a", "b", "c"], 4, rotate=True)) == \
        ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert list(timing.sample_order(["a"], 3, rotate=True)) == ["a", "a", "a"]
    assert list(timing.sample_order([], 3)) == []


def test_interleave_takes_turns_and_drops_the_discarded_rounds() -> None:
    calls: list[str] = []

    def sampler(name: str) -> Callable[[], int]:
        def sample() -> int:
            calls.append(name)
            return len(calls)
        return sample

    out = timing.interleave({"x": sampler("x"), "y": sampler("y")}, 2, discard=1)
    assert calls == ["x", "y", "x", "y", "x", "y"]
    assert out == {"x": [3, 5], "y": [4, 6]}  # the first round (1, 2) ran and was dropped


def test_warm_up_runs_every_run_per_round_in_order() -> None:
    calls: list[str] = []
    timing.warm_up([lambda: calls.append("a"), lambda: calls.append("b")], 2)
    assert calls == ["a", "b", "a", "b"]
    timing.warm_up(lambda: calls.append("c"), 0)
    assert calls == ["a", "b", "a", "b"]


def test_samples_divide_by_calls_and_warm_up_is_not_counted(clock: list[float]) -> None:
    durations = iter([100.0] * 2 + [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # two slow warm-up calls first
    calls = []

    def fn() -> None:
        calls.append(1)
        clock[0] += next(durations)

    ms = timing.sample_ms(fn, device="cpu", reps=3, calls=2, warmup=2)
    assert len(calls) == 2 + 3 * 2
    assert ms == pytest.approx([1500.0, 3500.0, 5500.0])  # ms per call, the warm-up's 100 s nowhere
    durations = iter([9.0, 1.0, 2.0, 3.0])
    assert timing.median_ms(fn, device="cpu", reps=3, warmup=1) == pytest.approx(2000.0)


def test_time_interleaved_times_each_run_in_turn(clock: list[float]) -> None:
    seconds = {"slow": 0.004, "fast": 0.001}
    order: list[str] = []

    def run(name: str) -> Callable[[], None]:
        def body() -> None:
            order.append(name)
            clock[0] += seconds[name]
        return body

    for deferred in (False, True):
        order.clear()
        out = timing.time_interleaved({n: run(n) for n in seconds}, 3, device="cpu", calls=2, rotate=True,
                                      deferred=deferred)
        assert order == ["slow", "fast", "fast", "slow", "slow", "fast"]
        assert out["slow"] == pytest.approx([2.0] * 3) and out["fast"] == pytest.approx([0.5] * 3)


def test_stopwatch_units_and_early_reads(clock: list[float]) -> None:
    sw = timing.Stopwatch("cpu", wait=False)
    with pytest.raises(RuntimeError, match="before its block ended"):
        sw.ms
    with sw:
        clock[0] += 0.25
    assert sw.seconds == 0.25 and sw.ms == 250.0
    assert timing.time_ms(lambda: None, "cpu") == 0.0


def test_spread_and_decile_range_keep_the_results_files_keys() -> None:
    assert timing.spread([3.0, 1.0, 2.0], "ns") == {"median_ns": 2.0, "min_ns": 1.0, "max_ns": 3.0}
    assert list(timing.spread([1.0], "ms", prefix="diff_")) == ["diff_median_ms", "diff_min_ms", "diff_max_ms"]
    assert timing.decile_range([5.0]) == (5.0, 5.0)
    lo, hi = timing.decile_range([float(i) for i in range(1, 12)])
    assert (lo, hi) == pytest.approx((1.2, 10.8))  # statistics.quantiles' exclusive method


def test_copy_bandwidth_counts_read_and_write(clock: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    src = torch.zeros(1000, dtype=torch.uint8)
    real_copy = torch.Tensor.copy_

    def copy(self: torch.Tensor, other: torch.Tensor, *a, **k) -> torch.Tensor:
        clock[0] += 1e-3
        return real_copy(self, other, *a, **k)

    monkeypatch.setattr(torch.Tensor, "copy_", copy)
    assert timing.copy_bandwidth(src, reps=3) == pytest.approx(2 * 1000 / 1e-3)


def test_sample_timer_barrier_before_and_reduce_after_each_sample(clock: list[float]) -> None:
    log: list[str] = []

    def step() -> None:
        log.append("step")
        clock[0] += 0.001

    timer = timing.SampleTimer("cpu", calls=2, samples=3, between=lambda: log.append("barrier"),
                               reduce=lambda ms: log.append("reduce") or ms * 10)
    times = timer.eager(step)
    assert log[:2] == ["step", "step"]  # the untimed warm-up batch, no barrier
    assert log[2:] == ["barrier", "step", "step", "reduce"] * 3
    assert times == pytest.approx([10.0] * 3)


class _Graph:
    def __init__(self, body: Callable[[], object], log: list[str]) -> None:
        self.body, self.log = body, log

    def replay(self) -> None:
        self.log.append("replay")
        self.body()


class _Backend(GraphBackend):
    """Graphs without a GPU: a capture keeps the body, a replay runs it; ``fail`` makes it raise."""

    def __init__(self, log: list[str], fail: bool = False) -> None:
        super().__init__("cpu")
        self.log, self.fail = log, fail

    def unavailable_reason(self) -> str | None:
        return None

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        self.log.append("side:")
        yield
        self.log.append(":side")

    def capture(self, step: Callable[[], None]) -> _Graph:
        self.log.append("capture")
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return _Graph(step, self.log)

    def synchronize(self) -> None:
        self.log.append("sync")


def test_sample_timer_graph_warms_up_captures_and_replays() -> None:
    log: list[str] = []
    timer = timing.SampleTimer("cpu", calls=2, samples=2, between=lambda: log.append("barrier"),
                               backend=_Backend(log))
    times, replay, error = timer.graph(lambda: log.append("step"), side_warmup=3)
    assert error == "" and len(times) == 2
    assert log == (["side:", "step", "step", "step", ":side", "barrier", "capture", "replay", "step", "step"]
                   + ["barrier", "replay", "step", "step"] * 2)
    log.clear()
    replay()
    assert log == ["replay", "step", "step"]


def test_sample_timer_graph_failing_anywhere_fails_everywhere() -> None:
    log: list[str] = []
    seen: list[str | None] = []

    def agree(error: str | None) -> str | None:
        seen.append(error)
        return error or "capture failed on another rank"

    ok = timing.SampleTimer("cpu", calls=1, samples=2, agree=agree, backend=_Backend(log))
    times, replay, error = ok.graph(lambda: None)
    assert times is None and error == "capture failed on another rank" and seen == [None]
    assert log[-1] == "sync" and "replay" not in log
    bad = timing.SampleTimer("cpu", calls=1, samples=2, backend=_Backend([], fail=True))
    times, _, error = bad.graph(lambda: None)
    assert times is None and error.startswith("RuntimeError: operation not permitted")


def test_without_graphs_the_timer_runs_eagerly_and_capture_says_why() -> None:
    calls = []
    times, replay, error = timing.SampleTimer("cpu", calls=2, samples=3).graph(lambda: calls.append(1))
    assert len(times) == 3 and error == "" and len(calls) == 2 + 3 * 2
    replay()
    assert len(calls) == 9  # one step, as a replay of the eager "graph" runs it
    with pytest.raises(GraphCaptureError, match="no CUDA graph to time: CPU run"):
        timing.capture_graph(lambda: None, device="cpu")


def test_benchmark_harness_timer_is_the_ranks_sample_timer() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import harness

    from taxmodel.runtime.context import RankContext

    ctx = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo", group=None,
                      heap=None)
    timer = harness.rank_timer(ctx, iters=4, reps=3)
    assert (timer.calls, timer.samples) == (4, 3)
    assert timing.error_on_any_rank(None, "cpu") is None and timing.error_on_any_rank("boom", "cpu") == "boom"
    assert harness.all_max(ctx, 2.5) == 2.5  # one rank: its own value
    assert len(timer.eager(lambda: None)) == 3


class _Watch:
    """A fake clock: every timed call takes ``ms`` per call of the counted function."""

    def __init__(self, counter: list[int], ms: float) -> None:
        self.counter, self.ms, self.syncs = counter, ms, 0

    def synchronize(self) -> None:
        self.syncs += 1

    def elapsed_ms(self, fn: Callable[[], object]) -> float:
        before = self.counter[0]
        fn()
        return self.ms * (self.counter[0] - before)


def test_a_measurement_takes_the_clock_it_is_handed() -> None:
    counter = [0]
    watch = _Watch(counter, 0.5)
    ms = timing.sample_ms(lambda: counter.__setitem__(0, counter[0] + 1), device=None, reps=4, calls=3, warmup=2,
                          watch=watch)
    assert ms == [0.5] * 4 and counter[0] == 2 + 4 * 3 and watch.syncs == 1  # waited for the warm-up once
    assert timing.median_ms(lambda: counter.__setitem__(0, counter[0] + 2), device=None, reps=3, watch=watch) == 1.0
    assert timing.SampleTimer("cpu", calls=1, samples=1).watch.device == torch.device("cpu")


def test_call_timer_times_one_call_on_the_host_clock_off_a_gpu(clock: list[float]) -> None:
    watch = timing.CallTimer("cpu")
    assert watch.elapsed_ms(lambda: clock.__setitem__(0, clock[0] + 0.002)) == pytest.approx(2.0)
    watch.synchronize()  # nothing to wait for


def test_kernel_seconds_off_a_gpu_and_an_empty_trace(clock: list[float]) -> None:
    out = timing.kernel_seconds("cpu", lambda: clock.__setitem__(0, clock[0] + 0.25), {"a": "x", "b": "y"})
    assert out == {"a": [0.25], "b": [0.25]}
    assert timing.median_seconds({"a": [3.0, 1.0, 2.0]}, "a", "test") == 2.0
    with pytest.raises(RuntimeError, match="no tile GEMM kernels"):
        timing.median_seconds({"a": []}, "a", "tile GEMM")
