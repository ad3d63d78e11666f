"""``taxmodel profile --counters -- COMMAND``'s second pass: the command under Nsight Compute, and
its counters attached to the timed run's bundle.

The pass runs the command once more with the step hook in ``counters`` mode: the first traced
step runs between ``cudaProfilerStart`` and ``cudaProfilerStop``, and ncu
(``--profile-from-start off``) replays and counts only that step's kernels; the program's other
steps run at speed, and the timed bundle was written before ncu ever started. The counters are
attached as ``taxmodel import --counters`` attaches them (``trace.counter_match``: order,
function names and launch dims must agree; one step's counters stand for every traced step with
the same kernels), so a program whose kernels differ between the two runs is refused in one line
and the bundle stays as the timed run wrote it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from taxmodel.runtime.counters import NCU_OPTIONS, rewrite_bundle


def ncu_command(ncu: str, command: Sequence[str], csv: Path) -> list[str]:
    """``command`` under ncu: every process it starts (``--target-processes all``), counting only
    inside cudaProfilerStart/Stop, no cache flush or clock lock (``counters.NCU_OPTIONS``), the
    CSV in ``csv`` (the program's own output stays on the terminal)."""
    from taxmodel.trace.ncu import METRICS_ARG

    return [ncu, *NCU_OPTIONS, "--metrics", METRICS_ARG, "--log-file", str(csv), *command]


def attach_pass_counters(bundle: Path, csv: Path, *, command: Sequence[str], step: int, pass_s: float) -> str:
    """Attach the counters of ``csv`` to the bundle at ``bundle`` (rewritten atomically, raw traces
    kept); returns what was attached, in words. InputError, bundle untouched, when they do not match."""
    from taxmodel.trace.bundle import load_bundle
    from taxmodel.trace.counter_match import attach_counters_file
    from taxmodel.trace.ncu import METRICS_ARG

    b = load_bundle(bundle)
    events, meta = attach_counters_file(b.events, b.meta, csv)
    counters = meta["counters"]
    counters.update({"pass": "taxmodel profile --counters -- COMMAND", "command": list(command), "counted_step": step,
                     "metrics": METRICS_ARG.split(","), "cache_control": "none", "clock_control": "none",
                     "pass_wall_s": round(pass_s, 1)})
    rewrite_bundle(bundle, events, meta)
    return (f"DRAM counters of {counters['kernels_with_counters']} kernel(s) attached to {bundle} "
            f"(ncu counted step {step}: {counters['counter_rows']} kernels; match {counters['match']})")
