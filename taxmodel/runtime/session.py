"""One variant at one shape on one rank: set up, warm up, check, capture a graph, trace, gather, write.

``Run`` is what every variant of a rank's run shares (spec, context, workload, tracer, clock
offsets, progress); ``VariantSession`` is one variant's pass through the phases, each a method,
its state (inputs, injector, device gate, runner, record slots) on the object rather than
threaded through long argument lists. Rank 0 writes the bundle (``writer.write_variant_bundle``).

The order of barriers, warm-up steps and traced steps is the capture protocol: changing it
changes what a bundle measures (see the constants below and ``docs/``), so it is written once,
here, top to bottom.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from taxmodel.errors import RunError
from taxmodel.runtime.inject import Injection
from taxmodel.runtime.rank import RankState
from taxmodel.runtime.spec import ProfileSpec
from taxmodel.runtime.status import terminal
from taxmodel.workload import tolerance_of

#: Steps run under the tracer before ``ProfilerStep#0`` of every repetition, outside any step
#: (meta ``capture.traced_warmup``): they absorb what a tracer's start costs the first step after it.
TRACED_WARMUP_STEPS = 1
#: Whole repetitions traced and thrown away before the first variant a profile process captures
#: (meta ``capture.discarded_repetitions`` on that bundle). Why: in the gated CUDA-graph captures
#: on the H200s the first bundle of every process had one NCCL kernel of 100-240 us at repetition 0,
#: step 0, after the warm-up steps and the traced one; later bundles of the process had none.
PROCESS_WARMUP_REPETITIONS = 1
#: Samples of each graph when a captured step is timed with nothing traced (meta
#: ``capture.replay_step_us``): the step's own one-step graph and a second graph holding
#: ``capture.iterations`` steps (as the benchmark scripts put ``--iters`` steps in one graph), their
#: samples taking turns; the difference of the two medians over the extra steps is one step.
REPLAY_REPS = 5
#: How ``capture.replay_step_us`` was measured (meta ``capture.replay_method``; bundles without the
#: key timed batches of one graph launch per step, the host's launch rate included at short steps).
REPLAY_METHOD = "graph-of-iterations minus one-step graph"
_PROCESS = {"warm": False}  # whether this process has traced its warm-up repetitions


class Progress:
    """Phase progress on rank 0 (tqdm on the terminal, ``status.terminal``); silent elsewhere.

    ``announce``: this rank also says what the run did (bundles written, variants skipped, graph
    fallbacks) as it happens: rank 0 of a run that no ``taxmodel profile`` watches (torchrun).
    Under ``taxmodel profile`` the command says it once, at the end, from rank 0's result."""

    def __init__(self, enabled: bool, total: int, announce: bool = False) -> None:
        self.bar = None
        self.announce = announce
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="phase", file=terminal(), dynamic_ncols=True, leave=True)

    def phase(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def write(self, text: str) -> None:
        """Say ``text`` on the terminal if this rank announces (see the class)."""
        if not self.announce:
            return
        if self.bar is not None:
            self.bar.write(text, file=terminal())
        else:
            print(text, file=terminal(), flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def check_output(out: Any, ref: Any, rtol: float, atol: float) -> str | None:
    """None if ``out`` matches ``ref`` within tolerance, else a one-line description of the mismatch."""
    import torch

    if isinstance(out, (list, tuple)):
        for i, (o, r) in enumerate(zip(out, ref)):
            msg = check_output(o, r, rtol, atol)
            if msg:
                return f"output {i}: {msg}"
        return None
    o = torch.as_tensor(out).detach().to("cpu", torch.float64)
    r = torch.as_tensor(ref).detach().to("cpu", torch.float64)
    if o.shape != r.shape:
        return f"shape {tuple(o.shape)} differs from the reference's {tuple(r.shape)}"
    err = (o - r).abs()
    bad = ~(err <= atol + rtol * r.abs())  # NaN counts as bad
    if not bool(bad.any()):
        return None
    idx = int(torch.nonzero(bad.flatten())[0])
    worst = float(torch.nan_to_num(err, nan=float("inf")).max())
    return (f"{int(bad.sum())} of {bad.numel()} elements outside rtol={rtol:g}, atol={atol:g} "
            f"(max abs error {worst:.3g}; first at flat index {idx}: got {float(o.flatten()[idx]):.6g}, "
            f"expected {float(r.flatten()[idx]):.6g})")


@dataclass
class Run:
    """What every variant of this rank's run shares."""

    spec: ProfileSpec
    state: RankState
    ctx: Any  # RankContext
    workload: Any
    variants: Mapping[str, Any]
    injection: Injection
    tracer_cls: Any
    clock: dict[str, Any]
    progress: Progress
    graph_backend: Any  # taxmodel.runtime.graph backend
    graph_mode: str
    fallbacks: list[str] = field(default_factory=list)  # variants profiled eagerly although --graph asked for graphs

    @property
    def world(self) -> int:
        return self.ctx.world_size

    @property
    def device(self) -> Any:
        return self.ctx.device

    def barrier(self) -> None:
        self.state.barrier(self.ctx)


class VariantSession:
    """One variant at one shape on this rank, phase by phase (``profile`` runs them all)."""

    traced_warmup_steps = TRACED_WARMUP_STEPS  # for the bundle's meta (writer)

    def __init__(self, run: Run, vname: str, preset: str, shape: Mapping[str, int]) -> None:
        from taxmodel.runtime.inject import declare_injected_copies

        self.run, self.vname, self.preset, self.shape = run, vname, preset, dict(shape)
        self.variant = run.variants[vname]
        self.cost = declare_injected_copies(run.workload.cost(shape, run.world, vname), run.injection)
        self.gate: Any = None
        self.st: Any = None
        self.injector: Any = None
        self.eager: Any = None
        self.runner: Any = None
        self.slots: Any = None
        self.book: Any = None
        self.graph_note: str | None = None
        self.discarded = 0
        self.replay_step_us: float | None = None
        self.replay_note: str | None = None
        self.raw: list[bytes] = []
        self.recs: list[Any] = []

    # --- the phases ------------------------------------------------------------------------------

    def profile(self) -> Path | None:
        """Every phase in order; the bundle written (rank 0) or None."""
        self.setup()
        self.compile()
        self.check()
        self.prepare_runner()
        if self.run.spec.counters_pass:  # taxmodel.runtime.counters: one step under ncu; nothing traced or written
            self.counted_step()
            self.close()
            return None
        self.capture()
        gathered, gathered_recs = self.gather()
        path = self.write(gathered, gathered_recs) if self.run.ctx.rank == 0 else None
        self.run.progress.advance()
        self.run.barrier()
        self.close()
        return path

    def _enter(self, phase: str, label: str | None = None) -> None:
        self.run.state.enter(phase, self.vname)
        self.run.progress.phase(f"{self.vname}: {label or phase}")

    def setup(self) -> None:
        from taxmodel.runtime.graph import EagerIteration
        from taxmodel.runtime.inject import Injector

        run, ctx = self.run, self.run.ctx
        self._enter("setup")
        if ctx.heap is not None:
            ctx.barrier()
            ctx.heap.reset()
        ctx.injector = None
        self.gate = self._device_gate()  # before setup: the same heap offset on every rank
        self.st = run.workload.setup(ctx, self.shape, self.variant)
        self.injector = Injector(run.injection, ctx, self.cost.intermediates) if run.injection.active else None
        self.eager = EagerIteration(self.step, ctx.synchronize)

    def step(self) -> None:
        """One iteration's launches, no host sync (what a graph captures)."""
        if self.injector is not None:
            self.injector.start_iteration()
        self.variant.run(self.st)

    def compile(self) -> None:
        """Warm-up: compiles every kernel (the gate's too) before any rank waits on another."""
        self._enter("compile")
        self.run.ctx.injector = self.injector
        for _ in range(max(int(self.run.spec.warmup), 1)):
            self.run.barrier()
            if self.gate is not None:
                self.gate()
            self.eager()
        self.run.barrier()
        self.run.progress.advance()

    def check(self, when: str = "") -> None:
        """Compare this rank's output with the reference on every rank; RunError naming the ranks if wrong."""
        import torch.distributed as dist

        run = self.run
        if not when:
            self._enter("check")
        rtol, atol = tolerance_of(run.workload, self.shape, run.world)
        ref = run.workload.reference(run.ctx, self.shape, self.st)
        problem = check_output(run.workload.output(self.st), ref, rtol, atol)
        del ref
        problems: list[Any] = [None] * run.world
        dist.all_gather_object(problems, problem)
        bad = {r: p for r, p in enumerate(problems) if p}
        if bad:
            detail = "; ".join(f"rank {r}: {p}" for r, p in bad.items())
            name = f"{run.workload.name}/{self.vname}"
            if when:
                raise RunError(f"{name} gives wrong results {when} ({detail}); its run() may not be "
                               "graph-safe (per-iteration state kept on the host): profile it without --graph")
            raise RunError(f"{name} gives wrong results ({detail}); the variant has a bug, or its tolerance is too tight")
        if not when:
            run.progress.advance()

    def prepare_runner(self) -> None:
        """Eager launches, or one captured CUDA graph per iteration where ``--graph`` asks and it can."""
        from taxmodel.runtime.graph import eager_reason

        run = self.run
        self.book = run.ctx.records if run.ctx.instrument else None  # in-kernel records: taxmodel.runtime.records
        self.runner = self.eager
        self.graph_note = eager_reason(run.graph_mode, self.variant, run.graph_backend)
        if self.graph_note is None:
            self._enter("graph", "graph capture")
            self.capture_graph()
        if run.graph_mode != "off" and self.graph_note is not None:
            run.fallbacks.append(f"{run.workload.name}/{self.vname} ({self.preset}): eager launches: {self.graph_note}")
            run.progress.write(f"--graph: {run.workload.name}/{self.vname} profiled with eager launches: {self.graph_note}")

    def capture_graph(self) -> None:
        """Capture one iteration on every rank (sets runner, record slots, or why eager).

        Ranks agree: if the capture fails on any rank, every rank falls back to eager launches
        (``--graph``) or stops (``--graph-strict``). A captured graph is replayed once with its
        output poisoned first (where the state can) and checked, before anything is traced."""
        import torch.distributed as dist

        from taxmodel.runtime.graph import (EagerIteration, GraphCaptureError, GraphRecordSlots, capture_iteration,
                                            prime_tracer)

        run = self.run
        if run.graph_backend.name == "cuda" and not run.spec.counters_pass:  # no tracer runs under the counter tool
            prime_tracer(run.tracer_cls, run.device)
        slots = GraphRecordSlots(self.book, int(run.spec.iterations)) if self.book is not None else None
        error: str | None = None
        try:
            runner = capture_iteration(self.step, backend=run.graph_backend, between=run.barrier,
                                       before_capture=slots.install if slots is not None else None)
        except GraphCaptureError as exc:
            error, runner = str(exc), None
        errors: list[Any] = [None] * run.world
        dist.all_gather_object(errors, error)
        failed = {r: e for r, e in enumerate(errors) if e}
        if failed:
            if runner is not None:
                runner.close()  # captured here, failed elsewhere: every rank runs eagerly
            if slots is not None:
                slots.uninstall()
            detail = "; ".join(f"rank {r}: {e}" for r, e in failed.items())
            if run.graph_mode == "require":
                raise RunError(f"{run.workload.name}/{self.vname}: CUDA graph capture failed ({detail}); "
                               "use --graph instead of --graph-strict to profile it with eager launches")
            self.runner, self.slots = EagerIteration(self.step, run.ctx.synchronize), None
            self.graph_note = f"graph capture failed ({detail})"
            return
        poison = getattr(self.st, "poison", None)
        if callable(poison):
            poison()  # a replay that skips part of the output cannot pass the check
        run.barrier()
        runner()  # warm-up replay
        run.barrier()
        self.runner, self.slots = runner, slots
        self.check(when="after one CUDA graph replay")
        self.graph_note = None

    def counted_step(self) -> None:
        """The counters pass (taxmodel.runtime.counters): one step, as the tool wants it."""
        from taxmodel.runtime.counters import counted_step

        self.run.state.enter("capture", self.vname)
        counted_step(self.run.barrier, self.gate, self.runner)

    def capture(self) -> None:
        """The traced repetitions (after this process's thrown-away one, the first time)."""
        run = self.run
        self._enter("capture")
        if not _PROCESS["warm"]:
            book = self.book
            dropped = dict(book.dropped) if book is not None else {}
            for _ in range(PROCESS_WARMUP_REPETITIONS):
                self.traced_repetition(0)  # thrown away: the process's first traced repetition
            if book is not None:
                book.dropped = dropped
            self.discarded, _PROCESS["warm"] = PROCESS_WARMUP_REPETITIONS, True
        for rep in range(int(run.spec.repeat)):
            trace, rep_recs = self.traced_repetition(rep)
            self.raw.append(trace)
            if rep_recs is not None:
                self.recs.append(rep_recs)
        run.ctx.injector = None
        if self.runner.graph:  # the kernels must still be right after every replay
            self.replay_step_us = self.time_replays()
            self.check(when="after the traced graph replays")
        run.progress.advance()

    @property
    def replay_method(self) -> str | None:
        """How ``replay_step_us`` was measured (meta ``capture.replay_method``), None without one."""
        return REPLAY_METHOD if self.replay_step_us is not None else None

    def time_replays(self) -> float | None:
        """One step's time with nothing traced (us, the slowest rank's), as a benchmark runs steps in
        a CUDA graph: back to back on the GPU, no host in between (meta ``capture.replay_step_us``;
        the traced step's window is compared with it). The steps of one traced repetition are
        captured in a second graph; its replays and the one-step graph's take turns
        (``REPLAY_REPS`` each, a barrier before each), and the difference of their medians over the
        extra steps is one step: what every replay pays once (its launch, the events) cancels. Each
        sample starts as a traced repetition does (host barrier, then the device gate where the
        alignment has one), so the ranks' host skew is not timed. The GPU runs as long as in a
        traced repetition, so both see the same clocks (a GPU held busy for
        longer can slow down: ``benchmarks/sustained_gemm.py``). None off a GPU (the interpreter's
        times say nothing), with injected taxes, or when the capture fails on any rank."""
        import statistics

        from taxmodel.runtime.timing import rank_sample_timer

        run = self.run
        if self.injector is not None or not run.ctx.is_cuda:
            return None
        gate = self.gate

        def between() -> None:  # the traced repetitions' start: a host barrier, then the device gate
            run.barrier()
            if gate is not None:
                gate()  # the sample's start event follows it on the stream: ranks start together

        steps = max(int(run.spec.iterations), 2)
        _, many, error = rank_sample_timer(run.device, steps, 1, between=between).graph(self.step, side_warmup=1)
        if error:
            run.barrier()
            self.replay_note = f"un-profiled replay not timed: {error}"
            return None
        replay = rank_sample_timer(run.device, 1, 1, between=between)  # a sample: one replay's whole time
        one_ms, many_ms = [], []
        for _ in range(REPLAY_REPS):
            one_ms.append(replay.sample(self.runner.launch))
            many_ms.append(replay.sample(many))
        if gate is not None:
            gate.check()
        run.barrier()
        return replay_step_ms(statistics.median(one_ms), statistics.median(many_ms), steps) * 1e3

    def traced_repetition(self, rep: int) -> tuple[bytes, Any]:
        """One repetition under a fresh tracer: (its trace, its drained records or None)."""
        run, book, slots, gate = self.run, self.book, self.slots, self.gate
        iterations = int(run.spec.iterations)
        run.barrier()
        if slots is not None:
            slots.rearm()  # one buffer per kernel for the repetition, emptied outside the trace
        elif book is not None:
            book.arm(iterations)  # per-iteration buffers, allocated outside the trace
        tracer = run.tracer_cls(run.device)
        if run.spec.align == "back-to-back":
            with tracer:
                self._back_to_back(iterations)
        else:
            with tracer:
                self._gated_steps(iterations)
        trace = tracer.export()
        if gate is not None:
            gate.check()
        if slots is not None:
            return trace, slots.drain(run.ctx.rank, rep)
        return trace, book.drain(run.ctx.rank, rep) if book is not None else None

    def _gated_steps(self, iterations: int) -> None:
        """Every traced step after a host barrier (and the device gate, ``--align device``)."""
        from torch.profiler import record_function

        run, book, slots, gate, runner = self.run, self.book, self.slots, self.gate, self.runner
        for _ in range(TRACED_WARMUP_STEPS):
            # A step under the tracer but in no ProfilerStep range: the first step after a
            # tracer starts ran up to ~100 us slower on the H200s (one per repetition); its
            # kernels belong to no iteration, and its records are emptied before step 0.
            run.barrier()
            if book is not None and slots is None:
                book.set_iteration(0)
            if gate is not None:
                gate()
            runner()
        run.barrier()
        if TRACED_WARMUP_STEPS and slots is not None:
            slots.rearm()  # queued after the warm-up's kernels on the same stream
        elif TRACED_WARMUP_STEPS and book is not None:
            book.clear(0)  # the warm-up wrote into step 0's buffers
        for it in range(iterations):
            run.barrier()
            if book is not None and slots is None:
                book.set_iteration(it)
            if gate is not None:
                gate()  # outside the step's range: its kernel belongs to no iteration
            with record_function(f"ProfilerStep#{it}"):
                runner()

    def _back_to_back(self, iterations: int) -> None:
        """``--align back-to-back``: one host barrier and one device gate, then the warm-up step and
        every traced step enqueued one after another with no wait in between, so each GPU runs them
        back to back (as a decode loop, or a benchmark replaying N steps, does). The gate holds for
        every step of the repetition (``capture_meta.gate_hold_for``): the hosts enqueue them all
        before any GPU starts, so no step waits for its host. The kernels of the warm-up step (and
        the emptying of its records) belong to no step."""
        from torch.profiler import record_function

        run, book, slots, gate, runner = self.run, self.book, self.slots, self.gate, self.runner
        run.barrier()
        if gate is not None:
            gate()
        for _ in range(TRACED_WARMUP_STEPS):
            if book is not None and slots is None:
                book.set_iteration(0)
            runner.launch()
        if TRACED_WARMUP_STEPS and slots is not None:
            slots.rearm()  # queued after the warm-up's kernels on the same stream
        elif TRACED_WARMUP_STEPS and book is not None:
            book.clear(0)
        for it in range(iterations):
            if book is not None and slots is None:
                book.set_iteration(it)
            with record_function(f"ProfilerStep#{it}"):
                runner.launch()
        runner.wait()

    def gather(self) -> tuple[list[Any] | None, list[Any] | None]:
        """Every rank's traces (and records) on rank 0, through torch.distributed (no shared filesystem)."""
        import torch.distributed as dist

        run = self.run
        self._enter("gather")
        rank0 = run.ctx.rank == 0
        gathered: list[Any] | None = [None] * run.world if rank0 else None
        run.state.waiting = True
        dist.gather_object(self.raw, gathered, dst=0)
        gathered_recs: list[Any] | None = [None] * run.world if rank0 else None
        if self.book is not None:
            dist.gather_object((self.recs, dict(self.book.dropped)), gathered_recs, dst=0)
        run.state.waiting = False
        return gathered, gathered_recs if self.book is not None else None

    def write(self, gathered: list[Any] | None, gathered_recs: list[Any] | None) -> Path:
        from taxmodel.trace.capture_meta import graph_meta
        from taxmodel.runtime.writer import write_variant_bundle

        run = self.run
        self._enter("write")
        path = write_variant_bundle(self, gathered, gathered_recs,
                                    dict(graph_meta(self.runner.graph, run.graph_mode, self.graph_note,
                                                    run.graph_backend.name)))
        run.progress.write(f"wrote {path}")
        return path

    def close(self) -> None:
        """Drop this variant's graph and tensors before the next variant allocates."""
        if self.slots is not None:
            self.slots.uninstall()
        if self.runner is not None:
            self.runner.close()  # a graph's memory pool goes first
        self.runner = self.eager = self.st = None

    def _device_gate(self) -> Any:
        """This variant's device gate (``--align device``), or None (host barrier only)."""
        from taxmodel.trace.capture_meta import GATED_ALIGNMENTS

        spec, ctx = self.run.spec, self.run.ctx
        if spec.align not in GATED_ALIGNMENTS:
            return None
        from taxmodel.kernels.device.gate import DeviceGate

        return DeviceGate(ctx.heap, ctx.rank, ctx.world_size, ctx.device, ctx.spin_timeout_s,
                          spec.gate_hold_total_us(TRACED_WARMUP_STEPS) * 1e-6)


def replay_step_ms(one_step_ms: float, many_steps_ms: float, steps: int) -> float:
    """One step from the replay times of a one-step graph and a ``steps``-step graph: the difference
    over the extra steps (what a replay pays once cancels), or the long graph's mean when noise makes
    the difference non-positive."""
    step = (many_steps_ms - one_step_ms) / (steps - 1) if steps > 1 else 0.0
    return step if step > 0 else many_steps_ms / max(steps, 1)


def profile_variants(run: Run, chosen: list[str], shapes: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Every chosen variant at every preset's shape; rank 0 returns the bundle paths written."""
    written: list[str] = []
    for preset, shape in shapes.items():
        for vname in chosen:
            path = VariantSession(run, vname, preset, shape).profile()
            if path is not None:
                written.append(str(path))
    return written
