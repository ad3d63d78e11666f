"""``taxmodel profile --counters``: per-kernel DRAM bytes from a second pass under Nsight Compute.

Why a second pass: ncu replays every kernel several times to read its counters and serializes
the GPU, so a step under ncu takes seconds and its timing means nothing. The timed pass runs
as always (never under ncu); then the same request runs once more, every variant at every
preset, with ``counters_pass`` in the worker's spec: warm-up, check and graph capture as in
the timed pass, then exactly one step between ``cudaProfilerStart``/``Stop`` under
``ncu --profile-from-start off``, nothing traced and no bundle written. The one step's
counters are then matched to each timed bundle's steps (``trace.counter_match``, mode
``per_step``: order, function names and launch dims must agree, or nothing is attached) and
the bundles are rewritten with ``dram_read_bytes``, ``dram_write_bytes``, ``l2_hit_pct_x100``
and ``meta["counters"]``.

ncu runs with ``--cache-control none`` (no L2 flush before each kernel: the point is what the
L2 absorbs between kernels) and ``--clock-control none`` (the card's clocks as found).
One rank only: ncu's kernel replay serializes a process's kernels, so a collective waiting
for peers under replay would hang.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from taxmodel.errors import InputError, RunError

NCU_ENV = "TAXMODEL_NCU"
"""Path of the ncu executable, when it is not on PATH nor in /usr/local/cuda/bin."""

NCU_OPTIONS = ("--csv", "--print-units", "base", "--cache-control", "none", "--clock-control", "none",
               "--profile-from-start", "off", "--target-processes", "all")


@dataclass
class CountersOutcome:
    bundles: list[Path]
    kernels: int  # kernel rows given counters, over all bundles
    wall_s: float  # the whole counters pass: start-up, warm-up, ncu's replays, matching, rewriting
    csv: Path | None = None


def find_ncu() -> str:
    """The ncu executable; InputError saying how to get one."""
    for cand in (os.environ.get(NCU_ENV), shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return str(cand)
    raise InputError(f"--counters needs Nsight Compute's ncu: put it on PATH or set {NCU_ENV} to its path")


def check_request(device: str, world: int) -> None:
    """Refuse what the counters pass cannot do, before the timed pass starts."""
    if device != "cuda":
        raise InputError("--counters reads GPU hardware counters with ncu: it needs --device cuda (not a CPU run)")
    if world != 1:
        raise InputError(f"--counters runs under ncu, whose kernel replay serializes each rank's kernels (collectives "
                         f"would wait for peers forever): use -n 1, not {world} ranks")
    find_ncu()


def check_profile_request(req: Any) -> None:
    """``check_request`` for a ProfileRequest (device resolved, world size defaulted as profile does)."""
    if req.device == "cpu":  # before the imports below (they load every workload's kernels)
        check_request("cpu", 1)
    from taxmodel.runtime.profile import default_world_size
    from taxmodel.runtime.spec import resolve_device

    device = resolve_device(req.device)
    check_request(device, int(req.world_size or (default_world_size(device) if device == "cuda" else 2)))


def counted_step(barrier: Callable[[], None], gate: Any, runner: Callable[[], None]) -> None:
    """Run one step of the worker's runner between cudaProfilerStart/Stop (the worker's hook)."""
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()  # a CPU run (tests) has no range to mark
    barrier()
    if gate is not None:
        gate()  # outside the counted range, as outside the traced step
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    try:
        runner()
        if cuda:
            torch.cuda.synchronize()
    finally:
        if cuda:
            torch.cuda.profiler.stop()
    barrier()


def counters_pass(req: Any, bundles: list[Path], *, timeout_s: float = 900.0, keep_csv: Path | None = None,
                  quiet: bool = False) -> CountersOutcome:
    """Run ``req`` (a ProfileRequest) once more under ncu and attach its counters to ``bundles``
    (the timed pass's, in the order it wrote them)."""
    from taxmodel.runtime.launcher import child_env, worker_command
    from taxmodel.runtime.profile import build_spec

    t0 = time.monotonic()
    ncu = find_ncu()
    with tempfile.TemporaryDirectory(prefix="taxmodel-counters-") as tmp:
        spec, world, device = build_spec(replace(req, iterations=1, repeat=1, out=str(Path(tmp) / "unused")))
        check_request(device, world)
        spec.update({"counters_pass": True, "progress": False, "deadline_unix": time.time() + timeout_s})
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        csv = Path(tmp) / "counters.csv"
        cmd = worker_command(spec_path, wrap=[ncu, *NCU_OPTIONS, "--metrics", _metrics(), "--log-file", str(csv)])
        env = child_env(device, {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"})
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise RunError(f"--counters: the pass under ncu did not finish in {timeout_s:.0f} s; the bundles "
                           "keep no counters") from exc
        if proc.returncode != 0 or not csv.is_file():
            tail = " | ".join(ln for ln in (proc.stderr or "").strip().splitlines()[-3:])
            raise RunError(f"--counters: the pass under ncu failed (exit {proc.returncode}): {tail[:300]}; "
                           "the bundles keep no counters")
        if keep_csv is not None:
            shutil.copyfile(csv, keep_csv)
        kernels = attach_to_bundles(csv, bundles, pass_s=time.monotonic() - t0)
    return CountersOutcome(bundles=list(bundles), kernels=kernels, wall_s=time.monotonic() - t0, csv=keep_csv)


def _metrics() -> str:
    from taxmodel.trace.ncu import METRICS_ARG

    return METRICS_ARG


def attach_to_bundles(csv: Path, bundles: list[Path], *, pass_s: float | None = None) -> int:
    """Split the counters of one step per bundle (in order) and rewrite each bundle with them.

    Every bundle is matched before any is rewritten: a mismatch anywhere leaves them all as
    they were (InputError naming the bundle and the first differing kernel)."""
    from taxmodel.trace.bundle import load_bundle
    from taxmodel.trace.counter_match import attach_counters
    from taxmodel.trace.ncu import read_counters

    counters = read_counters(csv)
    pos, done = 0, []
    for path in bundles:
        bundle = load_bundle(path)
        kern = bundle.events[(bundle.events["kind"] == "kernel") & (bundle.events["iteration"] >= 0)]
        first = kern[(kern["repetition"] == kern["repetition"].min()) & (kern["iteration"] == kern["iteration"].min())]
        n = len(first)
        chunk = counters.iloc[pos:pos + n]
        if n == 0 or len(chunk) < n:
            raise InputError(f"{path}: the counters pass profiled {len(counters)} kernels in all, too few for this "
                             f"bundle's {n} kernels per step after {pos} for the bundles before it; nothing attached")
        events, report = attach_counters(bundle.events, chunk, source=str(path))
        done.append((path, bundle, events, report))
        pos += n
    if pos != len(counters):
        extra = counters.iloc[pos]["name"]
        raise InputError(f"the counters pass profiled {len(counters) - pos} kernels more than the bundles' steps hold "
                         f"(next: {extra[:80]!r}); nothing attached")
    for path, bundle, events, report in done:
        meta = dict(bundle.meta)
        meta["counters"] = {"source": "ncu", "pass": "taxmodel profile --counters", "match": report.mode,
                            "kernels_with_counters": report.kernels, "kernels_per_step": report.counter_rows,
                            "metrics": _metrics().split(","), "cache_control": "none", "clock_control": "none",
                            "pass_wall_s": round(pass_s, 1) if pass_s is not None else None}
        rewrite_bundle(path, events, meta)
    return sum(r.kernels for *_, r in done)


def rewrite_bundle(path: Path, events: Any, meta: dict[str, Any]) -> None:
    """Write ``events``/``meta`` over the bundle at ``path``, keeping its raw traces (atomic)."""
    from taxmodel.trace.bundle import RAW_DIR, write_bundle

    raw_dir = Path(path) / RAW_DIR
    with tempfile.TemporaryDirectory(prefix="taxmodel-raw-") as keep:
        raw = []
        if raw_dir.is_dir():
            for f in sorted(raw_dir.iterdir()):
                if f.is_file():
                    shutil.copy2(f, Path(keep) / f.name)
                    raw.append(Path(keep) / f.name)
        write_bundle(path, events, meta, raw_files=raw, overwrite=True)
