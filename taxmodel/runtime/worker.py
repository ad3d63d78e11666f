"""One rank of ``taxmodel profile``: the per-rank entry point.

    python -m taxmodel.runtime.worker --spec spec.json      # what `taxmodel profile` starts, one per rank
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m taxmodel.runtime.worker --workload ag_gemm --preset small -o runs/

The settings are a ``ProfileSpec`` (``taxmodel.runtime.spec``): a JSON file written and checked
by ``taxmodel profile``, or this command's options (generated from the spec's fields), checked
here when no host checked them (a torchrun launch).

For every variant, on every rank: set up inputs, warm up (compiles every kernel before any
rank waits on another), check the output against the workload's reference, then record
``iterations`` barrier-separated iterations per repetition with the tracer
(``session.VariantSession``). Rank 0 gathers every rank's raw traces through torch.distributed
(no shared filesystem assumed), imports them and writes one bundle per variant atomically.

Failures: an exception on any rank is reported as ``rank R failed in phase P`` (started by
``taxmodel profile``: in the rank's status file, its traceback in its log, and the launcher prints
the run's one diagnosis; started by torchrun: on stderr); a watchdog ends
a rank that outlives the run's timeout (``rank.start_watchdog``), so a hung kernel or collective
becomes an error, never a hung machine. Exit code 3 (RunError) in both cases; SIGTERM or SIGHUP
(the launcher stopping the run) end the rank with 128 + the signal, after its cleanup.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from taxmodel.errors import Interrupted
from taxmodel.runtime.heap import disable_multicast
from taxmodel.runtime.inject import Fault
from taxmodel.runtime.rank import PHASES, RankState, join_run, start_watchdog, rank_failure
from taxmodel.runtime.session import check_output  # noqa: F401 - part of this module's interface
from taxmodel.runtime.spec import ProfileSpec, parse_shape, resolve_device, shape_tag  # noqa: F401 - as above
from taxmodel.runtime.status import STATUS_DIR_ENV, write_result, write_status

__all__ = ["PHASES", "main", "run_rank", "check_output", "parse_shape", "resolve_device", "shape_tag"]


def run_rank(spec: ProfileSpec, state: RankState) -> dict[str, Any]:
    """Profile every requested variant on this rank; rank 0 returns what it wrote."""
    import torch.distributed as dist

    from taxmodel.runtime.graph import check_mode, get_backend
    from taxmodel.runtime.heap import make_heap
    from taxmodel.runtime.inject import Injection
    from taxmodel.runtime.session import Progress, Run, profile_variants
    from taxmodel.runtime.environment import measure_clock_offsets
    from taxmodel.runtime.spec import import_workload_modules
    from taxmodel.trace.capture import get_tracer
    from taxmodel.trace.capture_meta import GATED_ALIGNMENTS
    from taxmodel.workload import get_workload

    ctx = join_run(spec, state)
    import_workload_modules(list(spec.workload_modules))
    workload = get_workload(spec.workload)
    # Several presets (comma-separated) run in one process group: one start-up, one heap.
    presets = str(spec.preset).split(",")
    shapes = {preset: workload.shape(preset, **dict(spec.shape)) for preset in presets}
    variants = workload.variants()
    wanted = list(spec.variants or variants)
    state.enter("setup")
    reasons: list[Any] = [None] * ctx.world_size
    mine = {v: variants[v].available(ctx) for v in wanted}
    dist.all_gather_object(reasons, mine)
    skipped = {v: next(f"rank {r}: {rs[v]}" for r, rs in enumerate(reasons) if rs[v]) for v in wanted
               if any(rs[v] for rs in reasons)}
    chosen = [v for v in wanted if v not in skipped]
    if spec.align in GATED_ALIGNMENTS or any(variants[v].needs_heap for v in chosen):
        heap_bytes = int(spec.heap_bytes or (4 << 30 if spec.device == "cuda" else 256 << 20))
        ctx.heap = make_heap(ctx, heap_bytes)
    clock = measure_clock_offsets(ctx.rank, ctx.world_size, ctx.device)
    progress = Progress(bool(spec.progress) and ctx.rank == 0, total=len(chosen) * 4 * len(presets),
                        announce=ctx.rank == 0 and not state.status_dir)  # else `taxmodel profile` says it once
    state.progress_open = progress.bar is not None
    for v, why in skipped.items():
        progress.write(f"skipped {workload.name}/{v}: {why}")
    run = Run(spec=spec, state=state, ctx=ctx, workload=workload, variants=variants,
              injection=Injection.parse(spec.inject), tracer_cls=get_tracer(spec.tracer), clock=clock,
              progress=progress, graph_backend=get_backend(str(spec.graph_backend), ctx.device),
              graph_mode=check_mode(str(spec.graph)))
    written = profile_variants(run, chosen, shapes)
    progress.close()
    state.progress_open = False
    if ctx.heap is not None:
        ctx.heap.close()
    return {"bundles": written, "skipped": skipped, "workload": workload.name, "shapes": shapes,
            "world_size": ctx.world_size, "graph_fallbacks": run.fallbacks}


# --- entry point -------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> tuple[ProfileSpec, bool]:
    """(the spec, whether a host already checked it: given as --spec by `taxmodel profile`)."""
    p = argparse.ArgumentParser(prog="python -m taxmodel.runtime.worker",
                                description="One rank of `taxmodel profile` (start it with torchrun).")
    p.add_argument("--spec", help="JSON file with the run's settings (written by `taxmodel profile`)")
    ProfileSpec.add_arguments(p)
    a = p.parse_args(argv)
    given = ProfileSpec.from_dict(json.loads(Path(a.spec).read_text())) if a.spec else ProfileSpec()
    spec = given.with_arguments(a)
    if not spec.workload:
        p.error("give --spec or --workload")
    return spec, bool(a.spec) and spec == given


def _check_here(spec: ProfileSpec) -> ProfileSpec:
    """What ``taxmodel profile`` checks on its host, for a rank started without it (torchrun)."""
    from taxmodel.runtime.profile import resolve_spec

    world = int(os.environ.get("WORLD_SIZE", "1"))
    return resolve_spec(dataclasses.replace(spec, device=resolve_device(spec.device), world_size=world))


def _raise_interrupted(signum: int, _frame: Any) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    disable_multicast()
    spec, checked = _parse_args(argv)
    if resolve_device(spec.device) == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module imports triton
    state = RankState(int(os.environ.get("RANK", "0")), os.environ.get(STATUS_DIR_ENV), Fault.parse(spec.inject))
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the launcher stopping the run: clean up (a half-written bundle)
        signal.signal(sig, _raise_interrupted)
    state.enter("init")
    start_watchdog(state, float(spec.timeout_s), spec.deadline_unix)
    try:
        if not checked:
            spec = _check_here(spec)
        result = run_rank(spec, state)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one line naming rank and phase
        msg, code = rank_failure(exc, state)
        _record_failure(state, msg, code)
        state.end_progress_line()
        if not state.status_dir:  # else our launcher reads the status file and prints the run's one diagnosis
            _say_failure(state, exc, msg)
        sys.stdout.flush()
        os._exit(code)  # peers may be stuck in a collective: do not wait for a clean teardown
    if state.rank == 0:
        write_result(state.status_dir, result)
    state.enter("done")
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    # The run is complete and its files written: leave without the interpreter's and the C++
    # libraries' teardown, where a rank once aborted after a successful run ("terminate called
    # without an active exception", exit -6 under torchrun on a loaded 2-core machine) and turned
    # it into a failure.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _say_failure(state: RankState, exc: BaseException, msg: str) -> None:
    """The failure on stderr, for a rank that no launcher of ours watches (torchrun)."""
    if isinstance(exc, Interrupted):  # a user stopped this rank: not a failure of its own
        print(f"taxmodel: rank {state.rank} stopped by {signal.Signals(exc.signum).name} in {state.where()}",
              file=sys.stderr, flush=True)
    else:
        print(f"taxmodel: error: rank {state.rank} failed in {state.where()}: {msg}", file=sys.stderr, flush=True)


def _record_failure(state: RankState, error: str, exit_code: int) -> None:
    write_status(state.status_dir, state.rank, phase=state.phase, variant=state.variant, waiting=state.waiting,
                 error=error, exit_code=exit_code)


if __name__ == "__main__":
    sys.exit(main())
