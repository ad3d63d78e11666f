"""One rank of a profile run: joining the group, saying where it is, and a watchdog that ends it.

A rank's state (phase, variant, whether it waits for its peers) is what a failure message names,
so every phase change goes to the status file at once (``RankState.enter``), which is also where
``--inject kill_rank/hang_rank`` faults fire. The watchdog thread ends the process when the run
outlives its timeout, after recording where the main thread was stuck: a hung kernel or
collective becomes an error naming the rank, never a hung machine.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from taxmodel.errors import RunError, TaxmodelError
from taxmodel.runtime.inject import Fault
from taxmodel.runtime.spec import ProfileSpec
from taxmodel.runtime.status import report_traceback, terminal, write_status

PHASES = ("init", "setup", "compile", "check", "graph", "capture", "gather", "write", "done")

WATCHDOG_GRACE_S = 1.5
"""After recording its timeout, a rank lingers this long so that its peers record theirs too."""


def rank_failure(exc: BaseException, state: "RankState") -> tuple[str, int]:
    """The one line and exit code a failed rank records: taxmodel's own errors as they say
    themselves, an interrupt as one (128 + the signal), anything else as its type and message,
    with the traceback kept in the rank's log (``report_traceback``). Call it in the handler."""
    if isinstance(exc, TaxmodelError):
        return str(exc), exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", getattr(exc, "exit_code", 130)
    report_traceback(state.status_dir, state.rank, traceback.format_exc())
    return f"{type(exc).__name__}: {exc}", RunError.exit_code


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
        self.progress_open = False  # a progress bar's line on stderr waits for its end

    def end_progress_line(self) -> None:
        """End an open progress bar's line, so that what the launcher prints next starts a line."""
        if self.progress_open:
            self.progress_open = False
            terminal().write("\n")
            terminal().flush()

    def enter(self, phase: str, variant: str | None = None) -> None:
        with self.lock:
            self.phase, self.variant, self.waiting = phase, variant if variant is not None else self.variant, False
        write_status(self.status_dir, self.rank, phase=self.phase, variant=self.variant, waiting=False)
        for fault in self.faults:
            fault.fire(self.rank, phase)

    def where(self) -> str:
        w = f"phase '{self.phase}'"
        return w + (f" of variant '{self.variant}'" if self.variant else "")

    def barrier(self, ctx: Any) -> None:
        """``ctx.barrier()``, marked as waiting for the peers (a hang there is theirs, not ours)."""
        self.waiting = True
        ctx.barrier()
        self.waiting = False


def start_watchdog(state: RankState, timeout_s: float, deadline_unix: float | None = None) -> None:
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
        state.end_progress_line()
        if not state.status_dir:  # else the launcher reads it and prints the run's one diagnosis
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


def join_run(spec: ProfileSpec, state: RankState) -> Any:
    """Join the run's process group and return this rank's ``RankContext`` (no heap yet)."""
    import torch.distributed as dist

    from taxmodel.runtime.bootstrap import join_process_group
    from taxmodel.runtime.context import RankContext

    # Collectives time out after the watchdog, so that the watchdog names the phase first.
    m = join_process_group(spec.device, timeout_s=float(spec.timeout_s) + 60)
    state.rank = m.rank
    ctx = RankContext(rank=m.rank, world_size=m.world_size, local_rank=m.local_rank, device=m.device,
                      backend=m.backend, group=dist.group.WORLD, heap=None, interpret=spec.device == "cpu",
                      spin_timeout_s=float(spec.spin_timeout_s), instrument=bool(spec.instrument))
    if ctx.instrument:
        from taxmodel.runtime.graph import check_mode
        from taxmodel.runtime.records import book_for

        # before any setup copies the context; graph captures need header-reading kernels
        book_for(ctx).append = check_mode(str(spec.graph)) != "off"
    return ctx
