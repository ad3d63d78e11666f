"""One rank of ``taxmodel profile``: the per-rank entry point started by torch.distributed.run.

    python -m torch.distributed.run --standalone --nproc-per-node 4 -m taxmodel.runtime.worker --spec spec.json
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m taxmodel.runtime.worker --workload ag_gemm --preset small -o runs/

For every variant, on every rank: set up inputs, warm up (compiles every kernel before any
rank waits on another), check the output against the workload's reference, then record
``iterations`` barrier-separated iterations per repetition with the tracer. Rank 0 gathers every
rank's raw traces through torch.distributed (no shared filesystem assumed), imports them and
writes one bundle per variant atomically.

Failures: an exception on any rank is reported as ``rank R failed in phase P``; a watchdog ends
a rank that outlives the run's timeout, so a hung kernel or collective becomes an error, never
a hung machine. Exit code 3 (RunError) in both cases.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Mapping

from taxmodel.errors import InputError, Interrupted, RunError, TaxmodelError
from taxmodel.trace.capture_meta import DEFAULT_GATE_HOLD_US, GATE_ROLES, START_ALIGNMENTS, alignment_meta
from taxmodel.runtime.heap import disable_multicast
from taxmodel.runtime.bootstrap import join_process_group
from taxmodel.runtime.inject import Fault
from taxmodel.runtime.status import STATUS_DIR_ENV, write_result, write_status
from taxmodel.workload import tolerance_of

PHASES = ("init", "setup", "compile", "check", "graph", "capture", "gather", "write", "done")

DEFAULT_SPEC: dict[str, Any] = {
    "workload": None,
    "workload_modules": [],
    "variants": None,  # None: every variant available here
    "preset": None,
    "shape": {},
    "iterations": 5,
    "warmup": 2,
    "repeat": 1,
    "inject": [],
    "tracer": "torch",
    "out": "runs",
    "device": "auto",
    "timeout_s": 600.0,
    "spin_timeout_s": 60.0,
    "heap_bytes": None,
    "keep_raw": True,
    "progress": True,
    "instrument": False,  # fused kernels write in-kernel trace records (taxmodel.runtime.records)
    "deadline_unix": None,  # set by the local launcher: every rank's watchdog fires at this time
    "graph": "off",  # off | auto (--graph) | require (--graph-strict): taxmodel.runtime.graph
    "graph_backend": "cuda",  # tests register a fake one (taxmodel.runtime.graph.register_backend)
    "align": "host",  # taxmodel.trace.capture_meta: host barrier only, or also a device gate (kernels/_gate.py)
    "gate_hold_us": DEFAULT_GATE_HOLD_US,  # with align=device: how long a released gate still holds its GPU
}


class RankState:
    """What this rank is doing, read by the watchdog thread and written to the status file."""

    def __init__(self, rank: int, status_dir: str | None, faults: list[Fault] | tuple[Fault, ...] = ()) -> None:
        self.rank = rank
        self.status_dir = status_dir
        self.phase = "init"
        self.variant: str | None = None
        self.waiting = False
        self.faults = tuple(faults)  # --inject kill_rank/hang_rank: fired on entering their phase
        self.lock = threading.Lock()

    def enter(self, phase: str, variant: str | None = None) -> None:
        with self.lock:
            self.phase, self.variant, self.waiting = phase, variant if variant is not None else self.variant, False
        write_status(self.status_dir, self.rank, phase=self.phase, variant=self.variant, waiting=False)
        for fault in self.faults:
            fault.fire(self.rank, phase)

    def where(self) -> str:
        w = f"phase '{self.phase}'"
        return w + (f" of variant '{self.variant}'" if self.variant else "")


WATCHDOG_GRACE_S = 1.5
"""After recording its timeout, a rank lingers this long so that its peers record theirs too."""
#: Steps run under the tracer before ``ProfilerStep#0`` of every repetition, outside any step
#: (meta ``capture.traced_warmup``): they absorb what a tracer's start costs the first step after it.
TRACED_WARMUP_STEPS = 1
#: Whole repetitions traced and thrown away before the first variant a profile process captures
#: (meta ``capture.discarded_repetitions`` on that bundle). Why: in the gated CUDA-graph captures
#: on the H200s the first bundle of every process had one NCCL kernel of 100-240 us at repetition 0,
#: step 0, after the warm-up steps and the traced one; later bundles of the process had none.
PROCESS_WARMUP_REPETITIONS = 1
_PROCESS = {"warm": False}  # whether this process has traced its warm-up repetitions


def _start_watchdog(state: RankState, timeout_s: float, deadline_unix: float | None = None) -> None:
    """End this process if the run outlives ``timeout_s`` (a hung kernel or collective), after
    recording where the main thread was stuck. ``deadline_unix`` (set by the local launcher)
    makes every rank on the host give up at the same moment, so each records its own state."""
    main_id = threading.main_thread().ident
    remaining = timeout_s if deadline_unix is None else min(timeout_s, deadline_unix - time.time())

    def watch() -> None:
        deadline = time.monotonic() + max(remaining, 0.0)
        while time.monotonic() < deadline:
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.01)))
            if state.phase == "done":
                return
        frame = sys._current_frames().get(main_id)
        in_collective, at = _stuck_where(frame)
        waiting = state.waiting or in_collective
        msg = f"rank {state.rank}: no end after {timeout_s:g} s in {state.where()}{at}" + (" (waiting for other ranks)" if waiting else "")
        write_status(state.status_dir, state.rank, phase=state.phase, variant=state.variant, waiting=waiting,
                     timed_out=True, timeout_s=timeout_s, at=at, error=msg)
        print(f"taxmodel: error: {msg}", file=sys.stderr, flush=True)
        time.sleep(WATCHDOG_GRACE_S)
        os._exit(RunError.exit_code)

    threading.Thread(target=watch, name="taxmodel-watchdog", daemon=True).start()


def _stuck_where(frame: Any) -> tuple[bool, str]:
    """(inside a torch.distributed call?, " at file:line (function)" of the innermost frame
    outside torch and taxmodel's runtime) for the stack ending in ``frame``."""
    in_collective, at = False, ""
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/torch/distributed/" in path:
            in_collective = True
        if (not at and "/torch/" not in path and "/taxmodel/runtime/" not in path and "/threading.py" not in path
                and not path.startswith("<")):
            at = f" at {Path(path).name}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return in_collective, at


def _import_workload_modules(modules: list[str]) -> None:
    import importlib
    import importlib.util

    for mod in modules:
        if mod.endswith(".py") and Path(mod).exists():
            name = f"taxmodel_user_workload_{Path(mod).stem}"
            spec = importlib.util.spec_from_file_location(name, mod)
            if spec is None or spec.loader is None:
                raise InputError(f"{mod}: cannot be imported as a workload module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            try:
                importlib.import_module(mod)
            except ImportError as exc:
                raise InputError(f"--workload-module {mod}: cannot import it ({exc}); give a module name on sys.path or a .py file") from exc


def _init_distributed(device_kind: str, timeout_s: float):
    """Join the process group (NCCL on GPUs, gloo on CPU); returns (rank, world, local_rank, device, backend)."""
    # Collectives time out after the watchdog, so that the watchdog names the phase first.
    m = join_process_group(device_kind, timeout_s=timeout_s + 60)
    return m.rank, m.world_size, m.local_rank, m.device, m.backend


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise InputError(f"--device {device}: choose auto, cuda or cpu")
    return device


# --- what one variant does on one rank ---------------------------------------------------------


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


def shape_tag(shape: Mapping[str, int]) -> str:
    return "x".join(f"{k}{v}" for k, v in shape.items()) or "default"


def _versions() -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    from taxmodel.version import __version__

    def version(dist_name: str) -> str | None:
        try:
            return md.version(dist_name)
        except md.PackageNotFoundError:
            return None

    sw: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "taxmodel": __version__,
                          "triton": version("triton") or version("pytorch-triton") or version("pytorch-triton-rocm"),
                          "iris": version("tokenspeed-iris"), "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}
    try:
        if torch.cuda.is_available() and not getattr(torch.version, "hip", None):
            sw["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - an optional detail
        pass
    return {k: v for k, v in sw.items() if v is not None}


def _hardware(device: Any, world: int) -> dict[str, Any]:
    import torch

    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"name": p.name, "vendor": "amd" if getattr(torch.version, "hip", None) else "nvidia",
                "num_sms": int(p.multi_processor_count), "memory_bytes": int(p.total_memory),
                "gpus_per_rank": 1, "world_size": world}
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return {"name": f"CPU ({platform.processor() or platform.machine()}), emulated GPUs", "vendor": "cpu",
            "num_sms": os.cpu_count(), "memory_bytes": mem, "emulated": True}


def measure_clock_offsets(rank: int, world: int, device: Any, group: Any = None, rounds: int = 8) -> dict[str, Any]:
    """Offsets (ns to add to each rank's times to match rank 0's clock) from ping-pongs with
    rank 0, keeping the round trip of least delay; on one host every rank shares one clock."""
    import torch
    import torch.distributed as dist

    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    if len(set(hosts)) == 1:
        return {"offsets_ns": {str(r): 0 for r in range(world)}, "uncertainty_ns": 0, "method": "same-host", "hosts": hosts}
    offsets, uncertainty = {"0": 0}, 0
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    for peer in range(1, world):
        if rank not in (0, peer):
            dist.barrier(group=group)
            continue
        best: tuple[int, int] | None = None
        for _ in range(rounds):
            if rank == 0:
                t0 = time.time_ns()
                dist.send(buf, peer, group=group)
                dist.recv(buf, peer, group=group)
                t1 = time.time_ns()
                rtt, offset = t1 - t0, (t0 + t1) // 2 - int(buf.item())
                if best is None or rtt < best[0]:
                    best = (rtt, offset)
            else:
                dist.recv(buf, 0, group=group)
                buf.fill_(time.time_ns())
                dist.send(buf, 0, group=group)
        if rank == 0 and best is not None:
            offsets[str(peer)] = best[1]
            uncertainty = max(uncertainty, best[0] // 2)
        dist.barrier(group=group)
    result = [{"offsets_ns": offsets, "uncertainty_ns": uncertainty}]
    dist.broadcast_object_list(result, src=0, group=group)
    return {**result[0], "method": "ping-pong (min round trip)", "hosts": hosts}


class Progress:
    """Phase progress on rank 0 (tqdm on stderr); silent elsewhere."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="phase", file=sys.stderr, dynamic_ncols=True, leave=True)

    def phase(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_rank(spec: Mapping[str, Any], state: RankState) -> dict[str, Any]:
    """Profile every requested variant on this rank; rank 0 returns what it wrote."""
    import torch.distributed as dist

    from taxmodel.runtime.context import RankContext
    from taxmodel.runtime.heap import make_heap
    from taxmodel.runtime.inject import Injection
    from taxmodel.workload import get_workload
    from taxmodel.trace.capture import get_tracer

    spec = {**DEFAULT_SPEC, **spec}
    device_kind = resolve_device(spec["device"])
    rank, world, local_rank, device, backend = _init_distributed(device_kind, float(spec["timeout_s"]))
    state.rank = rank
    _import_workload_modules(list(spec["workload_modules"]))
    workload = get_workload(spec["workload"])
    # Several presets (comma-separated) run in one process group: one start-up, one heap.
    presets = (spec["preset"] or (workload.cpu_preset if device_kind == "cpu" else workload.default_preset)).split(",")
    shapes = {preset: workload.shape(preset, **dict(spec["shape"])) for preset in presets}
    injection = Injection.parse(spec["inject"])
    tracer_cls = get_tracer(spec["tracer"])
    ctx = RankContext(rank=rank, world_size=world, local_rank=local_rank, device=device, backend=backend,
                      group=dist.group.WORLD, heap=None, interpret=device_kind == "cpu", spin_timeout_s=float(spec["spin_timeout_s"]),
                      instrument=bool(spec["instrument"]))
    if ctx.instrument:
        from taxmodel.runtime.records import book_for

        # before any setup copies the context; graph captures need header-reading kernels
        from taxmodel.runtime.graph import check_mode

        book_for(ctx).append = check_mode(str(spec["graph"])) != "off"

    variants = workload.variants()
    wanted = list(spec["variants"] or variants)
    unknown = [v for v in wanted if v not in variants]
    if unknown:
        raise InputError(f"{workload.name}: unknown variant(s) {', '.join(unknown)}; choose from {', '.join(variants)}")
    state.enter("setup")
    reasons: list[Any] = [None] * world
    mine = {v: variants[v].available(ctx) for v in wanted}
    dist.all_gather_object(reasons, mine)
    skipped = {v: next(f"rank {r}: {rs[v]}" for r, rs in enumerate(reasons) if rs[v]) for v in wanted
               if any(rs[v] for rs in reasons)}
    chosen = [v for v in wanted if v not in skipped]
    if spec["align"] == "device" or any(variants[v].needs_heap for v in chosen):
        heap_bytes = int(spec["heap_bytes"] or (4 << 30 if device_kind == "cuda" else 256 << 20))
        ctx.heap = make_heap(ctx, heap_bytes)
    clock = measure_clock_offsets(rank, world, device)
    progress = Progress(bool(spec["progress"]) and rank == 0, total=len(chosen) * 4 * len(presets))
    for v, why in skipped.items():
        progress.write(f"skipped {workload.name}/{v}: {why}")

    written: list[str] = []
    fallbacks: list[str] = []  # variants profiled eagerly although --graph asked for graphs, and why
    for preset, shape in shapes.items():
        written += _profile_shape(spec, state, ctx, workload, variants, chosen, preset, shape, world, device,
                                  injection, tracer_cls, clock, progress, fallbacks)
    progress.close()
    if ctx.heap is not None:
        ctx.heap.close()
    return {"bundles": written, "skipped": skipped, "workload": workload.name, "shapes": shapes, "world_size": world,
            "graph_fallbacks": fallbacks}


def _profile_shape(spec, state, ctx, workload, variants, chosen, preset, shape, world, device, injection,
                   tracer_cls, clock, progress, fallbacks: list[str]) -> list[str]:
    """Check, capture and write every chosen variant at one shape; rank 0 returns the bundle paths."""
    import torch.distributed as dist
    from torch.profiler import record_function

    from taxmodel.runtime.graph import EagerIteration, check_mode, eager_reason, get_backend, graph_meta
    from taxmodel.runtime.inject import INJECTED_ROLES, Injector, declare_injected_copies
    from taxmodel.trace.bundle import write_bundle
    from taxmodel.trace.capture import finish_events, iter_trace_files

    rank = ctx.rank
    written: list[str] = []
    backend = get_backend(str(spec["graph_backend"]), device)
    mode = check_mode(str(spec["graph"]))
    iterations = int(spec["iterations"])
    for vname in chosen:
        variant = variants[vname]
        cost = declare_injected_copies(workload.cost(shape, world, vname), injection)
        state.enter("setup", vname)
        progress.phase(f"{vname}: setup")
        if ctx.heap is not None:
            ctx.barrier()
            ctx.heap.reset()
        ctx.injector = None
        gate = _device_gate(spec, ctx)  # before setup: the same heap offset on every rank
        st = workload.setup(ctx, shape, variant)
        injector = Injector(injection, ctx, cost.intermediates) if injection.active else None

        def step() -> None:  # one iteration's launches, no host sync (what a graph captures)
            if injector is not None:
                injector.start_iteration()
            variant.run(st)

        eager = EagerIteration(step, ctx.synchronize)
        state.enter("compile", vname)
        progress.phase(f"{vname}: compile")
        ctx.injector = injector
        for _ in range(max(int(spec["warmup"]), 1)):
            _barrier(ctx, state)
            if gate is not None:
                gate()  # compiles the gate, too, before anything is traced
            eager()
        _barrier(ctx, state)
        progress.advance()

        state.enter("check", vname)
        progress.phase(f"{vname}: check")
        _check_variant(ctx, workload, vname, shape, st, world)
        progress.advance()

        book = ctx.records if ctx.instrument else None  # in-kernel records: taxmodel.runtime.records
        runner: Any = eager
        slots = None
        graph_note = eager_reason(mode, variant, backend)
        if graph_note is None:
            state.enter("graph", vname)
            progress.phase(f"{vname}: graph capture")
            runner, slots, graph_note = _capture_graph(spec, state, ctx, workload, vname, shape, st, world, step,
                                                       backend, book, tracer_cls, device, mode)
        if mode != "off" and graph_note is not None:
            fallbacks.append(f"{workload.name}/{vname} ({preset}): eager launches: {graph_note}")
            progress.write(f"--graph: {workload.name}/{vname} profiled with eager launches: {graph_note}")

        if spec.get("counters_pass"):  # taxmodel.runtime.counters: one step under ncu; nothing traced or written
            from taxmodel.runtime.counters import counted_step

            state.enter("capture", vname)
            counted_step(lambda: _barrier(ctx, state), gate, runner)
            if slots is not None:
                slots.uninstall()
            runner.close()
            runner = eager = st = None
            continue

        state.enter("capture", vname)
        progress.phase(f"{vname}: capture")

        def traced_repetition(rep: int) -> tuple[bytes, Any]:
            """One repetition under a fresh tracer: (its trace, its drained records or None)."""
            _barrier(ctx, state)
            if slots is not None:
                slots.rearm()  # one buffer per kernel for the repetition, emptied outside the trace
            elif book is not None:
                book.arm(iterations)  # per-iteration buffers, allocated outside the trace
            tracer = tracer_cls(device)
            with tracer:
                for _ in range(TRACED_WARMUP_STEPS):
                    # A step under the tracer but in no ProfilerStep range: the first step after a
                    # tracer starts ran up to ~100 us slower on the H200s (one per repetition); its
                    # kernels belong to no iteration, and its records are emptied before step 0.
                    _barrier(ctx, state)
                    if book is not None and slots is None:
                        book.set_iteration(0)
                    if gate is not None:
                        gate()
                    runner()
                _barrier(ctx, state)
                if TRACED_WARMUP_STEPS and slots is not None:
                    slots.rearm()  # queued after the warm-up's kernels on the same stream
                elif TRACED_WARMUP_STEPS and book is not None:
                    book.clear(0)  # the warm-up wrote into step 0's buffers
                for it in range(iterations):
                    _barrier(ctx, state)
                    if book is not None and slots is None:
                        book.set_iteration(it)
                    if gate is not None:
                        gate()  # outside the step's range: its kernel belongs to no iteration
                    with record_function(f"ProfilerStep#{it}"):
                        runner()
            trace = tracer.export()
            if gate is not None:
                gate.check()
            if slots is not None:
                return trace, slots.drain(rank, rep)
            return trace, book.drain(rank, rep) if book is not None else None

        discarded = 0
        if not _PROCESS["warm"]:
            dropped = dict(book.dropped) if book is not None else {}
            for _ in range(PROCESS_WARMUP_REPETITIONS):
                traced_repetition(0)  # thrown away: the process's first traced repetition
            if book is not None:
                book.dropped = dropped
            discarded, _PROCESS["warm"] = PROCESS_WARMUP_REPETITIONS, True
        raw: list[bytes] = []
        recs: list[Any] = []
        for _rep in range(int(spec["repeat"])):
            trace, rep_recs = traced_repetition(_rep)
            raw.append(trace)
            if rep_recs is not None:
                recs.append(rep_recs)
        ctx.injector = None
        if runner.graph:  # the kernels must still be right after every replay
            _check_variant(ctx, workload, vname, shape, st, world, when="after the traced graph replays")
        progress.advance()

        state.enter("gather", vname)
        progress.phase(f"{vname}: gather")
        gathered: list[Any] | None = [None] * world if rank == 0 else None
        state.waiting = True
        dist.gather_object(raw, gathered, dst=0)
        gathered_recs: list[Any] | None = [None] * world if rank == 0 else None
        if book is not None:
            dist.gather_object((recs, dict(book.dropped)), gathered_recs, dst=0)
        state.waiting = False

        if rank == 0:
            state.enter("write", vname)
            progress.phase(f"{vname}: write")
            path = _write_variant_bundle(
                spec=spec, workload=workload, vname=vname, variant=variant, shape=shape, preset=preset, world=world,
                device=device, cost=cost, clock=clock, injection=injection, injector=injector, tracer_cls=tracer_cls,
                gathered=gathered, gathered_records=gathered_recs if book is not None else None,
                discarded_repetitions=discarded,
                roles={**INJECTED_ROLES, **GATE_ROLES, **dict(variant.roles)},
                finish_events=finish_events, iter_trace_files=iter_trace_files, write_bundle=write_bundle,
                graph=dict(graph_meta(runner.graph, mode, graph_note, backend.name)))
            written.append(str(path))
            progress.write(f"wrote {path}")
        progress.advance()
        _barrier(ctx, state)
        if slots is not None:
            slots.uninstall()
        runner.close()  # a graph's memory pool goes before the next variant allocates
        runner = eager = st = None  # drop this variant's tensors before the next one allocates
    return written


def _check_variant(ctx: Any, workload: Any, vname: str, shape: Mapping[str, int], st: Any, world: int,
                   when: str = "") -> None:
    """Compare this rank's output with the reference on every rank; RunError naming the ranks if wrong."""
    import torch.distributed as dist

    rtol, atol = tolerance_of(workload, shape, world)
    ref = workload.reference(ctx, shape, st)
    problem = check_output(workload.output(st), ref, rtol, atol)
    del ref
    problems: list[Any] = [None] * world
    dist.all_gather_object(problems, problem)
    bad = {r: p for r, p in enumerate(problems) if p}
    if bad:
        detail = "; ".join(f"rank {r}: {p}" for r, p in bad.items())
        if when:
            raise RunError(f"{workload.name}/{vname} gives wrong results {when} ({detail}); its run() may not be "
                           "graph-safe (per-iteration state kept on the host): profile it without --graph")
        raise RunError(f"{workload.name}/{vname} gives wrong results ({detail}); the variant has a bug, or its tolerance is too tight")


def _capture_graph(spec, state, ctx, workload, vname, shape, st, world, step, backend, book, tracer_cls, device,
                   mode) -> tuple[Any, Any, str | None]:
    """Capture one iteration on every rank; return (runner, record slots or None, why eager or None).

    Ranks agree: if the capture fails on any rank, every rank falls back to eager launches
    (``--graph``) or stops (``--graph-strict``). A captured graph is replayed once with its
    output poisoned first (where the state can) and checked, before anything is traced."""
    import torch.distributed as dist

    from taxmodel.runtime.graph import (EagerIteration, GraphCaptureError, GraphRecordSlots, capture_iteration,
                                        prime_tracer)

    if backend.name == "cuda" and not spec.get("counters_pass"):  # no tracer runs under the counter tool
        prime_tracer(tracer_cls, device)
    slots = GraphRecordSlots(book, int(spec["iterations"])) if book is not None else None
    error: str | None = None
    try:
        runner = capture_iteration(step, backend=backend, between=lambda: _barrier(ctx, state),
                                   before_capture=slots.install if slots is not None else None)
    except GraphCaptureError as exc:
        error, runner = str(exc), None
    errors: list[Any] = [None] * world
    dist.all_gather_object(errors, error)
    failed = {r: e for r, e in enumerate(errors) if e}
    if failed:
        if runner is not None:
            runner.close()  # captured here, failed elsewhere: every rank runs eagerly
        if slots is not None:
            slots.uninstall()
        detail = "; ".join(f"rank {r}: {e}" for r, e in failed.items())
        if mode == "require":
            raise RunError(f"{workload.name}/{vname}: CUDA graph capture failed ({detail}); "
                           "use --graph instead of --graph-strict to profile it with eager launches")
        return EagerIteration(step, ctx.synchronize), None, f"graph capture failed ({detail})"
    poison = getattr(st, "poison", None)
    if callable(poison):
        poison()  # a replay that skips part of the output cannot pass the check
    _barrier(ctx, state)
    runner()  # warm-up replay
    _barrier(ctx, state)
    _check_variant(ctx, workload, vname, shape, st, world, when="after one CUDA graph replay")
    return runner, slots, None


def _device_gate(spec: Mapping[str, Any], ctx: Any) -> Any:
    """This variant's device gate (``--align device``), or None (host barrier only)."""
    if spec["align"] != "device":
        return None
    from taxmodel.kernels._gate import DeviceGate

    return DeviceGate(ctx.heap, ctx.rank, ctx.world_size, ctx.device, ctx.spin_timeout_s,
                      float(spec["gate_hold_us"]) * 1e-6)


def _barrier(ctx: Any, state: RankState) -> None:
    state.waiting = True
    ctx.barrier()
    state.waiting = False


def _write_variant_bundle(*, spec, workload, vname, variant, shape, preset, world, device, cost, clock, injection,
                          injector, tracer_cls, gathered, roles, finish_events, iter_trace_files, write_bundle,
                          gathered_records=None, graph: Mapping[str, Any] | None = None,
                          discarded_repetitions: int = 0) -> Path:
    import tempfile

    emulated = device.type != "cuda"
    out = Path(spec["out"]) / workload.name / f"{vname}-{shape_tag(shape)}"
    with tempfile.TemporaryDirectory(prefix="taxmodel-traces-") as tmp:
        per_rep, imported_meta, raw_files = [], {}, []
        for paths in iter_trace_files(Path(tmp), gathered, tracer_cls.file_suffix):
            events, imported_meta = tracer_cls.read(paths)
            per_rep.append(events)
            raw_files.extend(paths)
        events = finish_events(per_rep, roles, emulated=emulated)
        graph = dict(graph or {"graph": False, "graph_mode": "off"})
        records_info = None
        if gathered_records is not None:
            from taxmodel.runtime.records import merge_gathered

            per_rank = [g[0] for g in gathered_records]
            unplaced = 0
            if graph["graph"]:  # one buffer per repetition: iterations told apart by time
                from taxmodel.runtime.graph import assign_graph_record_iterations

                placed = []
                for frames in per_rank:
                    row = []
                    for frame in frames:
                        frame, n = assign_graph_record_iterations(events, frame)
                        unplaced += n
                        row.append(frame)
                    placed.append(row)
                per_rank = placed
            events, records_info = merge_gathered(events, per_rank, [g[1] for g in gathered_records])
            if graph["graph"]:
                records_info["iterations_from"] = ("one buffer per repetition under a graph: each record placed in the traced "
                                                   "launch it fits at its rank's clock offset")
                records_info["unplaced"] = unplaced
        hardware = {**(imported_meta.get("hardware") or {}), **_hardware(device, world)}
        software = {**(imported_meta.get("software") or {}), **_versions()}
        notes = list(imported_meta.get("notes") or []) + (injector.notes if injector is not None else [])
        if emulated:
            notes.append("CPU capture: kernel rows are the host ranges of kernels run synchronously in Triton's "
                          "interpreter or torch on CPU, collectives are gloo's; times say nothing about GPUs")
        if graph["graph"]:
            from taxmodel.runtime.graph import GRAPH_NOTE, graph_trace_notes

            notes.append(GRAPH_NOTE)
            notes.extend(graph_trace_notes(events, str(graph.get("graph_backend"))))
        elif graph.get("graph_note"):
            notes.append(f"profiled with eager launches although --graph was given: {graph['graph_note']}")
        meta = {
            "source": "capture",
            "workload": workload.name,
            "variant": vname,
            "description": variant.description,
            "workload_config": workload.config_summary(device) if hasattr(workload, "config_summary") else None,
            "fine_grained": bool(variant.fine_grained),
            "shape": dict(shape),
            "preset": preset,
            "dtype": cost.dtype,
            "world_size": world,
            "ranks": list(range(world)),
            "hardware": hardware,
            "software": software,
            "clock_offsets_ns": clock["offsets_ns"],
            "clock": {k: v for k, v in clock.items() if k != "offsets_ns"},
            "capture": {
                "tracer": spec["tracer"],
                "warmup": int(spec["warmup"]),
                "traced_warmup": TRACED_WARMUP_STEPS,
                "discarded_repetitions": int(discarded_repetitions),
                "iterations": int(spec["iterations"]),
                "repetition": int(spec["repeat"]),
                "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "emulated_gpu": emulated,
                # Offsets come from the capture itself: 0 on one host (one clock), ping-pongs across hosts.
                "clock_offsets_source": "measured",
                "clock_uncertainty_ns": int(clock.get("uncertainty_ns", 0) or 0),
                "device": device.type,
                "inject": injection.to_dict() if injection.active else None,
                "roles": dict(roles),
                "iteration_pattern": r"^ProfilerStep#(\d+)$",
                "instrument": gathered_records is not None,
                **alignment_meta(spec["align"], spec["gate_hold_us"]),
                **graph,
            },
            "repetitions": int(spec["repeat"]),
            "cost": cost.to_dict(),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "notes": notes,
        }
        if records_info is not None:
            meta["records"] = records_info
        return write_bundle(out, events, meta, raw_files=raw_files if spec["keep_raw"] else ())


# --- entry point -------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m taxmodel.runtime.worker",
                                description="One rank of `taxmodel profile` (start it with torchrun).")
    p.add_argument("--spec", help="JSON file with the run's settings (written by `taxmodel profile`)")
    p.add_argument("--workload")
    p.add_argument("--workload-module", action="append", default=[])
    p.add_argument("--variants", help="comma-separated")
    p.add_argument("--preset")
    p.add_argument("--shape", action="append", default=[], help="K=V, repeatable")
    p.add_argument("--iterations", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--repeat", type=int)
    p.add_argument("--inject", action="append", default=[])
    p.add_argument("--tracer")
    p.add_argument("--device")
    p.add_argument("--timeout", type=float, dest="timeout_s")
    p.add_argument("-o", "--out")
    p.add_argument("--instrument", action="store_true", help="in-kernel trace records from fused kernels")
    p.add_argument("--graph", choices=("off", "auto", "require"),
                   help="replay one captured CUDA graph per iteration: auto falls back to eager launches for "
                        "variants that are not graph-safe, require stops instead (taxmodel profile --graph/--graph-strict)")
    p.add_argument("--align", choices=START_ALIGNMENTS, help="host barrier only, or also a device gate before each traced step")
    p.add_argument("--gate-hold-us", type=float, dest="gate_hold_us", help="with --align device: the gate's hold (us)")
    a = p.parse_args(argv)
    spec: dict[str, Any] = dict(DEFAULT_SPEC)
    if a.spec:
        spec.update(json.loads(Path(a.spec).read_text()))
    for key in ("workload", "preset", "iterations", "warmup", "repeat", "tracer", "device", "timeout_s", "out", "align",
                "gate_hold_us"):
        if getattr(a, key) is not None:
            spec[key] = getattr(a, key)
    if a.workload_module:
        spec["workload_modules"] = list(spec["workload_modules"]) + a.workload_module
    if a.variants:
        spec["variants"] = [v for v in a.variants.split(",") if v]
    if a.shape:
        spec["shape"] = {**spec["shape"], **parse_shape(a.shape)}
    if a.inject:
        spec["inject"] = list(spec["inject"]) + a.inject
    if a.instrument:
        spec["instrument"] = True
    if a.graph:
        spec["graph"] = a.graph
    if not spec["workload"]:
        p.error("give --spec or --workload")
    return spec


def parse_shape(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        for part in filter(None, (s.strip() for s in item.split(","))):
            k, sep, v = part.partition("=")
            try:
                if not sep:
                    raise ValueError
                out[k.strip()] = int(v)
            except ValueError:
                raise InputError(f"--shape {part!r}: expected NAME=INTEGER, e.g. --shape M=4096") from None
    return out


def _raise_interrupted(signum: int, _frame: Any) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    disable_multicast()
    spec = _parse_args(argv)
    if resolve_device(spec["device"]) == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module imports triton
    state = RankState(int(os.environ.get("RANK", "0")), os.environ.get(STATUS_DIR_ENV), Fault.parse(spec["inject"]))
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the launcher stopping the run: clean up (a half-written bundle)
        signal.signal(sig, _raise_interrupted)
    state.enter("init")
    _start_watchdog(state, float(spec["timeout_s"]), spec.get("deadline_unix"))
    try:
        result = run_rank(spec, state)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one line naming rank and phase
        if isinstance(exc, TaxmodelError):
            msg, code = str(exc), exc.exit_code
        elif isinstance(exc, KeyboardInterrupt):
            msg, code = "interrupted", getattr(exc, "exit_code", 130)
        else:
            traceback.print_exc()
            msg, code = f"{type(exc).__name__}: {exc}", RunError.exit_code
        write_status(state.status_dir, state.rank, phase=state.phase, variant=state.variant, waiting=state.waiting,
                     error=msg, exit_code=code)
        if isinstance(exc, Interrupted):  # the launcher (or a user) stopped this rank: not a failure of its own
            print(f"taxmodel: rank {state.rank} stopped by {signal.Signals(exc.signum).name} in {state.where()}",
                  file=sys.stderr, flush=True)
        else:
            print(f"taxmodel: error: rank {state.rank} failed in {state.where()}: {msg}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)  # peers may be stuck in a collective: do not wait for a clean teardown
    if state.rank == 0:
        write_result(state.status_dir, result)
    state.enter("done")
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
