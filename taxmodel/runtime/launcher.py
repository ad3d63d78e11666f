"""Starting ranks on this host, and turning a crashed or hung rank into one clear error.

Two ways in:

- ``launch_workers(spec, nproc, timeout_s)``: what ``taxmodel profile`` does. Ranks are started
  by PyTorch's own launcher (``python -m torch.distributed.run --standalone ... -m
  taxmodel.runtime.worker --spec spec.json``), the same worker that a user can start across
  nodes with ``torchrun``. Every rank reports its phase to a status directory; when the run
  fails or outlives ``timeout_s``, the status files say which rank failed or hung, and where.
- ``run_local_processes(world_size, fn, *args)``: ranks as ``multiprocessing`` children of this
  process with a gloo group and a ``SharedMemoryHeap`` (CPU), for tests and interpreter runs
  of fine-grained kernels.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from taxmodel.errors import RunError
from taxmodel.runtime.heap import NO_MULTICAST_ENV

STATUS_DIR_ENV = "TAXMODEL_STATUS_DIR"
"""Where each rank writes ``rank<R>.json`` (its phase, or its error) for the launcher to read."""

RESULT_FILE = "result.json"
"""Written by rank 0 into the status directory on success: the bundles written and variants skipped."""

KILL_GRACE_S = 5.0


def child_env(device: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of every rank: multicast off; on CPU, Triton's interpreter on."""
    env = dict(os.environ)
    env.update(NO_MULTICAST_ENV)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")
    if extra:
        env.update(extra)
    return env


# --- status files (written by workers, read by the launcher) ----------------------------------


def write_status(directory: str | os.PathLike | None, rank: int, **fields: Any) -> None:
    """Atomically record this rank's state (phase, variant, waiting, error) for the launcher."""
    if not directory:
        return
    d = Path(directory)
    payload = {"rank": rank, "time": time.time(), **fields}
    tmp = d / f".rank{rank}.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, d / f"rank{rank}.json")


def read_statuses(directory: str | os.PathLike) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for p in Path(directory).glob("rank*.json"):
        try:
            s = json.loads(p.read_text())
            out[int(s["rank"])] = s
        except (ValueError, KeyError, OSError):
            continue
    return out


def diagnose(statuses: Mapping[int, Mapping[str, Any]], world_size: int, *, timed_out: bool,
             timeout_s: float | None = None, returncode: int | None = None) -> str:
    """One message naming the rank(s) that failed or hung, and the phase they were in."""

    def where(s: Mapping[str, Any]) -> str:
        w = f"phase '{s.get('phase', '?')}'"
        if s.get("variant"):
            w += f" of variant '{s['variant']}'"
        return w + (s.get("at") or "")

    missing = [r for r in range(world_size) if r not in statuses]
    errors = {r: s for r, s in statuses.items() if s.get("error") and not s.get("timed_out")}
    if errors:
        # The first rank that failed is the cause; later ones usually failed because of it.
        r = min(errors, key=lambda k: (errors[k].get("time", 0), k))
        s = errors[r]
        others = sorted(set(errors) - {r})
        tail = f" (rank(s) {', '.join(map(str, others))} failed too)" if others else ""
        return f"rank {r} failed in {where(s)}: {s['error']}{tail}"
    unfinished = {r: s for r, s in statuses.items() if s.get("phase") != "done"}
    if timed_out or any(s.get("timed_out") for s in statuses.values()):
        limits = [s["timeout_s"] for s in statuses.values() if s.get("timed_out") and s.get("timeout_s")]
        limit = f" after {min(limits):g} s" if limits else (f" after {timeout_s:g} s" if timeout_s else "")
        busy = sorted(r for r, s in unfinished.items() if not s.get("waiting"))
        waiting = sorted(r for r, s in unfinished.items() if s.get("waiting"))
        if busy:
            msg = "; ".join(f"rank {r} hung in {where(unfinished[r])}" for r in busy)
            if waiting:
                msg += f" (rank(s) {', '.join(map(str, waiting))} were waiting for it)"
        elif waiting:
            msg = f"ranks {', '.join(map(str, waiting))} all waiting in a barrier ({where(unfinished[waiting[0]])})"
        else:
            msg = "no rank reported progress"
        if missing:
            msg += f"; rank(s) {', '.join(map(str, missing))} never started"
        return f"run timed out{limit}: {msg}. Raise --timeout if the run is just slow; otherwise a rank is stuck (a spin-wait or a collective the others never joined)"
    if missing:
        return f"rank(s) {', '.join(map(str, missing))} never reported (crashed at start-up?); launcher exit code {returncode}. See the output above"
    dead = sorted(unfinished)
    if dead:
        return f"rank(s) {', '.join(map(str, dead))} stopped in {where(unfinished[dead[0]])} without an error message (killed? out of memory?); launcher exit code {returncode}"
    return f"ranks exited with code {returncode} after finishing; see the output above"


# --- torch.distributed.run ---------------------------------------------------------------------


@dataclass
class LaunchResult:
    status_dir: Path
    result: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0


def torchrun_command(spec_path: str | os.PathLike, nproc: int, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The local launch: PyTorch's launcher starting ``nproc`` workers on this host."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "--monitor-interval=0.2", *extra_args, "-m", "taxmodel.runtime.worker", "--spec", str(spec_path),
    ]


def launch_workers(spec: Mapping[str, Any], nproc: int, *, timeout_s: float, device: str,
                   workdir: str | os.PathLike | None = None, quiet: bool = False) -> LaunchResult:
    """Run the worker on ``nproc`` local ranks and wait at most ``timeout_s`` seconds.

    Raises RunError naming the rank and phase when a rank fails, or when the run outlives its
    timeout (then every rank is killed).
    """
    tmp = Path(tempfile.mkdtemp(prefix="taxmodel-run-", dir=workdir))
    status_dir = tmp / "status"
    status_dir.mkdir()
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(dict(spec), indent=2))
    env = child_env(device, {STATUS_DIR_ENV: str(status_dir)})
    out = subprocess.DEVNULL if quiet else None
    t0 = time.monotonic()
    proc = subprocess.Popen(torchrun_command(spec_path, nproc), env=env, start_new_session=True,
                            stdout=out, stderr=out)
    timed_out = False
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_session(proc)
        rc = proc.returncode
    except BaseException:
        _kill_session(proc)
        raise
    wall = time.monotonic() - t0
    statuses = read_statuses(status_dir)
    if timed_out or rc != 0:
        raise RunError(diagnose(statuses, nproc, timed_out=timed_out, timeout_s=timeout_s, returncode=rc))
    result_path = status_dir / RESULT_FILE
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    return LaunchResult(status_dir=status_dir, result=result, wall_s=wall)


def _kill_session(proc: subprocess.Popen) -> None:
    """End the launcher we started and every rank it started (they share its session)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


# --- ranks as multiprocessing children (tests, interpreter runs) -------------------------------


def _process_rank(rank: int, world_size: int, init_file: str, heap_bytes: int, fn: Callable[..., Any],
                  args: tuple, queue: Any, env: Mapping[str, str], spin_timeout_s: float) -> None:
    os.environ.update(env)
    import datetime

    import torch
    import torch.distributed as dist

    from taxmodel.runtime.context import RankContext
    from taxmodel.runtime.heap import SharedMemoryHeap

    heap = None
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
        heap = SharedMemoryHeap(rank, world_size, heap_bytes, None) if heap_bytes else None
        ctx = RankContext(rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"),
                          backend="gloo", group=None, heap=heap, interpret=env.get("TRITON_INTERPRET") == "1",
                          spin_timeout_s=spin_timeout_s)
        queue.put((rank, True, fn(ctx, *args)))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent with the rank
        queue.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if heap is not None:
            heap.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def run_local_processes(world_size: int, fn: Callable[..., Any], *args: Any, heap_bytes: int = 1 << 20,
                        timeout_s: float = 120.0, interpret: bool = True, spin_timeout_s: float = 30.0) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``world_size`` CPU ranks (processes, gloo, SharedMemoryHeap).

    ``fn`` must be importable by name (a module-level function): children are spawned. Returns
    the results in rank order; raises RunError naming the first failing rank, or the ranks still
    running after ``timeout_s``.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    env = dict(NO_MULTICAST_ENV)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    with tempfile.TemporaryDirectory(prefix="taxmodel-ranks-") as tmp:
        init_file = str(Path(tmp) / "rendezvous")
        old_interp = os.environ.get("TRITON_INTERPRET")
        if interpret:  # spawned children read it before importing triton
            os.environ["TRITON_INTERPRET"] = "1"
        try:
            procs = [ctx.Process(target=_process_rank, name=f"rank{r}",
                                 args=(r, world_size, init_file, heap_bytes, fn, args, queue, env, spin_timeout_s))
                     for r in range(world_size)]
            for p in procs:
                p.start()
        finally:
            if interpret:
                if old_interp is None:
                    os.environ.pop("TRITON_INTERPRET", None)
                else:
                    os.environ["TRITON_INTERPRET"] = old_interp
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        failure: tuple[int, str] | None = None
        try:
            while len(results) < world_size and failure is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    rank, ok, value = queue.get(timeout=min(left, 0.5))
                except Exception:  # queue.Empty: check for children that died silently
                    dead = [r for r, p in enumerate(procs) if r not in results and p.exitcode not in (None, 0)]
                    if dead:
                        failure = (dead[0], f"exited with code {procs[dead[0]].exitcode} without reporting")
                    continue
                if ok:
                    results[rank] = value
                else:
                    failure = (rank, value)
        finally:
            for p in procs:
                p.join(timeout=0 if failure or len(results) < world_size else 10)
                if p.is_alive():
                    p.terminate()
                    p.join(KILL_GRACE_S)
                    if p.is_alive():
                        p.kill()
        if failure is not None:
            rank, msg = failure
            raise RunError(f"rank {rank}: {msg.strip().splitlines()[0]}\n{msg}")
        if len(results) < world_size:
            hung = sorted(set(range(world_size)) - set(results))
            raise RunError(f"rank(s) {hung} still running after {timeout_s:g} s (a spin-wait that never ends?)")
        return [results[r] for r in range(world_size)]
