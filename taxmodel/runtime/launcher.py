"""Starting ranks on this host, and turning a crashed, hung or interrupted run into one clear end.

Two ways in:

- ``launch_workers(spec, nproc, timeout_s, device)``: what ``taxmodel profile`` does. Every rank
  is a child of this process, ``python -m taxmodel.runtime.worker --spec spec.json`` with the
  environment ``torchrun`` would give it (RANK, WORLD_SIZE, LOCAL_RANK...), the same worker a
  user starts across nodes with ``torchrun``. Why not torchrun here: its workers are session
  leaders of their own (torch 2.13), so killing the launcher left them running; it waits 30 s
  for a frozen worker before killing it; and it knows, but does not tell us, which rank died of
  what. As their parent, this process knows every rank's PID and how it ended, kills each rank's
  whole process group, and returns only when every rank is gone, within seconds of
  ``timeout_s``, of a failure, or of SIGINT, SIGTERM or SIGHUP (then ``Interrupted``).
- ``run_local_processes(world_size, fn, *args)``: ranks as ``multiprocessing`` children of this
  process with a gloo group and a ``SharedMemoryHeap`` (CPU), for tests and interpreter runs
  of fine-grained kernels.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from taxmodel.errors import Interrupted, RunError
from taxmodel.runtime.diagnose import RankExit, diagnose
from taxmodel.runtime.heap import NO_MULTICAST_ENV
from taxmodel.runtime.bootstrap import RENDEZVOUS_FILE_ENV
from taxmodel.runtime.status import (STATUS_DIR_ENV, TERMINAL_FD_ENV, output_file, read_logs, read_result,
                                     read_statuses)

KILL_GRACE_S = 3.0
"""How long a rank sent SIGTERM may take to clean up (a half-written bundle) before SIGKILL."""
POLL_S = 0.1
SETTLE_S = 0.5
"""After the first rank fails, how long the others get to fail too (so the first is told apart)."""
DEADLINE_GRACE_S = 4.0
"""After the run's deadline, how long the ranks' own watchdogs get to record where they were."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def child_env(device: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of every rank: multicast off; on CPU, Triton's interpreter on."""
    env = dict(os.environ)
    env.update(NO_MULTICAST_ENV)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it: N ranks must not each take every core
    if extra:
        env.update(extra)
    return env


def rank_env(base: Mapping[str, str], rank: int, world_size: int) -> dict[str, str]:
    """What torchrun tells a rank on one host, for a rank this launcher starts."""
    return {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0", "ROLE_RANK": str(rank)}


def python_module_command(module: str) -> list[str]:
    """``python -m MODULE`` as a rank runs it, without the current directory on ``sys.path``.

    ``python -m`` puts the working directory first on ``sys.path``, so a ``numpy.py`` (any
    module's name) lying there would run inside every rank instead of the real module. ``-P``
    (Python 3.11+) leaves it out; on 3.10 the same is done by removing it before anything is
    imported. A user's workload module is found as the profile command found it: by its .py
    path or its name on ``sys.path`` (PYTHONPATH)."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module]
    return [sys.executable, "-c", "import sys; del sys.path[0]; import runpy; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"]


def worker_command(spec_path: str | os.PathLike, wrap: Sequence[str] = ()) -> list[str]:
    """One rank's command line; ``wrap`` runs it under a tool (``["ncu", "--csv", ...]``)."""
    return [*wrap, *python_module_command("taxmodel.runtime.worker"), "--spec", str(spec_path)]


@dataclass
class LaunchResult:
    result: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    output: "RanksRun | None" = None  # the ranks' wall time and kept stderr


@dataclass
class RanksRun:
    """A run of ranks that ended well: its wall time, and the file that keeps what the ranks
    printed on stderr (third-party libraries' lines), None when they printed nothing."""

    wall_s: float
    log: Path | None = None
    lines: int = 0


@contextlib.contextmanager
def signals_raise_interrupted() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise ``Interrupted`` as Ctrl-C raises KeyboardInterrupt,
    so that the launcher's cleanup runs for a CI cancel, ``timeout`` or a preemption too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupted(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    old = {s: signal.signal(s, raise_interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Signals that would stop us wait until the block is done (a second Ctrl-C must not cut the
    killing of the ranks short); they are delivered when it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Ranks:
    """The rank processes of one run: started in their own process groups, watched without reaping
    (a zombie keeps its PID, so a PID is never someone else's while we may still signal it)."""

    def __init__(self, cmd: list[str], env: Mapping[str, str], nproc: int, quiet: bool,
                 log_dir: Path | None = None) -> None:
        """``quiet``: the ranks' stdout and stderr go nowhere. Else, with ``log_dir``, each rank's
        stderr goes to its file there (``status.output_file``: the run's log, what third-party
        libraries print) and the terminal is passed to it as ``status.TERMINAL_FD_ENV``."""
        self.procs: list[subprocess.Popen] = []
        self.exits: dict[int, RankExit] = {}
        self.stopped = False
        term = os.dup(2) if log_dir is not None and not quiet else None
        try:
            for rank in range(nproc):
                renv = rank_env(env, rank, nproc)
                if quiet:
                    out = err = subprocess.DEVNULL
                elif term is not None:
                    out, err = None, open(output_file(log_dir, rank), "ab")
                    renv[TERMINAL_FD_ENV] = str(term)
                else:
                    out = err = None
                try:
                    self.procs.append(subprocess.Popen(cmd, env=renv, start_new_session=True, stdout=out, stderr=err,
                                                       pass_fds=(term,) if term is not None else ()))
                finally:
                    if err not in (None, subprocess.DEVNULL):
                        err.close()  # the rank holds its own copy
        except BaseException:
            self.stop()
            raise
        finally:
            if term is not None:
                os.close(term)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def poll(self) -> None:
        """Record ranks that ended since the last poll (how and when), leaving them unreaped."""
        for rank, proc in enumerate(self.procs):
            if rank in self.exits:
                continue
            try:
                info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # already reaped (by Popen itself)
                code = proc.returncode
                info = None
                if code is None:
                    continue
                self.exits[rank] = RankExit(rank, code=code if code >= 0 else None,
                                            signal=-code if code < 0 else None, seen_at=time.time())
                continue
            if info is None:
                continue
            killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
            self.exits[rank] = RankExit(rank, code=None if killed else info.si_status,
                                        signal=info.si_status if killed else None, seen_at=time.time())

    @property
    def all_ended(self) -> bool:
        return len(self.exits) == len(self.procs)

    @property
    def any_failed(self) -> bool:
        return any(e.failed for e in self.exits.values())

    def stop(self) -> None:
        """End every rank and whatever it started: SIGTERM to each rank's process group (a rank
        cleans up and exits), SIGCONT (a stopped rank must run to act on it), SIGKILL after
        ``KILL_GRACE_S``; then reap them all. Once: a reaped rank's PID may be someone else's."""
        if self.stopped:
            return
        with signals_held():
            live = [p for r, p in enumerate(self.procs) if r not in self.exits]
            for sig in (signal.SIGTERM, signal.SIGCONT):
                for p in live:
                    _signal_group(p.pid, sig)
            deadline = time.monotonic() + KILL_GRACE_S
            while time.monotonic() < deadline and any(_running(p) for p in live):
                time.sleep(0.05)
            for p in self.procs:  # also the groups of ranks that ended: what they started goes too
                _signal_group(p.pid, signal.SIGKILL)
            for p in self.procs:
                p.wait()
            self.stopped = True


def _running(proc: subprocess.Popen) -> bool:
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def launch_workers(spec: Mapping[str, Any], nproc: int, *, timeout_s: float, device: str,
                   quiet: bool = False, started_unix: float | None = None, wrap: Sequence[str] = ()) -> LaunchResult:
    """Run the worker on ``nproc`` local ranks and return rank 0's result.

    The run has ``timeout_s`` seconds from ``started_unix`` (default: now), start-up included
    (pass the moment the command started, so that its checks count too): every rank's watchdog gives up then and
    records where it was, and a rank that cannot (frozen) is killed a few seconds later. Raises
    RunError naming the rank that failed or hung first, its phase and how it ended; Interrupted
    on SIGINT, SIGTERM or SIGHUP. Either way no rank is left running, and the run's temporary
    directory is removed.

    ``wrap`` runs every rank under a tool (a counters pass under ncu: ``[ncu, *options]``); the
    tool and the rank it starts share the rank's process group, so both end with the run.
    """
    with run_directory() as run_dir:
        deadline_unix = (time.time() if started_unix is None else started_unix) + timeout_s
        spec_path = run_dir / "spec.json"
        spec_path.write_text(json.dumps({**spec, "deadline_unix": deadline_unix}, indent=2))
        run = launch_ranks(worker_command(spec_path, wrap), nproc, run_dir=run_dir, device=device,
                           deadline_unix=deadline_unix + DEADLINE_GRACE_S, timeout_s=timeout_s, quiet=quiet,
                           stopped="bundles of variants not finished before were not written")
        return LaunchResult(result=read_result(run_dir / STATUS_SUBDIR), wall_s=run.wall_s, output=run)


STATUS_SUBDIR = "status"
"""Where in the run directory the ranks keep their status files (``status.py``) and logs."""


@contextlib.contextmanager
def run_directory() -> Iterator[Path]:
    """A private directory for one run (the ranks' status files, rendezvous file, spec), removed
    after it however it ended."""
    run_dir = Path(tempfile.mkdtemp(prefix="taxmodel-run-"))
    try:
        (run_dir / STATUS_SUBDIR).mkdir()
        yield run_dir
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def launch_ranks(cmd: Sequence[str], nproc: int, *, run_dir: Path, device: str, deadline_unix: float,
                 timeout_s: float, quiet: bool = False, stopped: str = "") -> RanksRun:
    """Run ``cmd`` as ``nproc`` local ranks (each its own process group, torchrun's environment,
    multicast off, a rendezvous file and a status directory in ``run_dir``) until every rank has
    ended; return the wall time and the run's log. The launcher's part for every command that
    starts ranks (``taxmodel profile``, ``taxmodel calibrate``).

    Raises RunError with one diagnosis (``diagnose``) when a rank failed or ``deadline_unix``
    passed (then every rank is killed within seconds); Interrupted (exit 128 + the signal) on
    SIGINT, SIGTERM or SIGHUP, ``stopped`` saying what that left undone. Either way no rank is
    left running. What the ranks printed on stderr and the tracebacks they logged
    (``status.write_log``) are kept in one file (the run directory goes), which the message or
    the returned ``RanksRun.log`` names."""
    status_dir = run_dir / STATUS_SUBDIR
    status_dir.mkdir(exist_ok=True)
    env = child_env(device, {STATUS_DIR_ENV: str(status_dir), RENDEZVOUS_FILE_ENV: str(run_dir / "rendezvous")})
    t0 = time.monotonic()
    end = run_ranks(list(cmd), env, nproc, deadline=t0 + (deadline_unix - time.time()), quiet=quiet,
                    status_dir=status_dir, stopped=stopped)
    wall = time.monotonic() - t0
    if end.timed_out or any(e.failed for e in end.exits.values()) or len(end.exits) < nproc:
        raise RunError(diagnose(end.statuses, nproc, timed_out=end.timed_out, timeout_s=timeout_s, exits=end.exits)
                       + keep_logs(status_dir))
    output = read_logs(status_dir, ".out")
    log = _keep({}, output)
    return RanksRun(wall, log, sum(len(t.splitlines()) for t in output.values()))


@dataclass
class RanksEnd:
    """How a set of ranks ended: their last status files, the exits seen before the launcher
    stopped the rest, and whether the deadline passed."""

    statuses: dict[int, dict[str, Any]]
    exits: dict[int, RankExit]
    timed_out: bool


def run_ranks(cmd: list[str], env: Mapping[str, str], nproc: int, *, deadline: float, quiet: bool = False,
              status_dir: Path | None = None, stopped: str = "") -> RanksEnd:
    """Start ``nproc`` ranks of ``cmd`` (``Ranks``; their stderr into ``status_dir``), wait until
    every rank ended, one failed (plus ``SETTLE_S``) or the monotonic ``deadline`` passed, then
    stop them all. SIGINT, SIGTERM and SIGHUP stop every rank and raise Interrupted."""
    with signals_raise_interrupted():
        ranks = Ranks(cmd, env, nproc, quiet, log_dir=status_dir)
        try:
            try:
                timed_out = _watch(ranks, deadline)
            except KeyboardInterrupt as exc:  # every rank is stopped (below) before this propagates
                code = getattr(exc, "exit_code", 130)
                raise Interrupted(code - 128, "interrupted: every rank was stopped" + (f"; {stopped}" if stopped else "")
                                  ) from None
            # What the ranks said before they were stopped (a rank stopped by us reports that, too).
            statuses = read_statuses(status_dir) if status_dir is not None else {}
            return RanksEnd(statuses, dict(ranks.exits), timed_out)
        finally:
            ranks.stop()


def ranks_output_note(run: RanksRun) -> str:
    """What a command says of its ranks' kept stderr (``RanksRun.log``)."""
    return f"what the ranks printed on stderr ({run.lines} line(s): libraries' logs, warnings) is in {run.log}"


def keep_logs(status_dir: Path) -> str:
    """The ranks' logged tracebacks and what they printed on stderr, copied into one file that
    outlives the run directory, and the words that name it ("" when there is neither)."""
    logs, output = read_logs(status_dir), read_logs(status_dir, ".out")
    name = _keep(logs, output)
    if name is None:
        return ""
    if logs:
        return f"; the tracebacks of rank(s) {', '.join(map(str, sorted(logs)))} are in {name}"
    return f"; what the ranks printed is in {name}"


def _keep(logs: Mapping[int, str], output: Mapping[int, str]) -> Path | None:
    """One file with each rank's traceback (``== rank R ==``), then what each printed on stderr
    (``== rank R output ==``); None when there is nothing to keep."""
    if not logs and not output:
        return None
    fd, name = tempfile.mkstemp(prefix="taxmodel-ranks-", suffix=".log")
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
        for rank, text in sorted(logs.items()):
            f.write(f"== rank {rank} ==\n{text.rstrip()}\n")
        for rank, text in sorted(output.items()):
            f.write(f"== rank {rank} output ==\n{text.rstrip()}\n")
    return Path(name)


def _watch(ranks: Ranks, deadline: float) -> bool:
    """Wait until every rank ended, one failed (plus ``SETTLE_S``), or ``deadline``; True if the deadline passed."""
    while True:
        ranks.poll()
        if ranks.all_ended:
            return False
        if ranks.any_failed:
            settle = time.monotonic() + SETTLE_S
            while time.monotonic() < settle and not ranks.all_ended:
                time.sleep(POLL_S)
                ranks.poll()
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(POLL_S)


# --- ranks as multiprocessing children (tests, interpreter runs) -------------------------------


def _process_rank(rank: int, world_size: int, init_file: str, heap_bytes: int, fn: Callable[..., Any],
                  args: tuple, queue: Any, env: Mapping[str, str], spin_timeout_s: float) -> None:
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    from taxmodel.runtime.bootstrap import join_process_group
    from taxmodel.runtime.context import RankContext
    from taxmodel.runtime.heap import SharedMemoryHeap

    heap = None
    try:
        join_process_group("cpu", rank=rank, world_size=world_size, init_method=f"file://{init_file}", timeout_s=120)
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
