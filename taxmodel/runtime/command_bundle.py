"""What a command's ranks captured, said in one line per problem, and written as the bundle.

The step hook (``command_hook.py``) leaves one status file per process that reached a step and
one trace per rank in the run's capture directory. Here they become an ``Assessment``: which
ranks' traces are usable, which steps every one of them completed, and a line for each thing
that went wrong (no step reached, a rank that never wrote its trace, one that ended half-way).
``write_capture_bundle`` then imports the usable traces as ``taxmodel import`` would (the same
checks and bundle), keeping only the steps every rank completed.

CPU runs (no CUDA in any rank) become CPU-emulated bundles as the built-in workloads' CPU runs do
(``trace.capture.emulated_gpu_rows``): ``record_function("kernel::NAME")`` ranges are the
kernels, gloo's collectives the communication; times say nothing about GPUs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from taxmodel.runtime.command_hook import ERRORS_DIR, PROCS_DIR, STATUS_DIR, TRACE_DIR, Plan
from taxmodel.runtime.command_job import JobEnd
from taxmodel.runtime.environment import emulated_hardware

FINAL_STATES = {"trace": ("written",), "counters": ("counted",)}
"""The state a rank's status reaches when it has done what the plan asked."""


@dataclass
class Capture:
    """The capture directory as the job left it."""

    statuses: list[dict[str, Any]]  # one per process that reached a step
    traces: dict[str, Path]  # file name -> path
    torch_processes: int  # processes that imported torch under the hook
    hook_errors: list[str]  # the last line of each hook failure

    @classmethod
    def read(cls, directory: Path) -> "Capture":
        statuses = []
        for f in sorted((directory / STATUS_DIR).glob("*.json")):
            try:
                statuses.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                continue
        traces = {f.name: f for f in sorted((directory / TRACE_DIR).glob("rank*.json.gz"))}
        errors = []
        for f in sorted((directory / ERRORS_DIR).glob("*.txt")):
            lines = [ln for ln in f.read_text(errors="replace").splitlines() if ln.strip()]
            if lines:
                errors.append(lines[-1].strip())
        return cls(statuses, traces, len(list((directory / PROCS_DIR).glob("*.json"))), errors)


def done(directory: Path, plan: Plan) -> bool:
    """Every rank of the job (as many as its ranks say it has) has done what ``plan`` asked."""
    statuses = Capture.read(directory).statuses
    if not statuses:
        return False
    world = max(int(s.get("world_size") or 1) for s in statuses)
    finished = {int(s["rank"]) for s in statuses if s.get("state") in FINAL_STATES[plan.mode]}
    return finished >= set(range(world))


@dataclass
class Assessment:
    """Which traces make the bundle, which steps it keeps, and what to tell the user."""

    world: int = 0
    traces: dict[int, Path] = field(default_factory=dict)  # rank -> its usable trace
    keep_steps: int = 0  # traced steps every usable rank completed
    lines: list[str] = field(default_factory=list)  # one per problem
    complete: bool = False  # every rank wrote every traced step
    device: str = "cpu"  # cuda when any usable rank ran CUDA

    @property
    def missing(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.traces]


def steps_text(first: int, count: int) -> str:
    return f"step {first}" if count == 1 else f"steps {first}-{first + count - 1}"


def _ended(end: JobEnd) -> str:
    if end.stopped in ("timeout", "interrupted"):
        return "was stopped at --timeout" if end.stopped == "timeout" else "was interrupted"
    return f"ended (exit status {end.code})"


def assess(capture: Capture, plan: Plan, end: JobEnd) -> Assessment:
    """What ``capture`` holds for ``plan``, with one line per problem (ranks by number)."""
    a = Assessment()
    wanted = f"{steps_text(plan.first, plan.steps)} (--skip {plan.skip} --steps {plan.steps})"
    for err in sorted(set(capture.hook_errors)):
        a.lines.append(f"taxmodel's step hook failed in a process of the command: {err}")
    if not capture.statuses:
        if capture.torch_processes == 0 and not capture.hook_errors:
            a.lines.append(f"the command {_ended(end)} and no Python process of it imported torch under taxmodel's "
                           "hook (a Python run with -I, -E or -S, or a launcher that clears PYTHONPATH, runs without "
                           "it); nothing was written")
        else:
            a.lines.append(f"the command {_ended(end)} before its first step: no process called {plan.step_name}()"
                           + (" (is MODULE the name the program imports it by?)" if plan.step_fn else
                              " (for another loop, name its step function with --step-fn MODULE:QUALNAME)")
                           + "; nothing was written")
        return a
    a.world = max(int(s.get("world_size") or 1) for s in capture.statuses)
    by_rank: dict[int, list[dict]] = {}
    for s in capture.statuses:
        by_rank.setdefault(int(s["rank"]), []).append(s)
    usable: dict[int, tuple[Path, int]] = {}
    early: dict[int, int] = {}  # rank -> steps it ran, for ranks that ended before the traced steps
    for rank, group in sorted(by_rank.items()):
        with_trace = [s for s in group if s.get("trace") and s["trace"] in capture.traces]
        if len(with_trace) > 1:
            pids = ", ".join(str(s["pid"]) for s in with_trace)
            a.lines.append(f"processes {pids} each traced steps as rank {rank} (each Python process that calls "
                           f"{plan.step_name}() is a rank): only the first is kept")
        s = with_trace[0] if with_trace else max(group, key=lambda x: int(x.get("calls") or 0))
        done_steps = int(s.get("complete_steps") or 0)
        if with_trace and done_steps >= 1:
            usable[rank] = (capture.traces[s["trace"]], done_steps)
            if done_steps < plan.steps:
                a.lines.append(f"rank {rank} ended during step {plan.first + done_steps}: its trace holds "
                               f"{done_steps} of the {plan.steps} traced steps")
        elif s.get("state") == "failed":
            when = f"after step {s['calls']}" if s.get("calls") else "before the first step"
            a.lines.append(f"taxmodel's step hook failed in rank {rank} (pid {s.get('pid')}) {when}: {s.get('error')}")
        elif with_trace:
            a.lines.append(f"rank {rank} ended during its first traced step (step {plan.first}): no traced step of it "
                           "is complete")
        elif s.get("state") == "tracing":
            a.lines.append(f"rank {rank} never wrote its trace: it ended while tracing {wanted} (killed, or crashed "
                           "outside Python)")
        else:
            early[rank] = int(s.get("calls") or 0)
    if not usable:
        ran = sorted(set(early.values()))
        did = (f"after {ran[0]} step(s)" if len(ran) == 1 else f"after {ran[0]}-{ran[-1]} steps") if ran else ""
        a.lines.append(f"the command {_ended(end)} {did + ', ' if did else ''}before any rank completed a traced step "
                       f"of {wanted}: nothing was written" + ("; lower --skip, or let the program run more steps"
                                                             if early else ""))
        return a
    for rank, calls in early.items():
        a.lines.append(f"rank {rank} ended after {calls} step(s), before the traced {wanted}")
    for rank in range(a.world):
        if rank not in by_rank:
            a.lines.append(f"rank {rank} never reached a step (no call of {plan.step_name}() in its process)")
    a.traces = {r: p for r, (p, _) in usable.items()}
    a.keep_steps = min(n for _, n in usable.values())
    a.complete = a.keep_steps == plan.steps and not a.missing
    a.device = "cuda" if any(s.get("device") == "cuda" for r in usable for s in by_rank[r]) else "cpu"
    if a.missing:
        a.lines.append(f"the bundle holds rank(s) {', '.join(map(str, sorted(usable)))} of {a.world}")
    if a.keep_steps < max(n for _, n in usable.values()):
        a.lines.append(f"the bundle keeps {steps_text(plan.first, a.keep_steps)}, the ones every rank in it completed")
    return a


# --- the bundle -----------------------------------------------------------------------------------


EMULATED_NOTE = ("CPU capture: kernel rows are the job's record_function('kernel::NAME') ranges, collectives gloo's; "
                 "times say nothing about GPUs")


def _read(paths: Sequence[Path], fmt: str, iteration_pattern: str | None, *, allow_missing_ranks: bool,
          world_size: int | None, shapes_from: Sequence[Path], emulated: bool) -> tuple[pd.DataFrame, dict, str]:
    """``importers.import_traces``, with the CPU runs' host ranges made kernel rows first."""
    from taxmodel.trace import importers

    if not emulated:
        return importers.import_traces(paths, fmt, iteration_pattern, allow_missing_ranks=allow_missing_ranks,
                                       world_size=world_size, shapes_from=shapes_from)
    from taxmodel.trace.capture import emulated_gpu_rows

    paths = [Path(p) for p in paths]
    events, meta = importers.read_with(importers.importer_for(fmt), paths, iteration_pattern)
    return importers.finish_import(emulated_gpu_rows(events), meta, fmt, paths, allow_missing_ranks=allow_missing_ranks,
                                   world_size=world_size, shapes_from=shapes_from)


def keep_first_steps(events: pd.DataFrame, steps: int) -> pd.DataFrame:
    """Each rank's first ``steps`` iterations kept; rows of later ones moved outside every step
    (iteration -1): a rank that ended half-way leaves a last step that is not whole."""
    it = events["iteration"].to_numpy()
    keep = np.ones(len(events), dtype=bool)
    for rank in events["rank"].unique():
        mine = (events["rank"] == rank).to_numpy() & (it >= 0)
        numbers = np.unique(it[mine])
        if len(numbers) > steps:
            keep &= ~(mine & (it > numbers[steps - 1]))
    if keep.all():
        return events
    events = events.copy()
    events.loc[~keep, "iteration"] = -1
    return events


def write_capture_bundle(a: Assessment, plan: Plan, out: Path, *, force: bool, command: Sequence[str],
                         stopped: bool) -> tuple[Any, str]:
    """Import the usable traces of ``a`` and write the bundle at ``out`` as ``taxmodel import -o``
    does; returns (Bundle, format)."""
    from taxmodel.trace import importers

    emulated = a.device != "cuda"

    def read(paths, fmt, iteration_pattern, *, allow_missing_ranks, world_size, shapes_from):
        events, meta, fmt = _read(paths, fmt, iteration_pattern, allow_missing_ranks=allow_missing_ranks,
                                  world_size=world_size, shapes_from=shapes_from, emulated=emulated)
        events = keep_first_steps(events, a.keep_steps)
        capture = dict(meta.get("capture") or {})
        capture.update({
            "command": list(command), "step": plan.step_name, "skip": plan.skip, "steps": plan.steps,
            "first_step": plan.first, "iterations": a.keep_steps, "traced_warmup": plan.warmup,
            "emulated_gpu": emulated, "stopped_after_capture": stopped, "via": "taxmodel profile -- COMMAND"})
        meta["capture"] = capture
        meta["notes"] = list(meta.get("notes") or []) + [f"taxmodel profile: {line}" for line in a.lines]
        if emulated:
            meta["notes"].append(EMULATED_NOTE)
            meta["hardware"] = meta.get("hardware") or emulated_hardware()
        return events, meta, fmt

    paths = [a.traces[r] for r in sorted(a.traces)]
    return importers.import_bundle(paths, out, "kineto", keep_raw=True, allow_missing_ranks=bool(a.missing),
                                   force=force, world_size=a.world, read=read)
